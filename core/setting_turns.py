"""Main-agent turns at once, all chats together (MAX_CONCURRENT_TURNS). `Settings` takes this field from
`TurnSettings`, and the rest from `QuestionSettings` below it."""

from __future__ import annotations

from pydantic import Field

from core.setting_questions import QuestionSettings

# A burst of chats answered together holds every turn's prompt, model run and growing answer at once; a bound
# keeps that (and the LLM requests in flight) small on a 2-core host, at the price of a wait that only a burst
# meets: each turn is mostly waiting on the LLM and Telegram (docs/performance.md, "Host memory").
DEFAULT_MAX_CONCURRENT_TURNS = 32
MAX_TURNS_CEILING = 1000


class TurnSettings(QuestionSettings):
    max_concurrent_turns: int = Field(
        default=DEFAULT_MAX_CONCURRENT_TURNS, ge=1, le=MAX_TURNS_CEILING, alias="MAX_CONCURRENT_TURNS"
    )
