"""How often growing answers may be edited: per chat, and for all chats together (bot/channels/live_message.py).

Each write of a growing answer asks for a turn first. A chat waits at least its interval since its last
write: STREAM_EDIT_INTERVAL_SECONDS for a group's edits, STREAM_DRAFT_INTERVAL_SECONDS for a private chat's
draft. The interval stretches to (chats streaming / STREAM_EDITS_PER_SECOND) when many chats stream at once,
so their sum stays inside the global budget; and every write takes one slot of the global budget, spaced
1 / STREAM_EDITS_PER_SECOND apart. Nothing is queued per write: a writer that waited sends its newest text.

A 429 says the chat is written to faster than Telegram allows it (a group's 20 messages a minute count its
other messages too: results, cards, the outbox's sends). Waiting its retry_after and going back to the same
pace would only meet the next 429 a few edits later, so the chat's interval doubles at each 429 (up to
MAX_SLOWED_INTERVAL_SECONDS) and is remembered for the chat, halving back every SLOWDOWN_HALVING_SECONDS
without one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

MAX_SLOWED_INTERVAL_SECONDS = 30.0  # a chat's interval after 429s in a row grows no further
SLOWDOWN_HALVING_SECONDS = 120.0  # a slowed chat's interval halves this long after its last 429


class EditPacer:
    def __init__(
        self,
        interval_seconds: float,
        edits_per_second: float,
        *,
        draft_interval_seconds: float | None = None,
        drafts_for: Callable[[int], Awaitable[bool]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`drafts_for(chat_id)`: whether the chat's answer is a draft (draft_interval_seconds applies)."""
        self._interval_seconds = interval_seconds
        self._draft_interval_seconds = interval_seconds if draft_interval_seconds is None else draft_interval_seconds
        self._drafts_for = drafts_for
        self._spacing_seconds = 1.0 / edits_per_second
        self._clock = clock
        self._sleep = sleep
        self._streams: dict[int, int] = {}  # chat id -> streams open (a merge hands one over to the next)
        self._next_at: dict[int, float] = {}  # chat id -> the earliest time of its next write
        self._bases: dict[int, float] = {}  # chat id -> its own interval (group or draft), while it streams
        self._slowed: dict[int, tuple[float, float]] = {}  # chat id -> (interval after its 429s, last 429 at)
        self._global_next_at = 0.0

    def open(self, chat_id: int) -> None:
        self._prune()
        self._streams[chat_id] = self._streams.get(chat_id, 0) + 1

    def close(self, chat_id: int) -> None:
        left = self._streams.get(chat_id, 0) - 1
        if left > 0:
            self._streams[chat_id] = left
            return
        self._streams.pop(chat_id, None)
        self._bases.pop(chat_id, None)
        if self._next_at.get(chat_id, 0.0) <= self._clock():
            self._next_at.pop(chat_id, None)  # kept while in the future: the chat's next stream honours it

    def streaming(self) -> int:
        """Chats with a growing answer now."""
        return len(self._streams)

    def remembered(self) -> int:
        """Chats the pacer keeps a time or a slowdown for: those streaming, and those whose wait is not over."""
        return len(self._next_at.keys() | self._slowed.keys() | self._streams.keys())

    def interval_seconds(self) -> float:
        """A group's least time between writes now: the setting, or longer when many chats stream."""
        return max(self._interval_seconds, self._crowded_seconds())

    def chat_interval_seconds(self, chat_id: int) -> float:
        """This chat's least time between writes now: its own interval, slowed by 429s, or the crowd's."""
        base = self._bases.get(chat_id, self._interval_seconds)
        return max(base, self._slowed_seconds(chat_id, base), self._crowded_seconds())

    async def wait_turn(self, chat_id: int) -> None:
        """Until this chat may write: its interval passed, and a slot of the global budget is its own."""
        if chat_id not in self._bases:
            drafts = self._drafts_for is not None and await self._drafts_for(chat_id)
            self._bases[chat_id] = self._draft_interval_seconds if drafts else self._interval_seconds
        now = self._clock()
        chat_at = self._next_at.get(chat_id, now)
        if chat_at > now:
            await self._sleep(chat_at - now)
            now = self._clock()
        slot = max(now, self._global_next_at)
        self._global_next_at = slot + self._spacing_seconds  # taken before sleeping: no two writers share it
        if slot > now:
            await self._sleep(slot - now)
        self._next_at[chat_id] = max(slot, self._clock()) + self.chat_interval_seconds(chat_id)

    def back_off(self, chat_id: int, seconds: float) -> None:
        """Telegram said 429 for this chat: no write before `seconds` from now, and its interval doubles."""
        now = self._clock()
        self._next_at[chat_id] = max(self._next_at.get(chat_id, 0.0), now + seconds)
        base = self._bases.get(chat_id, self._interval_seconds)
        slowed = min(2 * max(base, self._slowed_seconds(chat_id, base)), MAX_SLOWED_INTERVAL_SECONDS)
        self._slowed[chat_id] = (max(slowed, base), now)

    def _prune(self) -> None:
        """Forget the chats whose next write time has passed and whose slowdown is over: without this, one
        entry would stay for every chat that ever streamed (a 429 in its last write leaves one behind)."""
        now = self._clock()
        for chat_id in [c for c, at in self._next_at.items() if at <= now and c not in self._streams]:
            del self._next_at[chat_id]
        least = min(self._interval_seconds, self._draft_interval_seconds)
        for chat_id in list(self._slowed):
            self._slowed_seconds(chat_id, self._bases.get(chat_id, least))  # drops it once back to its pace

    def _crowded_seconds(self) -> float:
        return len(self._streams) * self._spacing_seconds

    def _slowed_seconds(self, chat_id: int, base: float) -> float:
        """The chat's interval as its 429s left it, halved for each SLOWDOWN_HALVING_SECONDS since the last."""
        slowed = self._slowed.get(chat_id)
        if slowed is None:
            return base
        interval, at = slowed
        decayed: float = interval / 2 ** int((self._clock() - at) // SLOWDOWN_HALVING_SECONDS)
        if decayed <= base:
            del self._slowed[chat_id]  # back to its own pace: nothing to remember
            return base
        return decayed
