"""A run's token budget before a call is forwarded: how much of it the call's input may hold."""

from __future__ import annotations

from runner.llm_upstream import ProxyError

# A request's input tokens, estimated from its size before it is sent (about 4 bytes of JSON a token).
BODY_BYTES_PER_TOKEN = 4


class BudgetSpent(ProxyError):
    """The run's budget is used up (or this request alone would go over it): the run ends."""


def input_hold(max_tokens: int, spent: int, reserved: int, body_bytes: int) -> int:
    """The tokens to hold for a call's input against what is left of the budget, so parallel calls cannot
    each spend a whole remaining budget on their prompts. Raises BudgetSpent, or a 429 to retry later."""
    estimate = max(1, body_bytes // BODY_BYTES_PER_TOKEN)
    spent_left = max_tokens - spent
    if spent_left <= 0 or (reserved == 0 and estimate >= spent_left):
        raise BudgetSpent(
            429,
            "run_token_budget",
            f"this run has used its token budget (SUBAGENT_MAX_TOKENS={max_tokens}), or this "
            "request alone would go over it",
        )
    if estimate >= spent_left - reserved:
        # Not exhausted: the calls in flight may well spend less than they may. The SDKs retry a 429.
        raise ProxyError(
            429,
            "run_token_budget_in_flight",
            "the rest of this run's token budget (SUBAGENT_MAX_TOKENS) is held by its LLM calls in flight; "
            "retry when they have finished",
        )
    return estimate
