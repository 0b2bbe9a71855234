"""Sends what the outbox owes: at once when posted, and again after failures or a restart.

Per chat, rows go out strictly in order, one part (Telegram message) at a time, each part recorded
as sent. A transient failure waits (Telegram's retry_after when given, else exponential backoff) and
holds back the chat's later rows; a permanent one (bot removed from the chat) is recorded as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from core.backoff import backoff_seconds
from core.logging import get_logger
from core.store.outbox import OutboxRow, OutboxStore, OutgoingFile

log = get_logger(__name__)

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 300.0
MAX_ATTEMPTS = 20  # about an hour of retries at the longest backoff before a message is given up
IDLE_CHECK_SECONDS = 30.0  # the dispatcher looks for due rows at least this often (a safety net: sends wake it)


class DeliveryError(Exception):
    """Sending failed. `permanent` means retrying this message cannot help; `chat_unreachable` means no
    message to the chat can arrive (the bot was removed or blocked, the chat is gone)."""

    def __init__(
        self,
        message: str,
        *,
        permanent: bool,
        retry_after_seconds: float | None = None,
        chat_unreachable: bool = False,
    ) -> None:
        super().__init__(message)
        self.permanent = permanent or chat_unreachable
        self.retry_after_seconds = retry_after_seconds
        self.chat_unreachable = chat_unreachable


class MessageGone(DeliveryError):
    """The message to edit is not there any more (a member deleted it): the part is sent anew instead."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


# Told when a chat cannot be reached (chat id, the platform's reason): the owner stops the chat's work.
UnreachableHandler = Callable[[int, str], Awaitable[None]]


class Sender(Protocol):
    """What the outbox needs of a channel: how a text is split, and sending one part or a whole text."""

    def split(self, text: str) -> list[str]: ...

    async def send_part(self, chat_id: int, part: str, reply_to: int | None = None) -> int | None:
        """One part; `reply_to` names a platform message it answers (sent plainly if that one is gone)."""

    async def send_text(self, chat_id: int, text: str) -> list[int]: ...

    async def send_file(
        self, chat_id: int, file: OutgoingFile, caption: str, reply_to: int | None = None
    ) -> int | None:
        """One file with its caption, as a photo or a document (`file.kind`); its platform message id."""


@runtime_checkable
class PartEditor(Protocol):
    """A channel that can rewrite a part it sent (a streamed answer's final text goes into its message)."""

    async def edit_part(self, chat_id: int, message_id: int, part: str) -> None:
        """Replace the message's text and take its buttons away; "not modified" is success. Raises
        MessageGone when the message was deleted, DeliveryError otherwise."""

    async def delete_part(self, chat_id: int, message_id: int) -> None:
        """Delete a message the answer no longer needs; one already gone is success. Raises DeliveryError."""


