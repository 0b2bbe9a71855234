"""Notices a chat that sends triggering messages faster than turns can answer them.

The engine's queue per chat is bounded by design (one turn in flight, at most one waiting, and the
waiting turn answers everything stored meanwhile), so a flood costs no more than two turns; this
only tells the chat what is happening, once per window.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

FLOOD_WINDOW_SECONDS = 10.0
FLOOD_MAX_TRIGGERS = 8  # triggering messages per window before the chat is told
FLOOD_NOTICE = "That's a lot of messages at once: I'll read them all and answer them together in my next reply."


class FloodGuard:
    def __init__(
        self,
        max_triggers: int = FLOOD_MAX_TRIGGERS,
        window_seconds: float = FLOOD_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_triggers = max_triggers
        self._window_seconds = window_seconds
        self._clock = clock
        self._recent: dict[int, deque[float]] = {}
        self._noticed_at: dict[int, float] = {}
        self._swept_at = clock()

    def tracked_chats(self) -> int:
        """Chats with a trigger or a notice inside the window (the others are forgotten)."""
        return len(self._recent.keys() | self._noticed_at.keys())

    def should_notice(self, chat_id: int) -> bool:
        """Record one triggering message; True the first time the chat goes over the limit in a window."""
        now = self._clock()
        self._sweep(now)
        recent = self._recent.setdefault(chat_id, deque())
        recent.append(now)
        while recent and recent[0] <= now - self._window_seconds:
            recent.popleft()
        if len(recent) <= self._max_triggers:
            return False
        last = self._noticed_at.get(chat_id)
        if last is not None and now - last < self._window_seconds:
            return False
        self._noticed_at[chat_id] = now
        return True

    def _sweep(self, now: float) -> None:
        """Once a window, forget chats whose triggers and notice have all left it: what a chat that went
        quiet leaves behind would otherwise be kept for good, for every chat the bot ever heard from."""
        if now - self._swept_at < self._window_seconds:
            return
        self._swept_at = now
        horizon = now - self._window_seconds
        for chat_id in [c for c, recent in self._recent.items() if recent[-1] <= horizon]:
            del self._recent[chat_id]
        for chat_id in [c for c, noticed in self._noticed_at.items() if noticed <= horizon]:
            del self._noticed_at[chat_id]
