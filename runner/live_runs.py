"""The runs that hold a slot right now: the caps count them and the LLM proxy's gate asks them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(slots=True)
class LiveRun:
    id: str
    chat_id: int
    turn_id: str | None
    label: str
    cancelled: bool = False
    released: bool = False
    container_id: str | None = None
    started_monotonic: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class LiveRuns:
    """In memory only: after a restart, recovery rebuilds it from the store and the engine."""

    def __init__(self) -> None:
        self._runs: dict[str, LiveRun] = {}

    def add(self, run: LiveRun) -> None:
        self._runs[run.id] = run

    def get(self, run_id: str) -> LiveRun | None:
        return self._runs.get(run_id)

    def discard(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def all(self) -> list[LiveRun]:
        return list(self._runs.values())

    def is_live(self, run_id: str) -> bool:
        """The proxy's gate: a queued or running run that was not cancelled may call the LLM."""
        run = self._runs.get(run_id)
        return run is not None and not run.cancelled

    def count(self, chat_id: int | None = None) -> int:
        """Runs holding a slot; a cancelled run gives its slot back at once."""
        return sum(1 for r in self._runs.values() if not r.cancelled and (chat_id is None or r.chat_id == chat_id))
