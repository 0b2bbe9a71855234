"""Announce mode (SUBAGENT_RESULT_MODE=announce): a finished run's result goes to the main agent as a new
turn instead of straight to the chat; the agent writes the chat's message in its own voice, or answers
with SKIP_MARKER and nothing is sent. The raw result is stored as `[Subagent]` either way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from core.logging import get_logger
from core.store.announcements import AnnouncementStore
from core.store.runs import FINAL_STATUSES, RunRecord, RunStatus, RunStore

log = get_logger(__name__)

SKIP_MARKER = "[skip]"  # the main agent's whole answer when the chat need not hear of a result
MAX_ANNOUNCED_CHARS = 4_000  # of a result, in the turn's prompt (the stored [Subagent] message has it whole)
# Cancelled and refused runs store no result message: the chat asked for them to stop or was told already.
SILENT_STATUSES = frozenset({RunStatus.CANCELLED, RunStatus.REJECTED})


def announcement(run: RunRecord) -> str:
    """What the main agent is told of one finished run: status, result or error, usage."""
    body = run.result if run.status == RunStatus.COMPLETED else run.error
    tokens = run.input_tokens + run.output_tokens
    return (
        f"- run {run.id} ({run.label}): {run.status}, {tokens:,} tokens, {run.llm_requests} LLM requests.\n"
        f"  {'Result' if run.status == RunStatus.COMPLETED else 'Reason'}: {(body or '')[:MAX_ANNOUNCED_CHARS]}"
    )


class Announcer:
    """Fed by the run store's watcher; `take(chat_id)` gives a turn the chat's finished runs, once. What
    waits is also marked in the store, so a restart hands it over (`restore`) instead of losing it."""

    def __init__(self, runs: RunStore, pending: AnnouncementStore, notify: Callable[[int], None]) -> None:
        self._runs = runs
        self._store = pending
        self._notify = notify  # starts a turn for the chat (the engine)
        self._pending: dict[int, list[RunRecord]] = {}
        self._lookups: set[asyncio.Task[None]] = set()

    def run_changed(self, run_id: str) -> None:
        task = asyncio.create_task(self._check(run_id), name=f"announce-{run_id}")
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    async def _check(self, run_id: str) -> None:
        run = await self._runs.get(run_id)
        if run is None or run.status not in FINAL_STATUSES or run.status in SILENT_STATUSES:
            return
        if not await self._store.add(run_id):
            return  # already waiting or handed over: the store tells of a run more than once
        log.info("run_result_to_main_agent", run_id=run_id, chat_id=run.chat_id)
        self._pending.setdefault(run.chat_id, []).append(run)
        self._notify(run.chat_id)

    async def restore(self) -> None:
        """At start: results an earlier process had not handed over yet get their turns now."""
        for run in await self._store.pending():
            log.info("run_result_to_main_agent", run_id=run.id, chat_id=run.chat_id, restored=True)
            self._pending.setdefault(run.chat_id, []).append(run)
        for chat_id in list(self._pending):
            self._notify(chat_id)

    async def take(self, chat_id: int) -> str | None:
        """The prompt's part for the chat's runs that finished since its last turn (None: none); from here on
        they are the turn's to tell (a crash during that turn's LLM call loses the announcement only)."""
        runs = self._pending.pop(chat_id, [])
        if not runs:
            return None
        await self._store.done(run.id for run in runs)
        lines = [
            "Subagent runs have finished; the chat has not been told yet. Tell it the outcome in your own words,",
            f"briefly; if it needs no message at all, answer exactly {SKIP_MARKER}.",
            *(announcement(run) for run in runs),
        ]
        return "\n".join(lines)

    async def close(self) -> None:
        for task in list(self._lookups):
            task.cancel()
        await asyncio.gather(*self._lookups, return_exceptions=True)
