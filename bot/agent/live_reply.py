"""A turn's growing answer on the chat's screen (bot/channels/live_message.py has the design).

`show(text)` takes the whole text so far and returns at once; one writer task per answer writes the newest
text whenever the pacer gives the chat a turn: the first words as a new message (a reply to the message
that asked) with a Stop button, then edits; past a part's limit the text goes on in a next message. In a
private chat the part being written is a draft and the parts before it are messages. `settle()` ends the
writing and gives the platform ids on screen, which the final text (stored once, through the outbox) is
written into. Writing is best effort: a failure here never loses the answer, which the outbox delivers.
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
from core.typing_indicator import TypingIndicator

log = get_logger(__name__)

STOP_LABEL = "■ Stop"
WRITING_MARK = " …"  # after the text while it is still being written
MAX_WRITE_FAILURES = 3  # failed writes in a row (not 429s) before the answer stops being shown as it grows
DRAFT_ID_MODULUS = 2**31 - 1  # a draft id is a non-zero 32-bit integer


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
    ) -> None:
        self._owner = owner
        self.chat_id = chat_id
        self.turn_id = turn_id
        self._reply_to = reply_to
        self._screen = _Screen(ids=list(ids))
        self._drafts = drafts
        self._draft_id = zlib.crc32(turn_id.encode()) % DRAFT_ID_MODULUS + 1
        self._latest = ""
        self._written = ""
        self._changed = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._busy = False  # a request to Telegram is in flight: settle waits for it (its id must be known)
        self._settled = False
        self._failures = 0
        self._typing_muted = False
        self.stats = StreamStats(chat_id=chat_id, drafts=drafts, started_at=owner.clock())

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
        may show again (a subagent of the turn still running)."""
        if not self._settled:
            self._settled = True
            writer = self._writer
            if writer is not None:
                if not self._busy:
                    writer.cancel()
                self._changed.set()
                await asyncio.gather(writer, return_exceptions=True)
                self._owner.pacer.close(self.chat_id)
            if self._typing_muted:
                self._owner.typing.unmute(self.chat_id)
            self.stats.ended_at = self._owner.clock()
            self._owner.finished(self)
        return tuple(self._screen.ids)

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
            try:
                await self._write(text)
                self._written, self._failures = text, 0
            except DeliveryError as exc:
                self._failed(exc)
            finally:
                self._busy = False

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
                return
        reply_to = self._reply_to if not screen.ids else None
        screen.ids.append(await channel.send_live(self.chat_id, part, reply_to, buttons))

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
    ) -> None:
        self.channel = channel
        self.pacer = pacer
        self.typing = typing
        self.assistant_name = assistant_name
        self.clock = clock
        self._on_finished = on_finished
        self._kept: dict[int, tuple[int, ...]] = {}

    async def open(self, chat_id: int, turn_id: str, reply_to: int | None) -> LiveReply:
        ids = self._kept.pop(chat_id, ())
        drafts = await self.channel.drafts_for(chat_id)
        return LiveReply(self, chat_id, turn_id, reply_to, ids, drafts)

    def keep(self, chat_id: int, ids: tuple[int, ...]) -> None:
        """A merge aborted the turn: its message stays, and the chat's next answer is written into it."""
        if ids:
            self._kept[chat_id] = ids

    def finished(self, reply: LiveReply) -> None:
        if self._on_finished is not None and reply.stats.writes:
            self._on_finished(reply.stats)
