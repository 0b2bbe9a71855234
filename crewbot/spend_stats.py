"""The spend block of `crewbot stats`: what the LLM calls used, per day (in TIMEZONE), chat and kind.

From the rows the bot counts (`SpendStore`): tokens in and out by kind, calls, how many of them were
estimated (the provider reported no usage, so the call was counted from its size), and money at the
configured prices: the main agent's turns and announcements at LLM_PRICE_*, subagent and scheduled runs at
SUBAGENT_PRICE_* (the main's where those are not set). With every price 0, no money is shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo

from core.settings import Settings
from core.store.spend import Spend, SpendKind, SpendRow

SUBAGENT_KINDS = frozenset({SpendKind.SUBAGENT, SpendKind.SCHEDULED})  # at the subagents' prices
TOKENS_PER_PRICE_UNIT = 1_000_000  # prices are per million tokens
SECONDS_PER_MINUTE = 60.0  # speech is priced per minute of audio


def day_of(at: float, timezone: str) -> str:
    """The day (YYYY-MM-DD) a moment falls on in the operator's TIMEZONE, as the bot counts days."""
    return datetime.fromtimestamp(at, ZoneInfo(timezone)).strftime("%Y-%m-%d")


@dataclass(frozen=True, slots=True)
class Price:
    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0

    def of(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / TOKENS_PER_PRICE_UNIT


@dataclass(frozen=True, slots=True)
class Prices:
    main: Price
    subagent: Price
    speech_per_minute: float = 0.0  # STT_PRICE_PER_MINUTE: speech is priced by its audio, not its tokens

    @classmethod
    def of(cls, settings: Settings) -> Prices:
        main = Price(settings.llm_price_input_per_mtok, settings.llm_price_output_per_mtok)
        sub_in, sub_out = settings.subagent_price_input_per_mtok, settings.subagent_price_output_per_mtok
        subagent = Price(
            main.input_per_mtok if sub_in is None else sub_in,
            main.output_per_mtok if sub_out is None else sub_out,
        )
        return cls(main, subagent, settings.stt_price_per_minute)

    @property
    def priced(self) -> bool:
        """Any price above 0: money is shown."""
        tokens = (p for price in (self.main, self.subagent) for p in (price.input_per_mtok, price.output_per_mtok))
        return any(p > 0 for p in tokens) or self.speech_per_minute > 0

    def for_kind(self, kind: SpendKind) -> Price:
        return self.subagent if kind in SUBAGENT_KINDS else self.main

    def money_of(self, row: SpendRow) -> float:
        if row.kind is SpendKind.SPEECH:
            return row.spend.audio_seconds / SECONDS_PER_MINUTE * self.speech_per_minute
        return self.for_kind(row.kind).of(row.spend.input_tokens, row.spend.output_tokens)


@dataclass(frozen=True, slots=True)
class Tally:
    """Tokens and calls added up; money None when no price is set."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    estimated_calls: int = 0
    money: float | None = None
    audio_seconds: float = 0.0  # speech to text

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def plus(self, spend: Spend, money: float | None) -> Tally:
        return Tally(
            input_tokens=self.input_tokens + spend.input_tokens,
            output_tokens=self.output_tokens + spend.output_tokens,
            calls=self.calls + spend.calls,
            estimated_calls=self.estimated_calls + spend.estimated_calls,
            money=None if money is None else (self.money or 0.0) + money,
            audio_seconds=self.audio_seconds + spend.audio_seconds,
        )

    def as_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tokens": self.tokens,
            "calls": self.calls,
            "estimated_calls": self.estimated_calls,
            "money": None if self.money is None else round(self.money, 6),
        }
        if self.audio_seconds:  # speech to text was used: its audio (the key is absent otherwise, as before)
            found["audio_seconds"] = round(self.audio_seconds, 3)
        return found


@dataclass(slots=True)
class Breakdown:
    """One chat's spend (a day's, or the period's) by kind, and in all."""

    kinds: dict[SpendKind, Tally] = field(default_factory=dict)
    total: Tally = field(default_factory=Tally)

    def add(self, kind: SpendKind, spend: Spend, money: float | None) -> None:
        self.kinds[kind] = self.kinds.get(kind, Tally()).plus(spend, money)
        self.total = self.total.plus(spend, money)

    def as_dict(self) -> dict[str, object]:
        kinds = {kind.value: self.kinds[kind].as_dict() for kind in SpendKind if kind in self.kinds}
        return {"kinds": kinds, **self.total.as_dict()}


@dataclass(frozen=True, slots=True)
class ChatDay:
    day: str
    chat_id: int
    spend: Breakdown


@dataclass(frozen=True, slots=True)
class SpendStats:
    timezone: str
    since_day: str
    until_day: str
    prices: Prices
    days: list[ChatDay]  # oldest first, then by chat
    chats: dict[int, Breakdown]  # each chat's period
    total: Breakdown  # every chat shown, over the period


def compute_spend(
    rows: Iterable[SpendRow], prices: Prices, timezone: str, since_day: str, until_day: str
) -> SpendStats:
    """The rows (already of the chats to show) per day and chat, per chat, and in all."""
    by_day: dict[tuple[str, int], Breakdown] = defaultdict(Breakdown)
    chats: dict[int, Breakdown] = defaultdict(Breakdown)
    total = Breakdown()
    priced = prices.priced
    for row in rows:
        money = prices.money_of(row) if priced else None
        for breakdown in (by_day[(row.day, row.chat_id)], chats[row.chat_id], total):
            breakdown.add(row.kind, row.spend, money)
    days = [ChatDay(day, chat, spend) for (day, chat), spend in sorted(by_day.items())]
    return SpendStats(timezone, since_day, until_day, prices, days, dict(sorted(chats.items())), total)


@dataclass(frozen=True, slots=True)
class DailyUse:
    """Tokens a day, every kind together, on the days the bot recorded any spend (all chats): what the
    allowance suggestions go on. A chat silent on one of those days used 0 that day."""

    days: list[str]
    by_chat: dict[int, list[int]]  # in the order of `days`
    bot: list[int]  # all chats together

    @classmethod
    def of(cls, rows: Sequence[SpendRow]) -> DailyUse:
        days = sorted({row.day for row in rows})
        index = {day: n for n, day in enumerate(days)}
        by_chat: dict[int, list[int]] = {}
        bot = [0] * len(days)
        for row in rows:
            chat = by_chat.setdefault(row.chat_id, [0] * len(days))
            chat[index[row.day]] += row.spend.tokens
            bot[index[row.day]] += row.spend.tokens
        return cls(days, dict(sorted(by_chat.items())), bot)


# --- showing it ----------------------------------------------------------------------------------


def money_text(money: float | None) -> str:
    return "" if money is None else f"; money {money:.2f}"


def _tally(tally: Tally) -> str:
    audio = round(tally.audio_seconds)
    heard = f" ({audio // 60}:{audio % 60:02} of audio)" if tally.audio_seconds else ""
    return f"{tally.input_tokens:,} in / {tally.output_tokens:,} out{heard}"


def _breakdown(spend: Breakdown) -> str:
    kinds = ", ".join(f"{kind.value} {_tally(spend.kinds[kind])}" for kind in SpendKind if kind in spend.kinds)
    total = spend.total
    calls = f"{total.calls:,} call{'' if total.calls == 1 else 's'}, {total.estimated_calls:,} estimated"
    return f"{kinds}; {total.tokens:,} tokens; {calls}{money_text(total.money)}"


def _price(price: Price) -> str:
    return f"{price.input_per_mtok:g} in / {price.output_per_mtok:g} out per million tokens"


def render_spend(stats: SpendStats) -> list[str]:
    period = f"{stats.since_day} - {stats.until_day}, days in {stats.timezone}"
    if not stats.days:
        return [f"spend ({period}): no LLM calls recorded"]
    main, subagent = stats.prices.main, stats.prices.subagent
    if stats.prices.priced:
        kinds = (
            f"every kind: {_price(main)}"
            if main == subagent
            else f"main and announce: {_price(main)}; subagent and scheduled: {_price(subagent)}"
        )
        speech = stats.prices.speech_per_minute
        money = f"money at the configured prices ({kinds}" + (f"; speech {speech:g} a minute)" if speech else ")")
    else:
        money = "no money shown: set LLM_PRICE_INPUT_PER_MTOK and LLM_PRICE_OUTPUT_PER_MTOK (and SUBAGENT_PRICE_*)"
    lines = [f"spend ({period}); {money}:"]
    lines += [f"  {entry.day} chat {entry.chat_id}: {_breakdown(entry.spend)}" for entry in stats.days]
    lines += [f"  chat {chat} over the period: {_breakdown(spend)}" for chat, spend in stats.chats.items()]
    if len(stats.chats) > 1:
        lines.append(f"  all chats over the period: {_breakdown(stats.total)}")
    return lines


def spend_json(stats: SpendStats) -> dict[str, object]:
    return {
        "timezone": stats.timezone,
        "since_day": stats.since_day,
        "until_day": stats.until_day,
        "priced": stats.prices.priced,
        "prices": {
            "main": {
                "input_per_mtok": stats.prices.main.input_per_mtok,
                "output_per_mtok": stats.prices.main.output_per_mtok,
            },
            "subagent": {
                "input_per_mtok": stats.prices.subagent.input_per_mtok,
                "output_per_mtok": stats.prices.subagent.output_per_mtok,
            },
            "speech_per_minute": stats.prices.speech_per_minute,
        },
        "days": [{"day": entry.day, "chat_id": entry.chat_id, **entry.spend.as_dict()} for entry in stats.days],
        "chats": {str(chat): spend.as_dict() for chat, spend in stats.chats.items()},
        "total": stats.total.as_dict(),
    }
