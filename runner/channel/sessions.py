"""Subagent sessions on the host: validated, trimmed and kept where no container can reach.

A run hands its message history back over its channel; it is checked to be a pydantic-ai history,
trimmed to SUBAGENT_SESSION_MAX_MESSAGES, and kept only if the run completes. The next run of the chat
gets it back inside its task. A file that fails to load is skipped with a log line, so one bad session
never breaks a chat's later runs.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from container.protocol import MAX_SESSION_BYTES, write_bytes_atomic
from runner.channel.conversation_limits import MAX_PARTS_PER_MESSAGE, ConversationLimits


class SessionRejected(Exception):
    """The uploaded history is not usable; the message says why."""


def clean(data: bytes, max_messages: int, limits: ConversationLimits, notes: str = "") -> bytes:
    """Validate an uploaded history (within `limits`) and return it trimmed, re-encoded by us, without the
    chat's `notes` the run was handed. Blocking: run in a thread."""
    if len(data) > MAX_SESSION_BYTES:
        raise SessionRejected(f"the session is over {MAX_SESSION_BYTES} bytes")
    from runner.channel.session_history import HistoryInvalid, clean_history  # pydantic-ai: on first use

    try:
        return clean_history(data, max_messages, limits, notes)
    except HistoryInvalid as exc:
        raise SessionRejected(str(exc)) from None


class SessionFiles:
    """`sessions/<chat folder>/<run id>.json` under DATA_DIR, a folder only the host writes."""

    def __init__(self, sessions_dir: Path) -> None:
        self._dir = sessions_dir

    def path(self, folder: str, session_id: str) -> Path:
        return self._dir / folder / f"{session_id}.json"

    def save(self, folder: str, session_id: str, cleaned: bytes) -> None:
        target = self.path(folder, session_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(target, cleaned)

    def load(self, folder: str, session_id: str, max_messages: int) -> list[Any] | None:
        """The history as JSON values for a task, or None when missing or unusable. Blocking."""
        try:
            fd = os.open(self.path(folder, session_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            data = handle.read(MAX_SESSION_BYTES + 1)
        try:
            # Written by us, trimmed to `max_messages`: only the caps of the messages it may hold apply.
            limits = ConversationLimits(max_messages, max_messages * MAX_PARTS_PER_MESSAGE)
            value: list[Any] = json.loads(clean(data, max_messages, limits))
        except (SessionRejected, ValueError):
            return None
        return value
