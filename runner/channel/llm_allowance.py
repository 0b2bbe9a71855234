"""A subagent's LLM calls against the daily allowances (core/allowances.py): the LLM proxy's allowance step.

Every call the proxy forwards for a run (a model step the host makes on the run's socket, or a request of the
container's own) is spent by the run's `Payer`: its chat, as a scheduled task's work or a turn's. Before it is
forwarded it holds a reservation of its estimate, meant as an upper bound of its use (what the allowances'
rule needs): a token per byte of its body, as for the main agent's calls (bot/agent/metered.py), plus the output cap
the policy gave it, at most what is left. While its chat or the whole bot has nothing left it is refused, 429
`daily_allowance` with the reason the agent sees (the SDKs are told not to retry it), and the run is stopped
through `on_spent`, once. When the call is over it settles to the usage the provider reported; an answer that
reported none is counted estimated (input from the request's size, output from the answer's, at most its cap);
a call that got no answer (a provider error, a time-out, a run closed first) releases its hold, counting nothing.

The run's own budget (runner/channel/llm_budget.py, SUBAGENT_MAX_TOKENS, which holds size / 4) applies as well.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from core.allowances import Allowances, AllowanceSpent, Reservation, tokens_of_bytes
from core.logging import get_logger
from core.store.spend import SpendKind, run_spend_kind
from runner.channel.llm_upstream import Call
from runner.channel.proxy_error import ProxyError

log = get_logger(__name__)

ALLOWANCE_ERROR = "daily_allowance"


@dataclass(frozen=True, slots=True)
class Payer:
    """Whose allowance a run's calls spend: its chat's, as this kind of work."""

    chat_id: int
    kind: SpendKind

    @classmethod
    def of_run(cls, chat_id: int, turn_id: str | None) -> Payer:
        return cls(chat_id, run_spend_kind(turn_id))


class TokenCounter(Protocol):
    def count_llm_tokens(self, kind: SpendKind, input_tokens: int, output_tokens: int) -> None:
        """One settled call's tokens, for the metrics."""


SpentCallback = Callable[[str, str], None]  # (run_id, reason): the run is stopped with the reason; must not block


class AllowanceRefused(ProxyError):
    """The call is not admitted: no allowance is left (429, which the SDKs are told not to retry: it would only
    be refused again), or none could be reserved (503: the store failed)."""

    def response(self) -> web.Response:
        answer = super().response()
        if self.error_type == ALLOWANCE_ERROR:
            answer.headers["x-should-retry"] = "false"
        return answer


class ProxyAllowance:
    """The allowance step of every call of the proxy; without `allowances`, calls are only counted."""

    def __init__(
        self,
        allowances: Allowances | None = None,
        *,
        counter: TokenCounter | None = None,
        on_spent: SpentCallback | None = None,
    ) -> None:
        self._allowances = allowances
        self._counter = counter
        self._on_spent = on_spent
        self._told: set[str] = set()  # runs whose stop was asked for

    @asynccontextmanager
    async def call(
        self, run_id: str, payer: Payer | None, body_bytes: int, output_cap: int, media_tokens: int = 0
    ) -> AsyncIterator[Call]:
        """Around one forwarded call of a body of `body_bytes` (with images that may cost `media_tokens` beyond their
        bytes): reserves first (AllowanceRefused when nothing is left), and settles or releases when the body is
        done with the `Call` it fills, however it ends."""
        call = Call()
        if payer is None:  # a socket opened without its chat (tests of the proxy alone)
            yield call
            return
        input_hold = max(1, tokens_of_bytes(body_bytes) + media_tokens)
        reservation = await self._reserve(run_id, payer, input_hold + output_cap)
        try:
            yield call
        finally:
            # Shielded: a handler cancelled meanwhile (the run closed, the container hung up) still settles.
            await asyncio.shield(self._settle(run_id, payer, reservation, call, input_hold, output_cap))

    def forget(self, run_id: str) -> None:
        self._told.discard(run_id)

    async def _reserve(self, run_id: str, payer: Payer, estimate: int) -> Reservation | None:
        if self._allowances is None:
            return None
        try:
            return await self._allowances.reserve(payer.chat_id, payer.kind, estimate)
        except AllowanceSpent as exc:
            reason = str(exc)
            if run_id not in self._told and self._on_spent is not None:
                self._told.add(run_id)
                self._on_spent(run_id, reason)
            message = f"{reason}: no more LLM calls today; finish with what you have"
            raise AllowanceRefused(429, ALLOWANCE_ERROR, message) from None
        except Exception:
            # Not admitted unchecked: the allowances are enforced before spending, or not at all.
            log.exception("llm_allowance_unavailable", run_id=run_id, chat_id=payer.chat_id)
            raise AllowanceRefused(503, "allowance_unavailable", "the daily allowance could not be checked") from None

    async def _settle(
        self, run_id: str, payer: Payer, reservation: Reservation | None, call: Call, input_hold: int, output_cap: int
    ) -> None:
        usage = call.usage
        if usage.reported:
            spent = (usage.input_tokens, usage.output_tokens)
        elif call.answered:
            spent = (input_hold, min(output_cap, tokens_of_bytes(call.answer_bytes)))
            log.warning("llm_usage_estimated", run_id=run_id, input_tokens=spent[0], output_tokens=spent[1])
        else:
            spent = (0, 0)  # no answer: nothing to count, and its hold is freed
        try:
            if reservation is not None and self._allowances is not None:
                if usage.reported or call.answered:
                    await self._allowances.settle(reservation, *spent, estimated=not usage.reported)
                else:
                    await self._allowances.release(reservation)
        except Exception:
            # Bookkeeping must not turn a good answer into an error; the log keeps the numbers.
            log.exception("llm_spend_not_recorded", run_id=run_id, input_tokens=spent[0], output_tokens=spent[1])
            return
        if self._counter is not None and any(spent):
            self._counter.count_llm_tokens(payer.kind, *spent)
