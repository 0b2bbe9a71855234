"""Suggested daily allowances (CHAT_DAILY_TOKENS, DAILY_TOKENS) from the measured use, with their reasoning.

A day's use is every kind of call together (main, announce, subagent, scheduled), as the allowances count
it, on each day the bot recorded any spend in the period (a chat silent that day used 0). CHAT_DAILY_TOKENS:
the 95th percentile of each chat's daily use, the busiest chat's, times a headroom, rounded up to a readable
number; chats with their own allowance are left out (the setting does not apply to them). DAILY_TOKENS: the
same over the bot's daily totals (all chats, whatever `--chat` shows). Fewer than MIN_DAYS days: nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.setting_bounds import MAX_DAILY_TOKENS
from crewbot.spend_stats import DailyUse
from crewbot.usage_stats import percentile

HEADROOM = 1.5  # above the p95 day: a busy day is not cut off, a runaway one is
MIN_DAYS = 3  # days of recorded spend below which a percentile says nothing
MIN_SUGGESTION = 1_000  # tokens: below this an allowance stops a chat at its first turn
PERCENTILE = 0.95
CHAT_SETTING = "CHAT_DAILY_TOKENS"
BOT_SETTING = "DAILY_TOKENS"


def readable(tokens: float) -> int:
    """Rounded up to two significant digits (184,321 -> 190,000), at least MIN_SUGGESTION, at most the bound."""
    whole = max(MIN_SUGGESTION, math.ceil(tokens))
    step = int(10 ** max(0, len(str(whole)) - 2))
    return min(MAX_DAILY_TOKENS, -(-whole // step) * step)


@dataclass(frozen=True, slots=True)
class AllowanceSuggestion:
    setting: str
    current: int  # in force now; 0: no allowance
    suggested: int | None  # None: nothing to suggest
    p95: int | None  # tokens on the p95 day the suggestion is based on (whole tokens)
    days: int  # days of recorded spend in the period
    busiest_chat: int | None  # the chat whose p95 day it is (CHAT_DAILY_TOKENS)
    reached: int  # days (chat-days for CHAT_DAILY_TOKENS) whose use reached the current allowance
    line: str


@dataclass(frozen=True, slots=True)
class AllowanceAdvice:
    chat: AllowanceSuggestion
    bot: AllowanceSuggestion
    lines: list[str] = field(default_factory=list)


def _current(current: int, reached: int | None = None, day: str = "day") -> str:
    if current <= 0:
        return "now 0 (no allowance)"
    if reached is None:
        return f"now {current:,}"
    return f"now {current:,}, reached on {reached} {day}{'' if reached == 1 else 's'}"


def _p95(daily: list[int]) -> int:
    return round(percentile([float(tokens) for tokens in daily], PERCENTILE) or 0.0)


def _own(tokens: int) -> str:
    return f"{tokens:,} tokens a day" if tokens > 0 else "none: no limit"


def _too_few(setting: str, days: int, current: int) -> AllowanceSuggestion:
    line = (
        f"{setting}: nothing to suggest: spend recorded on {days} day{'s' if days != 1 else ''}, "
        f"{MIN_DAYS} needed; {_current(current)}"
    )
    return AllowanceSuggestion(setting, current, None, None, days, None, 0, line)


def _suggest_chat(use: DailyUse, current: int, own: Mapping[int, int], chat_id: int | None) -> AllowanceSuggestion:
    days = len(use.days)
    if days < MIN_DAYS:
        return _too_few(CHAT_SETTING, days, current)
    shown = {chat: daily for chat, daily in use.by_chat.items() if chat_id is None or chat == chat_id}
    governed = {chat: daily for chat, daily in shown.items() if chat not in own}
    left_out = len(shown) - len(governed)
    if not governed:
        why = (
            f"chat {chat_id} has its own allowance ({_own(own[chat_id])}), which {CHAT_SETTING} does not replace"
            if chat_id is not None and chat_id in own
            else "no chat without its own allowance used anything"
        )
        line = f"{CHAT_SETTING}: nothing to suggest: {why}; {_current(current)}"
        return AllowanceSuggestion(CHAT_SETTING, current, None, None, days, None, 0, line)
    p95s = {chat: _p95(daily) for chat, daily in governed.items()}
    busiest = max(p95s, key=lambda chat: (p95s[chat], -chat))
    p95 = p95s[busiest]
    suggested = readable(p95 * HEADROOM)
    reached = sum(1 for daily in governed.values() for used in daily if current > 0 and used >= current)
    whose, which = ("busiest chat's", f" (chat {busiest})") if chat_id is None else (f"chat {chat_id}'s", "")
    whose_own = "chat with its" if left_out == 1 else "chats with their"
    note = f"; {left_out} {whose_own} own allowance left out" if left_out else ""
    line = (
        f"suggested {CHAT_SETTING}={suggested}: {whose} p95 day: {p95:,.0f} tokens over {days} days{which}, "
        f"x{HEADROOM:g} headroom, rounded up; {_current(current, reached, 'chat-day')}{note}"
    )
    return AllowanceSuggestion(CHAT_SETTING, current, suggested, p95, days, busiest, reached, line)


def _suggest_bot(use: DailyUse, current: int) -> AllowanceSuggestion:
    days = len(use.days)
    if days < MIN_DAYS:
        return _too_few(BOT_SETTING, days, current)
    p95 = _p95(use.bot)
    suggested = readable(p95 * HEADROOM)
    reached = sum(1 for used in use.bot if current > 0 and used >= current)
    line = (
        f"suggested {BOT_SETTING}={suggested}: the bot's p95 day: {p95:,.0f} tokens over {days} days "
        f"(all chats together), x{HEADROOM:g} headroom, rounded up; {_current(current, reached, 'day')}"
    )
    return AllowanceSuggestion(BOT_SETTING, current, suggested, p95, days, None, reached, line)


def advise_allowances(
    use: DailyUse,
    *,
    chat_daily_tokens: int,
    daily_tokens: int,
    own_allowances: Mapping[int, int],
    chat_id: int | None = None,
) -> AllowanceAdvice:
    """`own_allowances`: the chats an admin gave their own allowance (CHAT_DAILY_TOKENS does not apply to them);
    `chat_id`: base CHAT_DAILY_TOKENS on that chat alone (`--chat`)."""
    chat = _suggest_chat(use, chat_daily_tokens, own_allowances, chat_id)
    bot = _suggest_bot(use, daily_tokens)
    lines = [chat.line, bot.line]
    apply = [f"{s.setting}={s.suggested}" for s in (chat, bot) if s.suggested is not None]
    if apply:
        lines.append(f"apply without a restart: crewbot config set {' '.join(apply)}")
    return AllowanceAdvice(chat, bot, lines)


def suggestions_json(advice: AllowanceAdvice) -> dict[str, object]:
    def one(s: AllowanceSuggestion) -> dict[str, object]:
        return {
            "current": s.current,
            "suggested": s.suggested,
            "p95_day_tokens": s.p95,
            "days": s.days,
            "busiest_chat": s.busiest_chat,
            "reached_current": s.reached,
            "headroom": HEADROOM,
            "line": s.line,
        }

    return {CHAT_SETTING: one(advice.chat), BOT_SETTING: one(advice.bot), "lines": advice.lines}