@dataclass(slots=True)
class _ChatLock:
    """A chat's send lock and how many hold it or wait for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class Outbox:
    def __init__(
        self,
        store: OutboxStore,
        channel: Sender,
        clock: Callable[[], float] = time.time,
        *,
        on_unreachable: UnreachableHandler | None = None,
    ) -> None:
        self._store = store
        self._channel = channel
        self._clock = clock
        self._on_unreachable = on_unreachable
        self._locks: dict[int, _ChatLock] = {}  # only while a chat is being sent to (or waits to be)
        self._wake = asyncio.Event()
        self._flushes: set[asyncio.Task[bool]] = set()
        self._unstored: dict[int, asyncio.Task[None]] = {}
        self._dispatched: dict[int, asyncio.Task[bool]] = {}  # flushes the dispatcher started, by chat
        self._runner: asyncio.Task[None] | None = None
        self._closing = False
        self._tracked: dict[int, int | None] = {}  # outbox row id -> its first part's platform id once sent

    async def flush(self, chat_id: int) -> bool:
        """Send the chat's due rows in order; True when nothing is left pending for it."""
        done = True
        async with self._chat_lock(chat_id):
            for row in await self._store.pending(chat_id):
                if row.next_attempt_at > self._clock() or not await self._deliver(row):
                    done = False
                    break
        if not done:
            # The dispatcher leaves a chat alone while it is being sent: tell it when the chat is due again.
            self._wake.set()
        return done

    def chats_in_flight(self) -> int:
        """Chats being sent to or waiting to be (the outbox keeps nothing in memory for the others)."""
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def _chat_lock(self, chat_id: int) -> AsyncIterator[None]:
        """One sender per chat at a time. The lock is dropped when nobody holds or waits for it: a bot in
        thousands of chats keeps one only for the chats it is sending to."""
        held = self._locks.get(chat_id)
        if held is None:
            held = self._locks[chat_id] = _ChatLock()
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if held.users == 0:
                del self._locks[chat_id]

    async def _send(self, row: OutboxRow, parts: list[str], index: int) -> int | None:
        reply_to = row.reply_to if index == 0 else None
        if row.file is not None:
            return await self._channel.send_file(row.chat_id, row.file, row.text, reply_to)
        if index < len(row.edit_ids) and isinstance(self._channel, PartEditor):
            try:
                await self._channel.edit_part(row.chat_id, row.edit_ids[index], parts[index])
                return row.edit_ids[index]
            except MessageGone:  # deleted while it was written: the answer still arrives, as a new message
                log.info("streamed_part_gone", chat_id=row.chat_id, outbox_id=row.id, part=index)
        return await self._channel.send_part(row.chat_id, parts[index], reply_to)

    async def _deliver(self, row: OutboxRow) -> bool:
        parts = [row.text] if row.file is not None else self._channel.split(row.text)  # a file: one part
        try:
            for index in range(row.parts_sent, len(parts)):
                platform_id = await self._send(row, parts, index)
                if index == 0 and row.id in self._tracked:
                    self._tracked[row.id] = platform_id
                if index == 0 and platform_id is not None and row.message_id is not None:
                    # A reply to it names this id: it is how a reply finds the message (and a result its run).
                    await self._store.set_platform_id(row.message_id, platform_id)
                if index + 1 == len(parts):
                    await self._drop_extra_parts(row, len(parts))
                await self._store.part_sent(row.id, index + 1, done=index + 1 == len(parts))
        except DeliveryError as exc:
            if exc.chat_unreachable:
                await self._unreachable(row.chat_id, str(exc))
                return False  # every row of the chat was just given up: nothing left to send
            attempts = row.attempts + 1
            if exc.permanent or attempts >= MAX_ATTEMPTS:
                log.error("delivery_given_up", chat_id=row.chat_id, outbox_id=row.id, error=str(exc))
                await self._store.give_up(row.id, str(exc))
                return True  # later rows of the chat may still go out
            delay = backoff_seconds(
                attempts,
                first_seconds=FIRST_RETRY_SECONDS,
                max_seconds=MAX_RETRY_SECONDS,
                retry_after_seconds=exc.retry_after_seconds,
            )
            log.warning("delivery_retry", chat_id=row.chat_id, outbox_id=row.id, in_seconds=delay, error=str(exc))
            await self._store.retry_later(row.id, attempts, self._clock() + delay, str(exc))
            return False
        return True

    async def _drop_extra_parts(self, row: OutboxRow, used: int) -> None:
        """A streamed answer that ends in fewer parts than were on screen (a merge's shorter answer): the parts
        past its last are deleted before the row counts as sent, so a crash meanwhile deletes them again. One
        that cannot be deleted (too old) stays: the answer itself has arrived."""
        if len(row.edit_ids) <= used or not isinstance(self._channel, PartEditor):
            return
        for message_id in row.edit_ids[used:]:
            try:
                await self._channel.delete_part(row.chat_id, message_id)
            except DeliveryError as exc:
                if not exc.permanent or exc.chat_unreachable:
                    raise  # retried with the row (its parts are rewritten as they are: "not modified")
                log.warning("streamed_part_not_deleted", chat_id=row.chat_id, outbox_id=row.id, error=str(exc))

    async def _unreachable(self, chat_id: int, reason: str) -> None:
        """Nothing owed to the chat can arrive: give it all up at once (no retries), and tell the owner."""
        await self.give_up_chat(chat_id, reason)
        if self._on_unreachable is not None:
            try:
                await self._on_unreachable(chat_id, reason)
            except Exception:
                log.exception("chat_unreachable_handler_failed", chat_id=chat_id)

    async def chat_unreachable(self, chat_id: int, reason: str) -> None:
        """The platform said so before any send failed (the bot was removed from the chat)."""
        async with self._chat_lock(chat_id):
            await self._unreachable(chat_id, reason)

    async def give_up_chat(self, chat_id: int, reason: str) -> None:
        """What is owed to a chat cannot arrive (another topic of its chat found out): give it up. Not under
        the chat's lock: two topics finding out at once would each wait for the other's."""
        given_up = await self._store.give_up_chat(chat_id, f"undeliverable: {reason}")
        if given_up:
            log.error("chat_unreachable", chat_id=chat_id, reason=reason, messages_given_up=given_up)

    def track(self, row_id: int) -> None:
        """Remember the platform id of this row's first part when it is sent (a status card replies to it)."""
        self._tracked[row_id] = None

    def take_platform_id(self, row_id: int) -> int | None:
        return self._tracked.pop(row_id, None)

    def flush_soon(self, chat_id: int) -> asyncio.Task[bool] | None:
        """Flush in the background (callers that must not wait on Telegram, like the IPC watcher)."""
        if self._closing:
            return None  # owed rows stay stored: the next start sends them
        task = asyncio.create_task(self.flush(chat_id), name=f"outbox-{chat_id}")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)
        return task

    def send_unstored_soon(self, chat_id: int, text: str) -> None:
        """Send once in the background, not stored and not retried; one at a time per chat, so a chat
        that floods the bot (Telegram lets it answer 20 a minute in a group) gets one answer, not a queue."""
        if self._closing or chat_id in self._unstored:
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
        """Sleep until the first chat is due (or a wake), start its flush, repeat."""
        while not self._closing:
            self._wake.clear()
            wait_seconds = await self._dispatch_due()
            # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancel that meets a wake.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_seconds):
                    await self._wake.wait()

    async def _dispatch_due(self) -> float:
        """Flush every chat whose first row is due; the seconds until the next one is (a chat waits on
        its first row, so a later row that is due changes nothing)."""
        try:
            heads = await self._store.heads()
        except Exception:
            log.exception("outbox_scan_failed")
            return IDLE_CHECK_SECONDS
        now = self._clock()
        wait_seconds = IDLE_CHECK_SECONDS
        for chat_id, due_at in heads:
            held = self._locks.get(chat_id)
            if chat_id in self._dispatched or (held is not None and held.lock.locked()):
                continue  # being sent: its flush wakes the dispatcher if it leaves the chat waiting
            if due_at > now:
                wait_seconds = min(wait_seconds, due_at - now)
                continue
            task = self.flush_soon(chat_id)
            if task is not None:
                self._dispatched[chat_id] = task
                task.add_done_callback(functools.partial(self._undispatch, chat_id))
        return wait_seconds

    def _undispatch(self, chat_id: int, _: asyncio.Task[bool]) -> None:
        self._dispatched.pop(chat_id, None)

    async def close(self, drain_seconds: float = 5.0) -> None:
        """Give in-flight sends a moment to finish; what is left is sent after the next start."""
        self._closing = True
        self._wake.set()
        if self._flushes:
            await asyncio.wait(set(self._flushes), timeout=drain_seconds)
        tasks: list[asyncio.Task[Any]] = [*self._flushes, *self._unstored.values()]
        tasks += [self._runner] if self._runner else []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
