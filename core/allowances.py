"""Daily LLM allowances, enforced before spending: every call (a main-agent turn's model request, a subagent
step through the proxy, an announcement) reserves its estimate (prompt size plus output cap, at most what
is left) while its chat and the whole bot have allowance left, and settles to what it really used.

The rule this keeps: a day's use never exceeds an allowance by more than one call's own tokens, however
many calls race. Calls are admitted one at a time (a lock) and hold their estimate, which is meant to be an
upper bound of their use (a token per byte of the prompt, plus its output cap), so they cannot overshoot. Only a call
whose estimate no longer fits may hold less (what is left), and only while no other call holds any of
that allowance: else it waits for those to settle and decides again (they may leave room, or nothing).
So at most one call at a time holds a remainder, and only it can overshoot, by what it used beyond its
hold; once what is left is held, the next call is refused. (Without that wait, every call that took a
remainder freed by another's settling could overshoot: 13 calls on an allowance of 10, measured.)

Every call is counted (`SpendStore`) whether or not an allowance is set. The day is the operator's
(`TIMEZONE`) and rolls over at midnight there; reservations live in memory only, so a crash leaves none
holding anything: what calls used is what was recorded.

A chat's own allowance and its top-ups for the day are read from the store once and then kept in memory:
only this object changes them (/budget, through `set_allowance` and `add`), and it updates what it keeps as
it writes. Reading them at every reserve and settle was six queries a turn, about 1 ms (bench: allowance).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from core.logging import get_logger
from core.settings import Settings
from core.store.spend import SpendKind, SpendRow, SpendStore

log = get_logger(__name__)

# A call's estimate counts a token for each byte it sends: an upper bound, not an average (English runs about
# 4 bytes a token), since a token covers at least one byte however dense the text strangers or a hostile run
# write, and the rule above needs a bound. An image's bytes do not bound its bill: a subagent's images are held
# at a provider's most for one on top (runner/channel/llm_request.py).
BYTES_PER_TOKEN = 1
NOTICE_SHARE = 0.8  # a chat is told once a day when its use passes this share of its allowance
REMAINDER_WAIT_SECONDS = 120.0  # a call waiting for others to settle before it may take a remainder, at most


def tokens_of_bytes(size_bytes: int) -> int:
    """The tokens an estimate holds for `size_bytes` sent (or received, when a provider reports no usage)."""
    return math.ceil(size_bytes / BYTES_PER_TOKEN)


class AllowanceSpent(Exception):
    """No allowance is left for this call; the message says whose and when it resets."""


def spent_line(reason: str) -> str:
    """A refusal's reason (AllowanceSpent's message, `left_for`'s answer) as the one line a chat is told."""
    return f"{reason[:1].upper()}{reason[1:]}."


@dataclass(frozen=True, slots=True)
class Reservation:
    chat_id: int
    day: str
    kind: SpendKind
    tokens: int  # held until settled


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    day: str
    used: int  # the chat's tokens today
    allowance: int  # the chat's allowance today, top-ups included; 0: none
    added: int  # of which /budget add gave today
    bot_used: int
    bot_allowance: int  # DAILY_TOKENS; 0: none
    resets_at: float  # the next midnight in TIMEZONE


Notice = Callable[[int, BudgetStatus], None]


