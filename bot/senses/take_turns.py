"""Slots that chats take in turn: a call waiting for one is served before another of a chat that already holds
more, so one chat's flood of voice notes delays its own, not every other chat's (a plain semaphore serves them in
the order they came: a hundred of one chat, then everyone else's)."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class TakeTurns:
    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: dict[int, deque[asyncio.Future[None]]] = {}  # per chat, oldest first; chats in arrival order
        self._held: Counter[int] = Counter()

    @property
    def held(self) -> dict[int, int]:
        return {key: n for key, n in self._held.items() if n}

    @asynccontextmanager
    async def slot(self, key: int) -> AsyncIterator[None]:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            self._held[key] += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(key, deque()).append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._held[key] -= 1
                    self._hand_on()  # given the slot as it was cancelled: the next one has it
                else:
                    self._forget(key, turn)
                raise
        try:
            yield
        finally:
            self._held[key] -= 1
            self._hand_on()

    def _hand_on(self) -> None:
        """A slot is free: to the waiting chat that holds fewest (the longest waiting among those)."""
        while self._waiting:
            key = min(self._waiting, key=lambda k: self._held[k])  # min keeps the first of equals: arrival order
            queue = self._waiting.pop(key)
            turn = queue.popleft()
            if queue:
                self._waiting[key] = queue  # its next waits behind the chats that came after it
            if not turn.done():
                turn.set_result(None)
                self._held[key] += 1  # counted now: the next free slot sees it held before its task runs
                return
        self._free += 1

    def _forget(self, key: int, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(key)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[key]
