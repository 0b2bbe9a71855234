"""Telegram's flood limit of a group as the fake Bot API can enforce it: at most so many messages, edits
included, to one group in a sliding window; a write past it is answered 429 with the wait until a slot frees.
Off until a test sets it (most tests write faster than any real group allows)."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

from tests.fakes.faults import Fault

# What counts: every method that puts or changes a message in the chat (as bot/channels/telegram_limits.py).
_WRITE_PREFIXES = ("send", "copy", "forward", "editMessage")
_NOT_WRITES = ("sendChatAction", "sendMessageDraft")


@dataclass(frozen=True)
class Refusal:
    """A write the rule answered 429: which method, to which chat, when (time.monotonic)."""

    method: str
    chat_id: int
    at: float


class GroupRate:
    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._max_writes = 0  # 0: no limit
        self._window_seconds = 0.0
        self._writes: dict[int, deque[float]] = {}
        self.refusals: list[Refusal] = []

    def set(self, max_writes: int, window_seconds: float) -> None:
        with self._lock:
            self._max_writes, self._window_seconds = max_writes, window_seconds
            self._writes.clear()

    def refuse(self, method: str, chat_id: int | None) -> Fault | None:
        """A 429 for this call when the group is past its limit; else the call counts as one of its writes."""
        counted = method.startswith(_WRITE_PREFIXES) and method not in _NOT_WRITES
        if not self._max_writes or chat_id is None or chat_id >= 0 or not counted:
            return None
        now = time.monotonic()
        with self._lock:
            writes = self._writes.setdefault(chat_id, deque())
            while writes and writes[0] <= now - self._window_seconds:
                writes.popleft()
            if len(writes) < self._max_writes:
                writes.append(now)
                return None
            self.refusals.append(Refusal(method, chat_id, now))
            return Fault.retry_after(max(1, math.ceil(writes[0] + self._window_seconds - now)))


class GroupRateSide:
    """FakeTelegram's controls of the rule."""

    _group_rate: GroupRate

    def limit_group_writes(self, max_writes: int, window_seconds: float) -> None:
        """From now on at most `max_writes` messages and edits to one group per `window_seconds` (0: off)."""
        self._group_rate.set(max_writes, window_seconds)

    def rate_refusals(self, chat_id: int | None = None) -> list[Refusal]:
        """The writes answered 429 by the rule, oldest first."""
        return [r for r in self._group_rate.refusals if chat_id is None or r.chat_id == chat_id]
