"""A run's token budget before a call is forwarded: how much of it the call's input may hold, and telling the
manager when a run has used it up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from core.logging import get_logger
from runner.channel.proxy_error import ProxyError

BudgetCallback = Callable[[str], Coroutine[Any, Any, None]]

# A request's input tokens, estimated from its size before it is sent (about 4 bytes of JSON a token).
BODY_BYTES_PER_TOKEN = 4


class BudgetSpent(ProxyError):
    """The run's budget is used up (or this request alone would go over it): the run ends."""


def input_hold(max_tokens: int, spent: int, reserved: int, body_bytes: int, media_tokens: int = 0) -> int:
    """The tokens to hold for a call's input (its size, and what its images may cost beyond their bytes) against
    what is left of the budget, so parallel calls cannot each spend a whole remaining budget on their prompts.
    Raises BudgetSpent, or a 429 to retry later."""
    estimate = max(1, body_bytes // BODY_BYTES_PER_TOKEN + media_tokens)
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


class BudgetNotices:
    """Tells `on_budget_exhausted` (the manager, which ends the run) in a task of its own, so the refused call
    is answered at once; `close` ends the notices still under way."""

    def __init__(self, on_budget_exhausted: BudgetCallback | None) -> None:
        self._callback = on_budget_exhausted
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = get_logger("runner.channel.llm_proxy")

    def tell(self, run_id: str) -> None:
        if self._callback is None:
            return
        task = asyncio.create_task(self._tell(self._callback, run_id), name=f"budget-{run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell(self, callback: BudgetCallback, run_id: str) -> None:
        try:
            await callback(run_id)
        except Exception:
            # Nobody awaits this task: without the log a run that was not stopped would go unexplained.
            self._log.exception("budget_exhausted_callback_failed", run_id=run_id)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()  # shutting down: every run stops anyway
        await asyncio.gather(*self._tasks, return_exceptions=True)
