"""A turn's growing answer on the chat's screen (bot/channels/live_message.py has the design).

`show(text)` takes the whole text so far and returns at once; one writer task per answer writes the newest
text whenever the pacer gives the chat a turn: the first words as a new message (a reply to the message
that asked) with a Stop button, then edits; past a part's limit the text goes on in a next message. In a
private chat the part being written is a draft and the parts before it are messages. `settle()` ends the
writing and gives the platform ids on screen, which the final text (stored once, through the outbox) is
written into. Writing is best effort: a failure here never loses the answer, which the outbox delivers.

While it is on screen the answer is recorded (core/store/live_messages.py): a new message's id at once, before
anything else is written, the text at most every RECORD_TEXT_INTERVAL_SECONDS; the final text's outbox row
ends the record in its transaction, and a record a crash left is handled at the next start
(bot/agent/live_restart.py).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from bot.channels.buttons import CardAction, CardButton
from bot.channels.edit_pacer import EditPacer
from bot.channels.live_message import DeliveryError, LiveChannel, MessageGone
from core.logging import get_logger
from core.store.live_messages import LiveMessageStore
from core.typing_indicator import TypingIndicator

log = get_logger(__name__)

STOP_LABEL = "■ Stop"
WRITING_MARK = " …"  # after the text while it is still being written
MAX_WRITE_FAILURES = 3  # failed writes in a row (not 429s) before the answer stops being shown as it grows
DRAFT_ID_MODULUS = 2**31 - 1  # a draft id is a non-zero 32-bit integer
# The recorded text of a growing answer may lag what is shown by this much: a new part's id is recorded at
# once, the text only for a restart to finish it with, so not every edit writes to the disk.
RECORD_TEXT_INTERVAL_SECONDS = 5.0


@dataclass(slots=True)
class StreamStats:
    """What the metrics are told of one answer: when its first words were visible, how many writes it took."""

    chat_id: int
    drafts: bool  # shown as a draft (a private chat) rather than by editing a message
    started_at: float  # the clock's seconds when the turn opened its answer (the turn's start)
    first_visible_at: float | None = None
    ended_at: float | None = None  # settled: the last write done
    writes: int = 0


@dataclass(slots=True)
class _Screen:
    ids: list[int] = field(default_factory=list)  # platform ids of the parts shown, in order
    frozen: set[int] = field(default_factory=set)  # parts written for the last time (a later part exists)


class LiveReply:
    def __init__(
        self,
        owner: LiveReplies,
        chat_id: int,
        turn_id: str,
        reply_to: int | None,
        ids: tuple[int, ...],
        drafts: bool,
        *,
        trigger_id: int | None = None,
        recorded: bool = False,
    ) -> None:
        self._owner = owner
        self.chat_id = chat_id
        self.turn_id = turn_id
        self._reply_to = reply_to
        self._trigger_id = trigger_id
        self._screen = _Screen(ids=list(ids))
        self._recorded_ids = tuple(ids) if recorded else ()  # as the store has them
        self._recorded_text = ""
        self._recorded_at = owner.clock()
        self._drafts = drafts
        self._draft_id = zlib.crc32(turn_id.encode()) % DRAFT_ID_MODULUS + 1
        self._latest = ""
        self._written = ""
        self._shown = ""  # the text of the newest write begun: what the record says is on screen
        self._changed = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._busy = False  # a request to Telegram is in flight: settle waits for it (its id must be known)
        self._settled = False
        self._settling: asyncio.Task[None] | None = None
        self._failures = 0
        self._typing_muted = False
        self.stats = StreamStats(chat_id=chat_id, drafts=drafts, started_at=owner.clock())

    @property
    def message_ids(self) -> tuple[int, ...]:
        """The platform ids of the parts on screen so far."""
        return tuple(self._screen.ids)

    @property
    def text(self) -> str:
        """The text so far (without the assistant's name)."""
        return self._latest

    def show(self, text: str) -> None:
        if self._settled or text == self._latest:
            return
        self._latest = text
        self._changed.set()
        if self._writer is None:
            self._owner.pacer.open(self.chat_id)
            self._writer = asyncio.create_task(self._write_loop(), name=f"live-{self.turn_id}")

    async def settle(self) -> tuple[int, ...]:
        """Stop writing; the platform ids of the parts on screen. Typing, muted while the text was visible,
        may show again (a subagent of the turn still running).

        Cancel-safe: the ending runs as a task of its own, which a cancel of the caller (a Stop, a merge, the
        bot stopping) neither cuts short nor repeats; any later call waits for the same ending. A request in
        flight is let finish, so the id of a message it sends is known and written into."""
        if self._settling is None:
            self._settled = True
            self._settling = asyncio.create_task(self._settle(), name=f"settle-{self.turn_id}")
        await asyncio.shield(self._settling)
        return tuple(self._screen.ids)

    async def _settle(self) -> None:
        writer = self._writer
        try:
            if writer is not None:
                if not self._busy:
                    writer.cancel()
                self._changed.set()
                await asyncio.wait([writer])
        finally:
            if writer is not None:
                self._owner.pacer.close(self.chat_id)
            if self._typing_muted:
                self._owner.typing.unmute(self.chat_id)
            self.stats.ended_at = self._owner.clock()
            self._owner.finished(self)

    async def _write_loop(self) -> None:
        while not self._settled and self._failures < MAX_WRITE_FAILURES:
            await self._changed.wait()
            self._changed.clear()
            if self._settled:
                return
            await self._owner.pacer.wait_turn(self.chat_id)
            if self._settled or self._latest == self._written:
                continue
            text = self._latest
            self._busy = True
            self._shown = text
            try:
                await self._write(text)
                self._written, self._failures = text, 0
                if self._owner.clock() - self._recorded_at >= RECORD_TEXT_INTERVAL_SECONDS:
                    await self.record()
            except DeliveryError as exc:
                self._failed(exc)
            finally:
                self._busy = False

    async def record(self) -> None:
        """Store the parts on screen and the text they show (best effort: the answer itself is never lost
        by a failure here, only a restart's chance to finish this message)."""
        records = self._owner.records
        ids = tuple(self._screen.ids)
        text = self._shown
        if records is None or not ids or (ids == self._recorded_ids and text == self._recorded_text):
            return
        try:
            await records.save(self.turn_id, self.chat_id, self._trigger_id, ids, text)
        except Exception:
            log.exception("live_reply_record_failed", chat_id=self.chat_id, turn_id=self.turn_id)
            return
        self._recorded_ids, self._recorded_text, self._recorded_at = ids, text, self._owner.clock()

    def _failed(self, exc: DeliveryError) -> None:
        self._changed.set()  # the newest text is written at the next turn
        if exc.retry_after_seconds is not None:
            self._owner.pacer.back_off(self.chat_id, exc.retry_after_seconds)
            log.info("live_reply_rate_limited", chat_id=self.chat_id, retry_after_seconds=exc.retry_after_seconds)
            return
        self._failures += 1
        log.warning("live_reply_write_failed", chat_id=self.chat_id, error=str(exc), failures=self._failures)

    async def _write(self, text: str) -> None:
        channel = self._owner.channel
        parts = channel.split(f"{self._owner.assistant_name}: {text}{WRITING_MARK}")
        screen = self._screen
        requests = 0
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            if index in screen.frozen:
                continue
            if requests:
                await self._owner.pacer.wait_turn(self.chat_id)  # each further request takes a turn of its own
            requests += 1
            if self._drafts and last:
                await channel.send_draft(self.chat_id, self._draft_id, part)
            else:
                buttons = [CardButton(CardAction.STOP, self.turn_id, STOP_LABEL)] if last else []
                await self._put(index, part, buttons)
            if not last:
                screen.frozen.add(index)
            self.stats.writes += 1
            self._visible()

    async def _put(self, index: int, part: str, buttons: list[CardButton]) -> None:
        channel, screen = self._owner.channel, self._screen
        if index < len(screen.ids):
            try:
                await channel.edit_live(self.chat_id, screen.ids[index], part, buttons)
                return
            except MessageGone:  # a member deleted it while it was written: the text goes on in a new one
                log.info("live_reply_message_gone", chat_id=self.chat_id, message_id=screen.ids[index])
                screen.ids[index] = await channel.send_live(self.chat_id, part, None, buttons)
        else:
            reply_to = self._reply_to if not screen.ids else None
            screen.ids.append(await channel.send_live(self.chat_id, part, reply_to, buttons))
        await self.record()  # a new message's id is stored before anything else is written

    def _visible(self) -> None:
        if self.stats.first_visible_at is None:
            self.stats.first_visible_at = self._owner.clock()
            self._owner.typing.mute(self.chat_id)  # the words show that the bot is answering
            self._typing_muted = True


class LiveReplies:
    """Every chat's growing answers: the channel, the pacer they share, and the message of a merged turn,
    kept for the next turn of its chat to write into."""

    def __init__(
        self,
        channel: LiveChannel,
        pacer: EditPacer,
        typing: TypingIndicator,
        assistant_name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_finished: Callable[[StreamStats], None] | None = None,
        records: LiveMessageStore | None = None,
    ) -> None:
        self.channel = channel
        self.pacer = pacer
        self.typing = typing
        self.assistant_name = assistant_name
        self.clock = clock
        self.records = records  # None: growing answers are not recorded (nothing to finish after a crash)
        self._on_finished = on_finished
        self._kept: dict[int, tuple[tuple[int, ...], str]] = {}  # chat id -> (part ids, the turn that wrote them)
        self._writing: dict[int, LiveReply] = {}  # chat id -> its answer being written (one turn at a time)

    async def open(self, chat_id: int, turn_id: str, reply_to: int | None, trigger_id: int | None = None) -> LiveReply:
        """The turn's answer, written into the chat's kept message if there is one. A cancel meanwhile (a merge,
        a Stop, the bot stopping) leaves that message kept for the chat's next turn, with its record's owner
        as the hand-over left it (the hand-over is let finish), so the chat never gets a second message."""
        ids, writer = self._kept.pop(chat_id, ((), ""))
        taking = asyncio.ensure_future(self._take_over(writer, turn_id, trigger_id)) if ids else None
        try:
            recorded = await asyncio.shield(taking) if taking is not None else False
            drafts = await self.channel.drafts_for(chat_id)
        except asyncio.CancelledError:
            if taking is not None:
                owner = turn_id if await taking else writer
                self._kept.setdefault(chat_id, (ids, owner))
            raise
        reply = LiveReply(self, chat_id, turn_id, reply_to, ids, drafts, trigger_id=trigger_id, recorded=recorded)
        self._writing[chat_id] = reply
        return reply

    def writing_into(self, chat_id: int, message_id: int) -> str | None:
        """The turn whose answer is being written into that message now: a merged or restarted turn's message
        keeps the old turn's Stop button until the new turn's first write, and a press on it means the new."""
        reply = self._writing.get(chat_id)
        return reply.turn_id if reply is not None and message_id in reply.message_ids else None

    async def _take_over(self, writer: str, turn_id: str, trigger_id: int | None) -> bool:
        """The kept message's record becomes the turn's; whether it did (best effort, as any record)."""
        if self.records is None:
            return False
        try:
            return await self.records.hand_over(writer, turn_id, trigger_id)
        except Exception:
            log.exception("live_reply_hand_over_failed", turn_id=turn_id)
            return False

    def kept(self, chat_id: int) -> bool:
        """Whether the chat's next answer is to be written into a message kept for it."""
        return chat_id in self._kept

    def keep(self, chat_id: int, ids: tuple[int, ...], turn_id: str) -> None:
        """A merge aborted turn `turn_id` (or a restart cut it short): its message stays, and the chat's next
        answer is written into it (and takes over its record)."""
        if ids:
            self._kept[chat_id] = (ids, turn_id)

    def finished(self, reply: LiveReply) -> None:
        if self._writing.get(reply.chat_id) is reply:
            del self._writing[reply.chat_id]
        if self._on_finished is not None and reply.stats.writes:
            self._on_finished(reply.stats)
