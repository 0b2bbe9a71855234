"""Sends what the outbox owes: at once when posted, and again after failures or a restart.

Per chat, rows go out strictly in order, one part (Telegram message) at a time, each part recorded
as sent. A transient failure waits (Telegram's retry_after when given, else exponential backoff) and
holds back the chat's later rows; a permanent one (bot removed from the chat) is recorded as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from bot.channels.base import Channel, DeliveryError
from bot.logging import get_logger
from bot.store.outbox import OutboxRow, OutboxStore

log = get_logger(__name__)

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 300.0
MAX_ATTEMPTS = 20  # about an hour of retries at the longest backoff before a message is given up
IDLE_CHECK_SECONDS = 30.0  # the dispatcher looks for due rows at least this often


def backoff_seconds(attempts: int, retry_after_seconds: float | None) -> float:
    if retry_after_seconds is not None:
        return max(retry_after_seconds, FIRST_RETRY_SECONDS)
    return float(min(FIRST_RETRY_SECONDS * 2 ** (attempts - 1), MAX_RETRY_SECONDS))


class Outbox:
    def __init__(self, store: OutboxStore, channel: Channel, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._channel = channel
        self._clock = clock
        self._locks: dict[int, asyncio.Lock] = {}
        self._wake = asyncio.Event()
        self._flushes: set[asyncio.Task[bool]] = set()
        self._unstored: dict[int, asyncio.Task[None]] = {}
        self._runner: asyncio.Task[None] | None = None

    async def flush(self, chat_id: int) -> bool:
        """Send the chat's due rows in order; True when nothing is left pending for it."""
        lock = self._locks.setdefault(chat_id, asyncio.Lock())
        async with lock:
            for row in await self._store.pending(chat_id):
                if row.next_attempt_at > self._clock() or not await self._deliver(row):
                    return False
        return True

    async def _deliver(self, row: OutboxRow) -> bool:
        parts = self._channel.split(row.text)
        try:
            for index in range(row.parts_sent, len(parts)):
                await self._channel.send_part(row.chat_id, parts[index])
                await self._store.part_sent(row.id, index + 1, done=index + 1 == len(parts))
        except DeliveryError as exc:
            attempts = row.attempts + 1
            if exc.permanent or attempts >= MAX_ATTEMPTS:
                log.error("delivery_given_up", chat_id=row.chat_id, outbox_id=row.id, error=str(exc))
                await self._store.give_up(row.id, str(exc))
                return True  # later rows of the chat may still go out
            delay = backoff_seconds(attempts, exc.retry_after_seconds)
            log.warning("delivery_retry", chat_id=row.chat_id, outbox_id=row.id, in_seconds=delay, error=str(exc))
            await self._store.retry_later(row.id, attempts, self._clock() + delay, str(exc))
            self._wake.set()
            return False
        return True

    def flush_soon(self, chat_id: int) -> None:
        """Flush in the background (callers that must not wait on Telegram, like the IPC watcher)."""
        task = asyncio.create_task(self.flush(chat_id), name=f"outbox-{chat_id}")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    def send_unstored_soon(self, chat_id: int, text: str) -> None:
        """Send once in the background, not stored and not retried; one at a time per chat, so a chat
        that floods the bot (Telegram lets it answer 20 a minute in a group) gets one answer, not a queue."""
        if chat_id in self._unstored:
            log.info("unstored_reply_dropped", chat_id=chat_id, reason="one still being sent")
            return
        task = asyncio.create_task(self._send_unstored(chat_id, text), name=f"unstored-{chat_id}")
        self._unstored[chat_id] = task
        task.add_done_callback(lambda _: self._unstored.pop(chat_id, None))

    async def _send_unstored(self, chat_id: int, text: str) -> None:
        try:
            await self._channel.send_text(chat_id, text)
        except Exception as exc:
            log.warning("unstored_reply_failed", chat_id=chat_id, error=str(exc))

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run(), name="outbox")

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                for chat_id in await self._store.chats_due(self._clock()):
                    lock = self._locks.get(chat_id)
                    if lock is None or not lock.locked():
                        self.flush_soon(chat_id)
                next_due = await self._store.next_due_at()
            except Exception:
                log.exception("outbox_scan_failed")
                next_due = None
            wait = IDLE_CHECK_SECONDS if next_due is None else max(next_due - self._clock(), 0.05)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(wait, IDLE_CHECK_SECONDS))

    async def close(self, drain_seconds: float = 5.0) -> None:
        """Give in-flight sends a moment to finish; what is left is sent after the next start."""
        if self._flushes:
            await asyncio.wait(set(self._flushes), timeout=drain_seconds)
        tasks: list[asyncio.Task[Any]] = [*self._flushes, *self._unstored.values()]
        tasks += [self._runner] if self._runner else []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
