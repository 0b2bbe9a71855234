"""Session continuity: the message history (pydantic-ai's JSON) a run starts from and the one it hands back.

The host checks both: it validates a session before it keeps it and before it hands it out again, so the
agent takes the prior history as it comes and only bounds what it sends.
"""

from __future__ import annotations

import json
from typing import Any

from container.contract import MAX_SESSION_BYTES


def load_history(raw: list[Any]) -> tuple[list[Any], str | None]:
    """The prior history from the task, and why it was dropped if it was unusable (the run goes on fresh)."""
    if all(isinstance(message, dict) and message.get("kind") in ("request", "response") for message in raw):
        return list(raw), None
    return [], "the prior session is not a message history; starting fresh"


def dump_history(messages: list[Any], max_bytes: int = MAX_SESSION_BYTES) -> bytes:
    """The history as JSON, oldest messages dropped until it fits the channel's limit."""
    start = 0
    while True:
        data = json.dumps(messages[start:]).encode()
        if len(data) <= max_bytes or start >= len(messages):
            return data if len(data) <= max_bytes else b"[]"
        # Drop a quarter of what is left at a time: a few encodings even for a huge history.
        start += max(1, (len(messages) - start) // 4)
