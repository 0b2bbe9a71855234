"""The task as the agent reads it and the result it reports: plain dataclasses over the channel's JSON.

The host validates both ends with its typed models (container/protocol.py); the agent only checks what it
relies on, so it starts without pydantic.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# As the host's TaskSpec: a task from an older host, which sends none of the file fields, gets these.
DEFAULT_MAX_FILE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_FILES_OUT = 5
_FILE = "an offered file"
_EGRESS = "the task's egress"
EGRESS_MODES = ("allowlist", "ask", "open")


class TaskInvalid(ValueError):
    """The task the channel handed over is not usable; the message says which field."""


@dataclass(frozen=True, slots=True)
class OfferedFile:
    """A chat file the run is given: `GET /run/files/<index>` is its bytes."""

    index: int
    name: str
    size_bytes: int
    mime_type: str | None = None

    @classmethod
    def from_raw(cls, raw: object) -> OfferedFile:
        if not isinstance(raw, dict):
            raise TaskInvalid("the task's files hold a value that is not an object")
        size = _typed(raw, "size_bytes", int, where=_FILE)
        if size < 0:
            raise TaskInvalid("the task's files hold a negative size")
        mime_type = raw.get("mime_type")
        return cls(
            index=_typed(raw, "index", int, where=_FILE),
            name=_typed(raw, "name", str, where=_FILE),
            size_bytes=size,
            mime_type=mime_type if isinstance(mime_type, str) and mime_type else None,
        )


@dataclass(frozen=True, slots=True)
class Egress:
    """What the run may reach through the door (the host checks every connection): only the `allow` hosts, or
    any public address, and `max_bytes` in all."""

    mode: Literal["allowlist", "ask", "open"]
    allow: list[str] = field(default_factory=list)
    max_bytes: int = 0

    @classmethod
    def from_raw(cls, raw: object) -> Egress | None:
        """None when the task has no egress (null, or absent: an older host's task)."""
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise TaskInvalid("the task's egress is not an object")
        mode = raw.get("mode")
        if mode not in EGRESS_MODES:
            raise TaskInvalid(f"the task's egress mode is not one of {', '.join(EGRESS_MODES)}")
        allow = _typed(raw, "allow", list, [], where=_EGRESS)
        if not all(isinstance(entry, str) for entry in allow):
            raise TaskInvalid("the task's egress allow holds a value that is not a string")
        max_bytes = _typed(raw, "max_bytes", int, where=_EGRESS)
        if max_bytes < 0:
            raise TaskInvalid("the task's egress max_bytes is negative")
        return cls(mode=mode, allow=list(allow), max_bytes=max_bytes)


@dataclass(frozen=True, slots=True)
class Task:
    run_id: str
    task: str
    label: str
    context: list[str] = field(default_factory=list)
    history: list[Any] = field(default_factory=list)  # the prior session: pydantic-ai messages as JSON
    notes: str = ""  # the chat's notes: a prompt part of their own, which the host drops from the saved session
    max_steps: int = 50
    bash_timeout_seconds: float = 120.0
    output_cap_chars: int = 16_000
    files: list[OfferedFile] = field(default_factory=list)
    file_notes: list[str] = field(default_factory=list)  # files the task named and was not given, and why
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # one file sent with send_file
    max_files_out: int = DEFAULT_MAX_FILES_OUT  # files the run may send
    egress: Egress | None = None  # None: no network (the door does not listen)
    mcp_tools: list[dict[str, Any]] = field(default_factory=list)  # the operator's tools, called through the host

    @classmethod
    def from_json(cls, data: bytes) -> Task:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise TaskInvalid(f"the task is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise TaskInvalid("the task is not a JSON object")
        return cls(
            run_id=_typed(raw, "run_id", str),
            task=_typed(raw, "task", str),
            label=_typed(raw, "label", str),
            context=[str(line) for line in _typed(raw, "context", list, [])],
            history=_typed(raw, "history", list, []),
            notes=_typed(raw, "notes", str, ""),
            max_steps=_typed(raw, "max_steps", int, 50),
            bash_timeout_seconds=float(_typed(raw, "bash_timeout_seconds", (int, float), 120.0)),
            output_cap_chars=_typed(raw, "output_cap_chars", int, 16_000),
            files=[OfferedFile.from_raw(item) for item in _typed(raw, "files", list, [])],
            file_notes=[str(line) for line in _typed(raw, "file_notes", list, [])],
            max_file_bytes=_typed(raw, "max_file_bytes", int, DEFAULT_MAX_FILE_BYTES),
            max_files_out=_typed(raw, "max_files_out", int, DEFAULT_MAX_FILES_OUT),
            egress=Egress.from_raw(raw.get("egress")),
            mcp_tools=[t for t in _typed(raw, "mcp_tools", list, []) if isinstance(t, dict) and "name" in t],
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    status: Literal["completed", "failed"]
    result: str = ""
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


_MISSING = object()


def _typed(
    raw: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING, where: str = "the task"
) -> Any:
    value = raw.get(name, default)
    if value is _MISSING:
        raise TaskInvalid(f"{where} has no {name}")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TaskInvalid(f"{where}'s {name} is not a {getattr(kind, '__name__', kind)}")
    return value
