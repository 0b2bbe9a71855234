"""Rejections of one chat that arrive together become one notice.

A burst of spawn requests over the cap would otherwise queue a notice per request ahead of the
accepted runs' results, and Telegram sends at most 20 messages a minute in a group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from core.delivery import Delivery
from core.store.runs import RunStore

REJECT_NOTICE_WINDOW_SECONDS = 1.0  # rejections this close together are told in one message


class RejectionNotices:
    def __init__(
        self, send: Callable[[int, int], Awaitable[object]], window_seconds: float = REJECT_NOTICE_WINDOW_SECONDS
    ) -> None:
        self._send = send
        self._window_seconds = window_seconds
        self._counts: dict[int, int] = {}
        self._pending: dict[int, asyncio.Task[None]] = {}

    def add(self, chat_id: int) -> None:
        self._counts[chat_id] = self._counts.get(chat_id, 0) + 1
        if chat_id not in self._pending:
            self._pending[chat_id] = asyncio.create_task(self._later(chat_id), name=f"rejections-{chat_id}")

    async def _later(self, chat_id: int) -> None:
        await asyncio.sleep(self._window_seconds)
        await self._flush(chat_id)

    async def _flush(self, chat_id: int) -> None:
        self._pending.pop(chat_id, None)
        count = self._counts.pop(chat_id, 0)
        if count:
            await self._send(chat_id, count)

    async def close(self) -> None:
        """Tell every chat now what it is still owed (shutdown)."""
        for chat_id, task in list(self._pending.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self._flush(chat_id)


class Refusals:
    """Refused requests told to their chat: the notice is stored with the fact that the chat was told
    (a crash before this is told at the next start) and sent in the background (the watcher never waits)."""

    def __init__(self, runs: RunStore, delivery: Delivery, text: Callable[[int, int], str]) -> None:
        self._runs = runs
        self._delivery = delivery
        self._text = text
        self._notices = RejectionNotices(self._tell)

    def add(self, chat_id: int) -> None:
        self._notices.add(chat_id)

    async def _tell(self, chat_id: int, count: int) -> None:
        outgoing = self._delivery.outgoing(chat_id, self._text(chat_id, count), kind="notice")
        await self._runs.mark_rejections_notified(chat_id, outgoing)
        self._delivery.send_soon(chat_id)

    async def tell_unnotified(self) -> None:
        for chat_id, count in await self._runs.unnotified_rejections():
            await self._tell(chat_id, count)

    async def close(self) -> None:
        await self._notices.close()
