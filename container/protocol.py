"""The file contract between the host and a subagent container (shipped in the image; the host imports it).

Run dir (mounted at RUN_DIR): task.json in, result.json out, session_in.json / session_out.json
(pydantic-ai message history), llm.sock (the host's LLM proxy). IPC folder (mounted at IPC_DIR):
tasks/ for spawn requests, messages/ for progress messages. Every file is JSON written atomically.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RUN_DIR = "/crewbot/run"
IPC_DIR = "/crewbot/ipc"
WORKSPACE_DIR = "/workspace"
TASK_FILE = "task.json"
RESULT_FILE = "result.json"
SESSION_IN_FILE = "session_in.json"
SESSION_OUT_FILE = "session_out.json"
LLM_SOCKET_FILE = "llm.sock"
LOG_FILE = "container.log"
IPC_TASKS_DIR = "tasks"
IPC_MESSAGES_DIR = "messages"

ID_PATTERN = r"^[A-Za-z0-9_-]{6,64}$"
MAX_TASK_CHARS = 100_000
MAX_MESSAGE_CHARS = 20_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpawnRequest(_Strict):
    """data/ipc/<chat>/tasks/<request_id>.json. The chat is the folder's; `chat_id`, if given, must match."""

    version: Literal[1] = 1
    request_id: str = Field(pattern=ID_PATTERN)
    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    label: str | None = Field(default=None, max_length=200)
    include_context: bool = False
    turn_id: str | None = Field(default=None, max_length=64)
    chat_id: int | None = None
    created_at: float = Field(default_factory=time.time)


class ProgressMessage(_Strict):
    """data/ipc/<chat>/messages/<message_id>.json: text a subagent sends to its chat while it works."""

    version: Literal[1] = 1
    message_id: str = Field(pattern=ID_PATTERN)
    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    run_id: str | None = Field(default=None, max_length=64)
    chat_id: int | None = None
    created_at: float = Field(default_factory=time.time)


class TaskSpec(_Strict):
    """run dir/task.json: everything the in-container agent needs, and nothing secret."""

    version: Literal[1] = 1
    run_id: str = Field(pattern=ID_PATTERN)
    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    label: str
    context: list[str] = Field(default_factory=list)  # recent chat lines when include_context=True
    provider_kind: Literal["openai", "anthropic"] = "openai"  # wire format the LLM proxy speaks
    model: str = "offline-subagent"
    bash_timeout_seconds: float = 120.0
    output_cap_chars: int = 16_000
    max_steps: int = 50


class RunResult(_Strict):
    """run dir/result.json, written by the container as its last act."""

    version: Literal[1] = 1
    run_id: str
    status: Literal["completed", "failed"]
    result: str = ""
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    finished_at: float = Field(default_factory=time.time)


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
