"""Session continuity: the pydantic-ai message history a run starts from and the one it leaves behind."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from container.protocol import write_bytes_atomic


class SessionError(Exception):
    """session_in.json exists but cannot be used; the message says why."""


def load_history(path: Path) -> list[ModelMessage]:
    """The history in `path`, or an empty one when there is no such file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SessionError(f"{path.name} cannot be read: {exc.strerror or exc}") from exc
    try:
        return ModelMessagesTypeAdapter.validate_json(data)
    except ValidationError as exc:
        raise SessionError(f"{path.name} is not a pydantic-ai message history ({exc.error_count()} errors)") from exc


def save_history(path: Path, messages: list[ModelMessage]) -> None:
    """Write `messages` to `path` atomically (temp file in the same folder, fsync, rename)."""
    write_bytes_atomic(path, ModelMessagesTypeAdapter.dump_json(messages))
