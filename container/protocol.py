"""The contract between the host and a subagent container (shipped in the image; the host imports it).

A container has two mounts: its chat's workspace (read-write, never read by the host) and its run
channel (read-only: one Unix socket the host listens on). Everything else travels over that channel as
bounded, typed requests: the task and the prior session come in (`GET /run/task`), progress messages,
the session and the result go out, and each of the agent's model requests goes to `POST /run/model`: the
host builds the provider's request and sends it through its LLM proxy, which also serves the provider's
own paths. The socket is the run's identity: nothing a container sends names its run or chat.

The channel is transport-neutral: a remote runtime can serve the same paths over TCP with a per-run
token. Spawn requests (`SpawnRequest`) are the main agent's, written by the host into its IPC folder,
which no container can reach, so a subagent cannot start subagents.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, field_validator

from container.contract import (
    ASK_PATH,
    CHANNEL_DIR,
    CHANNEL_SOCKET_FILE,
    EGRESS_SOCKET_FILE,
    FILES_PATH,
    ID_PATTERN,
    INBOX_DIR,
    IPC_TASKS_DIR,
    MAX_ANSWER_CHARS,
    MAX_ASK_OPTIONS,
    MAX_CAPTION_CHARS,
    MAX_EGRESS_ENTRIES,
    MAX_ERROR_CHARS,
    MAX_FILE_META_BYTES,
    MAX_FILE_NAME_BYTES,
    MAX_FILE_NOTE_CHARS,
    MAX_FILE_NOTES,
    MAX_LABEL_CHARS,
    MAX_MCP_TOOLS,
    MAX_NOTES_CHARS,
    MAX_OFFERED_FILES,
    MAX_OPTION_CHARS,
    MAX_PROGRESS_CHARS,
    MAX_QUESTION_CHARS,
    MAX_RESULT_CHARS,
    MAX_RUN_BODY_BYTES,
    MAX_SESSION_BYTES,
    MAX_STEP_BYTES,
    MAX_TASK_CHARS,
    MAX_TOOL_DESCRIPTION_CHARS,
    MAX_TOOL_NAME_CHARS,
    MAX_TOOL_SCHEMA_CHARS,
    MAX_TOOLS,
    MAX_UNREADABLE_REASON_CHARS,
    MCP_PATH,
    MESSAGE_PATH,
    MODEL_PATH,
    RESULT_PATH,
    RUN_API_PREFIX,
    SERVED_ID_PATTERN,
    SESSION_PATH,
    TASK_PATH,
    WORKSPACE_DIR,
)

# The contract's constants, re-exported: the host imports the whole contract from here.
__all__ = [
    "ASK_PATH",
    "CHANNEL_DIR",
    "CHANNEL_SOCKET_FILE",
    "EGRESS_SOCKET_FILE",
    "FILES_PATH",
    "ID_PATTERN",
    "INBOX_DIR",
    "IPC_TASKS_DIR",
    "MAX_ANSWER_CHARS",
    "MAX_ASK_OPTIONS",
    "MAX_CAPTION_CHARS",
    "MAX_EGRESS_ENTRIES",
    "MAX_ERROR_CHARS",
    "MAX_FILE_META_BYTES",
    "MAX_FILE_NAME_BYTES",
    "MAX_FILE_NOTES",
    "MAX_FILE_NOTE_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_MCP_TOOLS",
    "MAX_NOTES_CHARS",
    "MAX_OFFERED_FILES",
    "MAX_OPTION_CHARS",
    "MAX_PROGRESS_CHARS",
    "MAX_QUESTION_CHARS",
    "MAX_RESULT_CHARS",
    "MAX_RUN_BODY_BYTES",
    "MAX_SESSION_BYTES",
    "MAX_STEP_BYTES",
    "MAX_TASK_CHARS",
    "MAX_TOOLS",
    "MAX_TOOL_DESCRIPTION_CHARS",
    "MAX_TOOL_NAME_CHARS",
    "MAX_TOOL_SCHEMA_CHARS",
    "MCP_PATH",
    "MESSAGE_PATH",
    "MODEL_PATH",
    "RESULT_PATH",
    "RUN_API_PREFIX",
    "SESSION_PATH",
    "TASK_PATH",
    "WORKSPACE_DIR",
]


FILE_REF_PATTERN = re.compile(r"f[1-9][0-9]{0,17}")  # a chat file as the main agent's prompt shows it


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
    # The chat's files the task needs, as the prompt names them (`f3`); checked against the chat when it runs.
    files: list[str] = Field(default_factory=list, max_length=MAX_OFFERED_FILES)

    @field_validator("files")
    @classmethod
    def _file_refs(cls, value: list[str]) -> list[str]:
        for ref in value:
            if not FILE_REF_PATTERN.fullmatch(ref):
                raise ValueError(f"{ref[:40]!r} is not a file id like f3")
        return value


class ProgressMessage(_Strict):
    """POST /run/message: text a subagent sends to its chat while it works. The id makes a retry harmless."""

    message_id: str = Field(pattern=ID_PATTERN)
    text: str = Field(min_length=1, max_length=MAX_PROGRESS_CHARS)


class AskQuestion(_Strict):
    """POST /run/ask: a question for the chat, with buttons to tap (`options`) or, without, a reply to write.
    The id makes a retry (a lost connection, a restart) wait for the same question."""

    ask_id: str = Field(pattern=ID_PATTERN)
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    options: list[Annotated[str, Field(min_length=1, max_length=MAX_OPTION_CHARS)]] = Field(
        default_factory=list, max_length=MAX_ASK_OPTIONS
    )


class AskAnswer(_Strict):
    """What became of a question: answered (by whom, what), no answer in time, or ended (its run is ending)."""

    outcome: Literal["answered", "no_answer", "ended"]
    answer: str | None = Field(default=None, max_length=MAX_ANSWER_CHARS)
    by: str | None = Field(default=None, max_length=200)
    detail: str = Field(default="", max_length=500)


class OfferedFile(_Strict):
    """A chat file the run is given: `GET /run/files/<index>` is its bytes, written to inbox/<name>."""

    index: int = Field(ge=0, lt=MAX_OFFERED_FILES)
    name: str = Field(min_length=1, max_length=MAX_FILE_NAME_BYTES)  # already safe and unique in the run
    size_bytes: int = Field(ge=0)
    mime_type: str | None = Field(default=None, max_length=255)


class FileMeta(_Strict):
    """The `meta` part of `POST /run/files`: the id makes a retry harmless; the host makes the name safe."""

    upload_id: str = Field(pattern=ID_PATTERN)
    name: str = Field(min_length=1, max_length=1_000)
    caption: str | None = Field(default=None, max_length=MAX_CAPTION_CHARS)


class EgressOffer(_Strict):
    """What a run may reach through the door (`EGRESS_SOCKET_FILE`); the host checks every connection."""

    mode: Literal["allowlist", "ask", "open"]
    allow: list[Annotated[str, Field(max_length=300)]] = Field(default_factory=list, max_length=MAX_EGRESS_ENTRIES)
    max_bytes: int = Field(ge=0)


class TaskSpec(_Strict):
    """GET /run/task: everything the in-container agent needs, and nothing secret."""

    version: Literal[1] = 1
    run_id: str = Field(pattern=ID_PATTERN)
    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    label: str
    context: list[str] = Field(default_factory=list)  # recent chat lines when include_context=True
    notes: str = Field(default="", max_length=MAX_NOTES_CHARS)  # the chat's notes, current at hand-off
    history: list[Any] = Field(default_factory=list)  # the prior session: pydantic-ai messages as JSON
    provider_kind: Literal["openai", "anthropic"] = "openai"  # wire format the LLM proxy speaks
    model: str = "offline-subagent"
    bash_timeout_seconds: float = 120.0
    output_cap_chars: int = 16_000
    max_steps: int = 50
    max_messages: int = 10  # progress messages the host accepts from this run
    files: list[OfferedFile] = Field(default_factory=list, max_length=MAX_OFFERED_FILES)
    # Files the task named that it was not given, each with why: the container lists them in the task text.
    file_notes: list[Annotated[str, Field(max_length=MAX_FILE_NOTE_CHARS)]] = Field(
        default_factory=list, max_length=MAX_FILE_NOTES
    )
    max_file_bytes: int = 20 * 1024 * 1024  # one file sent with send_file
    max_files_out: int = 5  # files the run may send
    egress: EgressOffer | None = None  # None: no network (the door does not listen)
    # The operator's MCP tools offered to this run (`<server>__<tool>`), called through the host (MCP_PATH).
    mcp_tools: list[ToolSpec] = Field(default_factory=list, max_length=MAX_MCP_TOOLS)


class RunResult(_Strict):
    """POST /run/result, the container's last act. The first one a run sends is the one that counts."""

    status: Literal["completed", "failed"]
    result: str = Field(default="", max_length=MAX_RESULT_CHARS)
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


