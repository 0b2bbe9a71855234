"""/budget: a chat's LLM use today against its daily allowance (everyone); `/budget set N|default` and
`/budget add N` (chat admins and ADMIN_USER_IDS). Also the 80 % notice's text."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from core.allowances import Allowances, BudgetStatus
from core.setting_bounds import MAX_DAILY_TOKENS
from core.settings import Settings
from core.store.spend import SpendKind, SpendRow

USAGE = "Usage: /budget, /budget set <tokens>|default, or /budget add [tokens] (default: a day's allowance)"
WHO_MAY = "Only chat admins and the bot's operators (ADMIN_USER_IDS) can change this chat's allowance."
_NUMBER = re.compile(r"\d{1,3}(?:[,_]\d{3})*|\d+")
_SUBAGENT_KINDS = frozenset({SpendKind.SUBAGENT, SpendKind.SCHEDULED})
SECONDS_PER_MINUTE = 60.0


def parse_tokens(text: str, *, minimum: int) -> int | None:
    """A whole number of tokens (`250000`, `250,000`, `250_000`) from minimum to MAX_DAILY_TOKENS; None: junk."""
    text = text.strip()
    if len(text) > 40 or not _NUMBER.fullmatch(text):
        return None
    value = int(re.sub(r"[,_]", "", text))
    return value if minimum <= value <= MAX_DAILY_TOKENS else None


def cost(rows: Sequence[SpendRow], settings: Settings) -> float:
    """What the rows cost at the prices set (per million tokens); subagents' default to the main model's."""
    total = 0.0
    for row in rows:
        if row.kind is SpendKind.SPEECH:  # priced by the minute of audio, whatever tokens it was counted as
            total += row.spend.audio_seconds / SECONDS_PER_MINUTE * settings.stt_price_per_minute
            continue
        price_in, price_out = settings.llm_price_input_per_mtok, settings.llm_price_output_per_mtok
        if row.kind in _SUBAGENT_KINDS:
            if settings.subagent_price_input_per_mtok is not None:
                price_in = settings.subagent_price_input_per_mtok
            if settings.subagent_price_output_per_mtok is not None:
                price_out = settings.subagent_price_output_per_mtok
        total += (row.spend.input_tokens * price_in + row.spend.output_tokens * price_out) / 1_000_000
    return total


def priced(settings: Settings) -> bool:
    prices = (
        settings.llm_price_input_per_mtok,
        settings.llm_price_output_per_mtok,
        settings.subagent_price_input_per_mtok,
        settings.subagent_price_output_per_mtok,
        settings.stt_price_per_minute,
    )
    return any(price for price in prices)


def speech_line(rows: Sequence[SpendRow]) -> str | None:
    """`Speech to text: 2 call(s), 0:45 of audio.`; None when nothing was transcribed."""
    speech = [row.spend for row in rows if row.kind is SpendKind.SPEECH]
    if not speech:
        return None
    seconds = round(sum(spend.audio_seconds for spend in speech))
    calls = sum(spend.calls for spend in speech)
    return f"Speech to text: {calls:,} call(s), {seconds // 60}:{seconds % 60:02} of audio."


def money(amount: float) -> str:
    return f"{amount:,.4f}" if 0 < amount < 1 else f"{amount:,.2f}"


def _share(used: int, allowance: int) -> str:
    return f"{min(999, used * 100 // allowance)} %"


class BudgetCommand:
    def __init__(self, allowances: Allowances, settings: Settings) -> None:
        self._allowances = allowances
        self._settings = settings  # live: prices and allowances change on the running bot

    def _resets(self, status: BudgetStatus) -> str:
        at = datetime.fromtimestamp(status.resets_at, self._allowances.zone).strftime("%H:%M")
        return f"{at} ({self._settings.timezone})"

    def notice_text(self, status: BudgetStatus) -> str:
        """The chat is told once a day when its use passes 80 % of its allowance."""
        return (
            f"This chat has used {status.used:,} of its {status.allowance:,} LLM tokens for today "
            f"({_share(status.used, status.allowance)}); the allowance resets at {self._resets(status)}. "
            "/budget shows more."
        )

    async def show(self, chat_id: int) -> str:
        status = await self._allowances.status(chat_id)
        rows = await self._allowances.spent_today(chat_id)
        if status.allowance > 0:
            added = f", {status.added:,} of it added today" if status.added else ""
            head = (
                f"Today ({status.day}) this chat used {status.used:,} LLM tokens of its daily allowance of "
                f"{status.allowance:,}{added} ({_share(status.used, status.allowance)})."
            )
        else:
            head = f"Today ({status.day}) this chat used {status.used:,} LLM tokens; it has no daily allowance."
        lines = [head]
        heard = speech_line(rows)
        if heard is not None:
            lines.append(f"{heard} It counts in the tokens above.")
        estimated = sum(row.spend.estimated_calls for row in rows)
        if estimated:
            lines.append(f"{estimated:,} call(s) reported no usage: those are estimated from their size.")
        if priced(self._settings):
            lines.append(f"At the prices set that is about {money(cost(rows, self._settings))}.")
        if status.bot_allowance > 0:
            lines.append(
                f"All chats together: {status.bot_used:,} of the bot's {status.bot_allowance:,} tokens "
                f"({_share(status.bot_used, status.bot_allowance)})."
            )
        lines.append(f"The day resets at {self._resets(status)}.")
        return "\n".join(lines)

    async def reply(
        self, chat_id: int, args: Sequence[str], user_id: int | None, may_change: Callable[[], Awaitable[bool]]
    ) -> str:
        """The answer to `/budget [set N|default | add N]`; `may_change` asks whether the sender is an admin."""
        if not args:
            return await self.show(chat_id)
        action = args[0].lower()
        if (action, len(args)) == ("add", 1):  # a day's top-up: the button under the allowance notice does the same
            if not await may_change():
                return WHO_MAY
            return await self.top_up(chat_id)
        if action not in ("set", "add") or len(args) != 2:
            return USAGE
        if not await may_change():
            return WHO_MAY
        if action == "set":
            return await self._set(chat_id, args[1], user_id)
        return await self._add(chat_id, args[1])

    async def _set(self, chat_id: int, arg: str, user_id: int | None) -> str:
        if arg.lower() == "default":
            await self._allowances.set_allowance(chat_id, None, user_id)
            setting = f"CHAT_DAILY_TOKENS, {self._settings.chat_daily_tokens:,}"
            if self._settings.chat_daily_tokens == 0:
                setting = "CHAT_DAILY_TOKENS: none"
            return f"This chat's daily allowance is the bot's default again ({setting}).\n{await self.show(chat_id)}"
        tokens = parse_tokens(arg, minimum=0)
        if tokens is None:
            return f"Not a number of tokens from 0 to {MAX_DAILY_TOKENS:,}: {arg[:40]}. {USAGE}"
        status = await self._allowances.set_allowance(chat_id, tokens, user_id)
        if tokens == 0:
            return "This chat now has no daily allowance of its own (only the bot's, if set, applies)."
        return f"This chat's daily allowance is now {tokens:,} tokens (today {status.allowance:,} with top-ups)."

    async def top_up(self, chat_id: int) -> str:
        """`/budget add`'s default: one day's allowance more for today."""
        status = await self._allowances.status(chat_id)
        return await self._add(chat_id, str(max(status.allowance - status.added, 1)))

    def top_up_question(self, status: BudgetStatus) -> str:
        """The allowance notice's button's question, for the chat's admins."""
        return f"Admins: add a day's top-up ({status.allowance - status.added:,} tokens) for today?"

    async def _add(self, chat_id: int, arg: str) -> str:
        tokens = parse_tokens(arg, minimum=1)
        if tokens is None:
            return f"Not a number of tokens from 1 to {MAX_DAILY_TOKENS:,}: {arg[:40]}. {USAGE}"
        if (await self._allowances.status(chat_id)).allowance <= 0:
            return "This chat has no daily allowance, so there is nothing to add to. /budget set <tokens> sets one."
        status = await self._allowances.add(chat_id, tokens)
        return (
            f"Added {tokens:,} tokens for today: this chat may use {status.allowance:,} today "
            f"({status.used:,} used); tomorrow its allowance is back to {status.allowance - status.added:,}."
        )
