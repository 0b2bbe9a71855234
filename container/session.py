"""Session continuity: the pydantic-ai message history a run starts from and the one it hands back."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from container.protocol import MAX_SESSION_BYTES


def load_history(raw: list[Any]) -> tuple[list[ModelMessage], str | None]:
    """The prior history from the task, and why it was dropped if it was unusable (the run goes on fresh)."""
    if not raw:
        return [], None
    try:
        return ModelMessagesTypeAdapter.validate_python(raw), None
    except ValidationError as exc:
        return [], f"the prior session is not a message history ({exc.error_count()} errors); starting fresh"


def dump_history(messages: list[ModelMessage], max_bytes: int = MAX_SESSION_BYTES) -> bytes:
    """The history as JSON, oldest messages dropped until it fits the channel's limit."""
    start = 0
    while True:
        data = ModelMessagesTypeAdapter.dump_json(messages[start:])
        if len(data) <= max_bytes or start >= len(messages):
            return data if len(data) <= max_bytes else b"[]"
        # Drop a quarter of what is left at a time: a few encodings even for a huge history.
        start += max(1, (len(messages) - start) // 4)
