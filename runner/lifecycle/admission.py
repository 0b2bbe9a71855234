"""Admission: whether a spawn request may start now, and what a chat is told when it may not.

A request whose turn was aborted, or that was written before the chat's runs were cancelled, never
starts; one over the global or per-chat cap is refused. Counting and deciding happen with no await in
between, so concurrent requests cannot all pass the cap check together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from container.protocol import SpawnRequest
from core.settings import Settings
from core.store.runs import RunStatus, RunStore
from core.store.turns import TurnStatus, TurnStore
from runner.runs.live_runs import LiveRuns


def chat_share(queue_limit: int) -> int:
    """A chat's share of SUBAGENT_QUEUE_LIMIT (half, rounded up; at least one): its runs waiting in the queue, or
    awaiting approval, never fill the queue for every other chat."""
    return max(1, -(-queue_limit // 2))


@dataclass(frozen=True, slots=True)
class Decision:
    status: RunStatus | None  # None: start it; else the final status it is recorded with
    reason: str | None = None


async def record_request(
    runs: RunStore,
    chat_id: int,
    request: SpawnRequest,
    label: str,
    status: RunStatus,
    *,
    reason: str | None = None,
    needs_approval: bool = False,
) -> None:
    """Every picked-up request becomes one run record, with the status admission gave it."""
    await runs.create(
        request.request_id,
        chat_id=chat_id,
        turn_id=request.turn_id,
        task=request.task,
        label=label,
        include_context=request.include_context,
        status=status,
        error=reason,
        files=request.files,
        needs_approval=needs_approval,
    )


class Admission:
    def __init__(self, settings: Settings, *, turns: TurnStore, live: LiveRuns) -> None:
        self._settings = settings
        self._turns = turns
        self._live = live
        self._chat_cancel_before: dict[int, float] = {}

    def chat_cancelled(self, chat_id: int) -> None:
        """Requests of the chat written before now are not started (`/cancel all`, `/stop`)."""
        self._chat_cancel_before[chat_id] = time.time()

    async def cancelled_before_pickup(self, chat_id: int, request: SpawnRequest, picked_up_at: float) -> Decision:
        if request.turn_id is not None and await self._turns.status(request.turn_id) is TurnStatus.ABORTED:
            return Decision(RunStatus.CANCELLED, "its turn was aborted before the request was picked up")
        cutoff = self._chat_cancel_before.get(chat_id)
        # The file's own time is believed only up to when we saw it: a time in the future cannot dodge a cancel.
        written = min(request.created_at, picked_up_at)
        if cutoff is not None and written <= cutoff:
            return Decision(RunStatus.CANCELLED, "the chat's runs were cancelled before the request was picked up")
        return Decision(None)

    def over_cap(self, chat_id: int) -> Decision:
        """Synchronous on purpose: the caller reserves the slot before it awaits anything."""
        running_total, running_chat = self._live.count(), self._live.count(chat_id)
        limit = self._settings.max_concurrent_subagents
        if running_total >= limit:
            return Decision(RunStatus.REJECTED, f"{running_total} of {limit} running")
        if running_chat >= self._settings.max_subagents_per_chat:
            return Decision(RunStatus.REJECTED, f"{running_chat} running in this chat")
        return Decision(None)

    def reject_text(self, chat_id: int, count: int) -> str:
        template = self._settings.subagent_reject_message
        values = {
            "running": self._live.count(),
            "limit": self._settings.max_concurrent_subagents,
            "chat_running": self._live.count(chat_id),
            "chat_limit": self._settings.max_subagents_per_chat,
            "count": count,
            "not_started": "your task was" if count == 1 else f"{count} tasks were",
        }
        try:
            return template.format(**values)
        except (KeyError, IndexError, ValueError):
            return template
