"""The contract between the host and a subagent container (shipped in the image; the host imports it).

A container has two mounts: its chat's workspace (read-write, never read by the host) and its run
channel (read-only: one Unix socket the host listens on). Everything else travels over that channel as
bounded, typed requests: the task and the prior session come in (`GET /run/task`), progress messages,
the session and the result go out, and LLM calls go to the provider's own paths, which the host's
proxy serves. The socket is the run's identity: nothing a container sends names its run or chat.

The channel is transport-neutral: a remote runtime can serve the same paths over TCP with a per-run
token. Spawn requests (`SpawnRequest`) are the main agent's, written by the host into its IPC folder,
which no container can reach, so a subagent cannot start subagents.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CHANNEL_DIR = "/crewbot/channel"
CHANNEL_SOCKET_FILE = "run.sock"
WORKSPACE_DIR = "/workspace"
IPC_TASKS_DIR = "tasks"

# The run API on the channel; LLM calls use the provider's paths (/v1/chat/completions, /v1/messages).
TASK_PATH = "/run/task"
MESSAGE_PATH = "/run/message"
SESSION_PATH = "/run/session"
RESULT_PATH = "/run/result"
RUN_API_PREFIX = "/run/"

ID_PATTERN = r"^[A-Za-z0-9_-]{6,64}$"
MAX_TASK_CHARS = 100_000
MAX_LABEL_CHARS = 200
MAX_PROGRESS_CHARS = 4_000  # one progress message: about one Telegram message
MAX_RESULT_CHARS = 100_000  # on the wire; the host keeps less (runner.outcome)
MAX_ERROR_CHARS = 4_000
MAX_SESSION_BYTES = 4 * 1024 * 1024  # a session upload; the host trims what it keeps
MAX_RUN_BODY_BYTES = 512 * 1024  # a message or a result, JSON-encoded


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpawnRequest(_Strict):
    """data/ipc/<chat>/tasks/<request_id>.json, written by the host's spawner. The chat is the folder's."""

    version: Literal[1] = 1
    request_id: str = Field(pattern=ID_PATTERN)
    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    label: str | None = Field(default=None, max_length=MAX_LABEL_CHARS)
    include_context: bool = False
    turn_id: str | None = Field(default=None, max_length=64)
    chat_id: int | None = None
    created_at: float = Field(default_factory=time.time)


class ProgressMessage(_Strict):
    """POST /run/message: text a subagent sends to its chat while it works. The id makes a retry harmless."""

    message_id: str = Field(pattern=ID_PATTERN)
    text: str = Field(min_length=1, max_length=MAX_PROGRESS_CHARS)


class TaskSpec(_Strict):
    """GET /run/task: everything the in-container agent needs, and nothing secret."""

    version: Literal[1] = 1
    run_id: str = Field(pattern=ID_PATTERN)
    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    label: str
    context: list[str] = Field(default_factory=list)  # recent chat lines when include_context=True
    history: list[Any] = Field(default_factory=list)  # the prior session: pydantic-ai messages as JSON
    provider_kind: Literal["openai", "anthropic"] = "openai"  # wire format the LLM proxy speaks
    model: str = "offline-subagent"
    bash_timeout_seconds: float = 120.0
    output_cap_chars: int = 16_000
    max_steps: int = 50
    max_messages: int = 10  # progress messages the host accepts from this run


class RunResult(_Strict):
    """POST /run/result, the container's last act. The first one a run sends is the one that counts."""

    status: Literal["completed", "failed"]
    result: str = Field(default="", max_length=MAX_RESULT_CHARS)
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


class ChannelAnswer(_Strict):
    """What the host answers to a message, session or result: accepted, or refused with the reason."""

    ok: bool
    detail: str = ""


def write_json_atomic(path: Path, model: BaseModel) -> None:
    """Write a model as JSON so a reader sees all of it or nothing (see `write_bytes_atomic`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, model.model_dump_json().encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename: a reader sees all or nothing."""
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
