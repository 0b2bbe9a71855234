"""A subagent run as the chat side sees it: what a listing shows of one, how its age reads, and the cancels
the subagent side's task manager implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.store.runs import FINAL_STATUSES, RunStatus


@dataclass(frozen=True, slots=True)
class RunSummary:
    id: str
    label: str
    status: str
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None


class RunInfo(Protocol):
    """What /subagents shows of a run; the run store's records and `RunSummary` both have it."""

    @property
    def id(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def created_at(self) -> float: ...

    @property
    def started_at(self) -> float | None: ...

    @property
    def finished_at(self) -> float | None: ...


class RunCancels(Protocol):
    """Owned by the chat side, implemented by the subagent side's task manager."""

    async def cancel_run(self, chat_id: int, run_id: str) -> RunStatus | None:
        """`cancelled`, or the final status the run had already reached; None: the chat has no such run."""

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        """Cancel every live run of the chat (and its pending requests); the number cancelled."""

    async def cancel_turn(self, turn_id: str, reason: str) -> int: ...


def age_text(seconds: float) -> str:
    """A short age: 42s, 7m, 3h."""
    seconds = max(0, int(seconds))
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def when_text(run: RunInfo, now: float) -> str:
    """A live run's age keeps growing; a finished one shows when it ended (unknown: nothing)."""
    if run.status in FINAL_STATUSES:
        return f"{age_text(now - run.finished_at)} ago" if run.finished_at is not None else ""
    return f"for {age_text(now - (run.started_at or run.created_at))}"
