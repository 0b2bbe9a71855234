"""How often growing answers may be edited: per chat, and for all chats together (bot/channels/live_message.py).

Each write of a growing answer asks for a turn first. A chat waits at least its interval since its last
write; the interval stretches to (chats streaming / STREAM_EDITS_PER_SECOND) when many chats stream at once,
so their sum stays inside the global budget; and every write takes one slot of the global budget, spaced
1 / STREAM_EDITS_PER_SECOND apart. Nothing is queued per write: a writer that waited sends its newest text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class EditPacer:
    def __init__(
        self,
        interval_seconds: float,
        edits_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._interval_seconds = interval_seconds
        self._spacing_seconds = 1.0 / edits_per_second
        self._clock = clock
        self._sleep = sleep
        self._streams: dict[int, int] = {}  # chat id -> streams open (a merge hands one over to the next)
        self._next_at: dict[int, float] = {}  # chat id -> the earliest time of its next write
        self._global_next_at = 0.0

    def open(self, chat_id: int) -> None:
        self._streams[chat_id] = self._streams.get(chat_id, 0) + 1

    def close(self, chat_id: int) -> None:
        left = self._streams.get(chat_id, 0) - 1
        if left > 0:
            self._streams[chat_id] = left
            return
        self._streams.pop(chat_id, None)
        if self._next_at.get(chat_id, 0.0) <= self._clock():
            self._next_at.pop(chat_id, None)  # kept while in the future: the chat's next stream honours it

    def streaming(self) -> int:
        """Chats with a growing answer now."""
        return len(self._streams)

    def interval_seconds(self) -> float:
        """A chat's least time between writes now: the setting, or longer when many chats stream."""
        return max(self._interval_seconds, len(self._streams) * self._spacing_seconds)

    async def wait_turn(self, chat_id: int) -> None:
        """Until this chat may write: its interval passed, and a slot of the global budget is its own."""
        now = self._clock()
        chat_at = self._next_at.get(chat_id, now)
        if chat_at > now:
            await self._sleep(chat_at - now)
            now = self._clock()
        slot = max(now, self._global_next_at)
        self._global_next_at = slot + self._spacing_seconds  # taken before sleeping: no two writers share it
        if slot > now:
            await self._sleep(slot - now)
        self._next_at[chat_id] = max(slot, self._clock()) + self.interval_seconds()

    def back_off(self, chat_id: int, seconds: float) -> None:
        """Telegram said 429 for this chat: no write before `seconds` from now."""
        self._next_at[chat_id] = max(self._next_at.get(chat_id, 0.0), self._clock() + seconds)
