"""At start-up, the growing answers a crash (or a stop) cut short: each is answered into, or marked interrupted.

A record of core/store/live_messages.py left at start is an answer whose final text was never owed (the
outbox row that owes it ends the record in its transaction). The chat's newest one is answered into when it
can be: its part ids go to the live replies, and the turn it was for is started again with its trigger, so
the chat's next answer is written into that message. Otherwise (the message that asked is gone, the chat is
not allowed any more, streaming is off, or an older record of the same chat) its text as last recorded is
finished with INTERRUPTED_MARK and no Stop button, through the outbox. Either way the chat keeps one message.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.agent.live_reply import LiveReplies
from core.delivery import Delivery
from core.logging import get_logger
from core.store.live_messages import LiveMessageStore, LiveRecord
from core.store.messages import MessageStore

log = get_logger(__name__)

INTERRUPTED_MARK = "_(interrupted by a restart)_"
INTERRUPTED_KIND = "interrupted"  # the stored message's kind: prompts see an answer cut short
# A record older than this (from its first message) is not answered into: the chat has moved on below it.
LIVE_RESUME_MAX_AGE_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Resumed:
    """A turn to start again once the channel is up: its answer goes into the recorded message."""

    chat_id: int
    trigger_id: int


class LiveRestart:
    def __init__(
        self,
        records: LiveMessageStore,
        messages: MessageStore,
        delivery: Delivery,
        live: LiveReplies | None,
        allowed: Callable[[int], Awaitable[bool]],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._messages = messages
        self._delivery = delivery
        self._live = live  # None: streaming is off now, so nothing is answered into an old message
        self._allowed = allowed
        self._clock = clock  # unix seconds, as the records' created_at

    async def recover(self) -> list[Resumed]:
        """Handle every leftover record (before polling starts); the turns to start again (after it does)."""
        leftovers = await self._records.leftovers()
        newest = {record.chat_id: record for record in leftovers}  # oldest first: the last of a chat wins
        resumed: list[Resumed] = []
        for record in leftovers:
            trigger = await self._answerable(record) if newest[record.chat_id] is record else None
            if trigger is not None and self._live is not None:
                self._live.keep(record.chat_id, record.part_ids, record.turn_id)
                resumed.append(Resumed(record.chat_id, trigger))
            else:
                await self._interrupted(record)
        if leftovers:
            log.info("live_messages_recovered", answered=len(resumed), interrupted=len(leftovers) - len(resumed))
        return resumed

    async def _answerable(self, record: LiveRecord) -> int | None:
        """The trigger to answer again: still stored, of the chat, the chat still one the bot works in, the
        record recent, and its turn started nothing that answering again would start twice."""
        if record.trigger_message_id is None or not record.part_ids:
            return None
        if self._clock() - record.created_at > LIVE_RESUME_MAX_AGE_SECONDS:
            return None
        if await self._records.started_work(record):
            return None
        asked = await self._messages.get(record.trigger_message_id)
        if asked is None or asked.chat_id != record.chat_id or not await self._allowed(record.chat_id):
            return None
        return record.trigger_message_id

    async def _interrupted(self, record: LiveRecord) -> None:
        if not record.part_ids:
            await self._records.drop(record.turn_id)
            return
        text = f"{record.text}\n\n{INTERRUPTED_MARK}" if record.text.strip() else INTERRUPTED_MARK
        asked = None
        if record.trigger_message_id is not None:
            asked = await self._messages.platform_id_of(record.trigger_message_id, record.chat_id)
        await self._delivery.owe_answer(
            record.chat_id,
            text,
            kind=INTERRUPTED_KIND,
            reply_to=asked,
            edit_ids=record.part_ids,
            finishes_live=record.turn_id,
        )
        log.info("live_message_interrupted", chat_id=record.chat_id, turn_id=record.turn_id)
