"""Reference-counted typing indicator: a chat shows typing while any turn or subagent of it runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from core.logging import get_logger

log = get_logger(__name__)


class TypingIndicator:
    """`acquire`/`release` per holder; the chat action is re-sent every interval while the count is > 0.

    Releasing the last holder cancels the chat's loop at once, so no typing action is sent after it.
    """

    def __init__(self, send_typing: Callable[[int], Awaitable[None]], interval_seconds: float) -> None:
        self._send_typing = send_typing
        self._interval_seconds = interval_seconds
        self._counts: dict[int, int] = {}
        self._loops: dict[int, asyncio.Task[None]] = {}
        self._idle: dict[int, asyncio.Event] = {}
        self._muted: dict[int, int] = {}  # chat id -> holders that show something better (a growing answer)

    def acquire(self, chat_id: int) -> None:
        self._counts[chat_id] = self._counts.get(chat_id, 0) + 1
        self._idle.setdefault(chat_id, asyncio.Event()).clear()
        if chat_id not in self._loops:
            self._loops[chat_id] = asyncio.create_task(self._loop(chat_id), name=f"typing-{chat_id}")

    def release(self, chat_id: int) -> None:
        count = self._counts.get(chat_id, 0) - 1
        if count > 0:
            self._counts[chat_id] = count
            return
        self._counts.pop(chat_id, None)
        self._idle.pop(chat_id, asyncio.Event()).set()
        loop = self._loops.pop(chat_id, None)
        if loop is not None:
            loop.cancel()

    def mute(self, chat_id: int) -> None:
        """No typing action while muted (its holders stay): a growing answer shows the bot at work."""
        self._muted[chat_id] = self._muted.get(chat_id, 0) + 1

    def unmute(self, chat_id: int) -> None:
        left = self._muted.get(chat_id, 0) - 1
        if left > 0:
            self._muted[chat_id] = left
        else:
            self._muted.pop(chat_id, None)

    def muted(self, chat_id: int) -> bool:
        return chat_id in self._muted

    def holders(self, chat_id: int) -> int:
        return self._counts.get(chat_id, 0)

    async def wait_idle(self, chat_id: int) -> None:
        """Until nothing holds the chat: no turn in flight and no subagent running."""
        while self.holders(chat_id) > 0:
            await self._idle[chat_id].wait()

    @contextlib.asynccontextmanager
    async def hold(self, chat_id: int) -> AsyncIterator[None]:
        self.acquire(chat_id)
        try:
            yield
        finally:
            self.release(chat_id)

    async def _loop(self, chat_id: int) -> None:
        while True:
            try:
                if chat_id not in self._muted:
                    await self._send_typing(chat_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # typing is cosmetic: never let it break a turn
                log.warning("typing_failed", chat_id=chat_id, error=str(exc))
            await asyncio.sleep(self._interval_seconds)

    async def close(self) -> None:
        loops = list(self._loops.values())
        self._loops.clear()
        self._counts.clear()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