class ToolSpec(_Strict):
    """A tool the agent offers the model: its name, what it does, its arguments' JSON schema."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field(max_length=MAX_TOOL_DESCRIPTION_CHARS)
    parameters: dict[str, Any]

    @field_validator("parameters")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        # The host's pydantic-ai walks the schema to fit it to the provider: keep it small and shallow. Measured
        # as UTF-8 JSON: json.dumps would escape 8 MB of non-ASCII into 25 MB, in one call holding the GIL.
        if len(pydantic_core.to_json(value)) > MAX_TOOL_SCHEMA_CHARS:
            raise ValueError(f"the schema is over {MAX_TOOL_SCHEMA_CHARS} characters")
        return value


class McpCall(_Strict):
    """POST /run/mcp: one call of an MCP tool the task offered, by its offered name, with its arguments."""

    tool: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    arguments: dict[str, Any] = Field(default_factory=dict)


class ModelStep(_Strict):
    """POST /run/model: the conversation so far (pydantic-ai messages as JSON) and the tools on offer. The
    host answers `{"response": <a pydantic-ai ModelResponse as JSON>}` (runner/channel/model_step.py)."""

    messages: list[Any] = Field(min_length=1)
    tools: list[ToolSpec] = Field(default_factory=list, max_length=MAX_TOOLS)


class UnreadableWorkspace(_Strict):
    """`POST /run/workspace`: the archive this run's GET was served (`served`, the answer's WORKSPACE_SERVED_HEADER)
    could not be unpacked, and why; the host sets it aside (runner/channel/workspace_desk.py)."""

    served: str = Field(pattern=SERVED_ID_PATTERN)
    reason: str = Field(max_length=MAX_UNREADABLE_REASON_CHARS)


TaskSpec.model_rebuild()  # its `mcp_tools` are ToolSpecs, defined after it


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