class Allowances:
    def __init__(self, settings: Settings, store: SpendStore, *, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings  # read at each call: the allowances change on the running bot
        self._store = store
        self._clock = clock
        self._lock = asyncio.Lock()
        self._freed = asyncio.Condition(self._lock)  # a hold was released: a waiting call decides again
        self._day = ""
        self._used: dict[int, int] = {}
        self._used_all = 0
        self._held: dict[int, int] = {}
        self._held_all = 0
        self._own: dict[int, int | None] = {}  # today's chats' own allowances as stored (None: the setting's)
        self._added: dict[int, int] = {}  # each chat's top-ups on `_day`
        self._notice: Notice | None = None

    def on_notice(self, notice: Notice) -> None:
        """Told once a day per chat when its use passes 80 % of its allowance (the chat is then told)."""
        self._notice = notice

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self._settings.timezone)

    def today(self) -> str:
        return datetime.fromtimestamp(self._clock(), self.zone).strftime("%Y-%m-%d")

    def resets_at(self) -> float:
        now = datetime.fromtimestamp(self._clock(), self.zone)
        midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight.timestamp()

    async def _roll(self) -> str:
        """Today's figures, loaded from the store at the first call of a day (or after a clock jump)."""
        day = self.today()
        if day != self._day:
            used = await self._store.day_by_chat(day)
            self._day, self._used, self._used_all = day, used, sum(used.values())
            self._held, self._held_all = {}, 0  # yesterday's holds settle into yesterday
            # Read again at each chat's first call of the day: kept for good, every chat ever seen stayed here.
            self._added, self._own = {}, {}
        return day

    async def load(self) -> None:
        """Today's figures from the store now (at start), not only at the day's first call."""
        async with self._lock:
            await self._roll()

    def bot_used(self) -> int:
        """The whole bot's tokens today as counted so far (the metrics read it when scraped; it must not block)."""
        return self._used_all if self._day == self.today() else 0

    async def _chat_allowance(self, chat_id: int) -> tuple[int, int]:
        """(allowance, of which top-ups) for the chat today (`_day`); 0: no allowance (only the bot's applies).
        Under the lock: each is read from the store the first time only."""
        if chat_id not in self._own:
            self._own[chat_id] = await self._store.chat_allowance(chat_id)
        if chat_id not in self._added:
            self._added[chat_id] = await self._store.topup(chat_id, self._day)
        own, added = self._own[chat_id], self._added[chat_id]
        base = self._settings.chat_daily_tokens if own is None else own
        return (base + added if base > 0 else 0), added

    async def reserve(self, chat_id: int, kind: SpendKind, estimate: int) -> Reservation:
        """Hold `estimate` tokens (at most what is left) for one call; AllowanceSpent when nothing is left."""
        estimate = max(1, estimate)
        async with self._lock:
            deadline = asyncio.get_running_loop().time() + REMAINDER_WAIT_SECONDS
            while True:
                day, left, others_hold = await self._left(chat_id, estimate)
                if left >= estimate or not others_hold:
                    break
                # Only a remainder is left, and calls in flight hold the rest of it: wait for them.
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._freed.wait()
                except TimeoutError:
                    raise AllowanceSpent(self._spent_text("what is left of the daily allowance", held=True)) from None
            hold = int(min(estimate, left))
            self._held[chat_id] = self._held.get(chat_id, 0) + hold
            self._held_all += hold
            return Reservation(chat_id=chat_id, day=day, kind=kind, tokens=hold)

    async def _left(self, chat_id: int, estimate: int) -> tuple[str, float, bool]:
        """(today, what is left for the chat's call, whether other calls hold some of an allowance that is
        short of `estimate`); AllowanceSpent when nothing is left. Under the lock."""
        day = await self._roll()
        allowance, _ = await self._chat_allowance(chat_id)
        bot_allowance = self._settings.daily_tokens
        left, others_hold = float("inf"), False
        if allowance > 0:
            chat_left = allowance - self._used.get(chat_id, 0) - self._held.get(chat_id, 0)
            if chat_left <= 0:
                raise AllowanceSpent(self._spent_text(f"this chat's daily allowance of {allowance:,} tokens"))
            left = min(left, chat_left)
            others_hold = chat_left < estimate and self._held.get(chat_id, 0) > 0
        if bot_allowance > 0:
            bot_left = bot_allowance - self._used_all - self._held_all
            if bot_left <= 0:
                raise AllowanceSpent(self._spent_text(f"the bot's daily allowance of {bot_allowance:,} tokens"))
            left = min(left, bot_left)
            others_hold = others_hold or (bot_left < estimate and self._held_all > 0)
        return day, left, others_hold

    def _spent_text(self, whose: str, *, held: bool = False) -> str:
        resets = datetime.fromtimestamp(self.resets_at(), self.zone).strftime("%H:%M")
        state = "is held by calls that are taking too long" if held else "is used up for today"
        return f"{whose} {state}; it resets at {resets} ({self._settings.timezone})"

    async def settle(
        self,
        reservation: Reservation,
        input_tokens: int,
        output_tokens: int,
        *,
        estimated: bool,
        audio_seconds: float = 0.0,
    ) -> None:
        """The call is done: release its hold, count what it used (on the day it was admitted); a transcription
        counts its audio seconds too."""
        used = max(0, input_tokens) + max(0, output_tokens)
        crossed: BudgetStatus | None = None
        async with self._lock:
            self._release(reservation)
            await self._store.add(
                reservation.day,
                reservation.chat_id,
                reservation.kind,
                input_tokens,
                output_tokens,
                estimated=estimated,
                audio_seconds=audio_seconds,
            )
            if reservation.day == self._day:
                before = self._used.get(reservation.chat_id, 0)
                self._used[reservation.chat_id] = before + used
                self._used_all += used
                crossed = await self._crossed(reservation.chat_id, before, before + used)
        if crossed is not None and self._notice is not None:
            self._notice(reservation.chat_id, crossed)

    async def release(self, reservation: Reservation) -> None:
        """The call failed before using anything (a provider error): its hold is freed, nothing counted."""
        async with self._lock:
            self._release(reservation)

    def _release(self, reservation: Reservation) -> None:
        if reservation.day != self._day:
            return  # held on a day that has rolled over: its holds were dropped with it
        self._held[reservation.chat_id] = max(0, self._held.get(reservation.chat_id, 0) - reservation.tokens)
        self._held_all = max(0, self._held_all - reservation.tokens)
        self._freed.notify_all()

    async def _crossed(self, chat_id: int, before: int, after: int) -> BudgetStatus | None:
        allowance, _ = await self._chat_allowance(chat_id)
        if allowance <= 0 or not before < NOTICE_SHARE * allowance <= after:
            return None
        if not await self._store.first_notice(chat_id, self._day):
            return None
        return await self._status(chat_id)

    async def left_for(self, chat_id: int) -> str | None:
        """Why nothing is left for the chat today (a turn gets this as its notice, a spawn as its refusal)."""
        try:
            reservation = await self.reserve(chat_id, SpendKind.MAIN, 1)
        except AllowanceSpent as exc:
            return str(exc)
        await self.release(reservation)
        return None

    async def status(self, chat_id: int) -> BudgetStatus:
        async with self._lock:
            await self._roll()
            return await self._status(chat_id)

    async def _status(self, chat_id: int) -> BudgetStatus:
        allowance, added = await self._chat_allowance(chat_id)
        return BudgetStatus(
            day=self._day,
            used=self._used.get(chat_id, 0),
            allowance=allowance,
            added=added,
            bot_used=self._used_all,
            bot_allowance=self._settings.daily_tokens,
            resets_at=self.resets_at(),
        )

    async def spent_today(self, chat_id: int) -> list[SpendRow]:
        """The chat's use today by kind, input and output apart (what prices apply to)."""
        day = self.today()
        return [row for row in await self._store.rows(day, chat_id) if row.day == day]

    async def set_allowance(self, chat_id: int, tokens: int | None, set_by: int | None) -> BudgetStatus:
        """The chat's own daily allowance from now on (None: back to CHAT_DAILY_TOKENS)."""
        async with self._lock:  # so no reserve keeps a value read before this write
            await self._store.set_chat_allowance(chat_id, tokens, set_by)
            self._own[chat_id] = tokens
        return await self.status(chat_id)

    async def add(self, chat_id: int, tokens: int) -> BudgetStatus:
        """More allowance for the chat today only."""
        async with self._lock:
            day = await self._roll()
            self._added[chat_id] = await self._store.add_topup(chat_id, day, tokens)
        return await self.status(chat_id)
