"""A human in the loop (SUBAGENT_ASK_TIMEOUT_SECONDS, SUBAGENT_MAX_QUESTIONS, SUBAGENT_APPROVAL): how long a
subagent's question to the chat waits, how many one run may ask, and whether a run needs an admin's OK before
it starts. `Settings` takes these fields from `QuestionSettings`, and the rest from `MemorySettings` below it."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from core.setting_memory import MemorySettings

MIN_ASK_TIMEOUT_SECONDS = 1.0
MAX_ASK_TIMEOUT_SECONDS = 24 * 3600.0  # the run's own time limit bounds the wait anyway
MAX_QUESTIONS_CEILING = 100


class ApprovalMode(StrEnum):
    OFF = "off"  # a spawned run starts as soon as the caps allow
    ADMINS = "admins"  # it waits on the status card for a chat admin's (or ADMIN_USER_IDS') Approve


class QuestionSettings(MemorySettings):
    # ask_chat and SUBAGENT_EGRESS=ask: a question unanswered this long is answered "no answer" (a deny).
    subagent_ask_timeout_seconds: float = Field(
        default=300.0,
        ge=MIN_ASK_TIMEOUT_SECONDS,
        le=MAX_ASK_TIMEOUT_SECONDS,
        allow_inf_nan=False,
        alias="SUBAGENT_ASK_TIMEOUT_SECONDS",
    )
    subagent_max_questions: int = Field(default=5, ge=0, le=MAX_QUESTIONS_CEILING, alias="SUBAGENT_MAX_QUESTIONS")
    subagent_approval: ApprovalMode = Field(default=ApprovalMode.OFF, alias="SUBAGENT_APPROVAL")
