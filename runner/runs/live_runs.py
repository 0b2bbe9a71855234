"""The runs that hold a slot right now: the caps count them and the run channel's gate asks them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from container.protocol import RunResult
from runner.runtimes.resource_use import ResourceUse


class RunReport(Protocol):
    """What the run's end of its channel (runner/channel/run_endpoint.py's RunInbox) holds for its lifecycle:
    the session it started from, and what it reported, once it has."""

    session_in: str | None
    result_received: RunResult | None
    session_json: bytes | None
    reported: asyncio.Event
    workspace_asked: asyncio.Event  # its agent asked for its workspace: a synced run's agent is alive


class StopReason(StrEnum):
    """Why the manager stops a container before it exits by itself."""

    CANCELLED = "cancelled"
    TIME_LIMIT = "time_limit"
    TOKEN_BUDGET = "token_budget"
    WORKSPACE_QUOTA = "workspace_quota"
    LINGERING = "lingering"  # it reported its result but did not exit
    INVALID_REQUESTS = "invalid_requests"  # its channel requests were refused as invalid too often
    DAILY_ALLOWANCE = "daily_allowance"  # its chat's (or the bot's) daily allowance of LLM tokens is used up


@dataclass(slots=True)
class LiveRun:
    id: str
    chat_id: int
    turn_id: str | None
    label: str
    cancelled: bool = False
    released: bool = False  # its outcome is recorded and its typing released
    typing_released: bool = False  # its hold on the chat's typing is gone: at its result, or when released
    # Its reported result is recorded and sent; it is released once its container has exited.
    result_recorded: bool = False
    # Its container is confirmed gone or stopped (or it never had one): only then is its slot free.
    stopped: bool = False
    recovering: bool = False  # recorded live by an earlier process; recovery has not reconciled it yet
    container_id: str | None = None
    started_monotonic: float | None = None
    created_at: float | None = None  # unix seconds the request became a run (queue wait counts from here)
    container_started_at: float | None = None  # unix seconds the engine's start returned
    cancel_monotonic: float | None = None  # when a cancel was asked (cancel latency counts from here)
    usage: ResourceUse = field(default_factory=ResourceUse, repr=False)
    stop_reason: StopReason | None = None
    stop_detail: str | None = None  # what the stop's reason says beyond its kind (whose allowance, when it resets)
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    inbox: RunReport | None = field(default=None, repr=False)
    # Follow-ups from the chat (the main agent's `send`): the LLM proxy adds them to each later LLM request.
    followups: list[str] = field(default_factory=list, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # The engine's first kill of its container, shared by whoever stops it (runner/lifecycle/supervisor.py).
    kill_task: asyncio.Task[None] | None = field(default=None, repr=False)

    def request_stop(self, reason: StopReason, detail: str | None = None) -> None:
        """The first reason wins: a cancel racing a time-out ends as the one that came first."""
        if self.stop_reason is None:
            self.stop_reason, self.stop_detail = reason, detail
        self.stop_requested.set()


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
        """The channel's gate: a queued or running run that was not cancelled and has no outcome yet."""
        run = self._runs.get(run_id)
        return run is not None and not run.cancelled and not run.released

    def followups(self, run_id: str) -> list[str]:
        run = self._runs.get(run_id)
        return list(run.followups) if run is not None else []

    def hold(self, run_id: str, chat_id: int, turn_id: str | None, label: str) -> None:
        """A run an earlier process left live: it counts against the caps, and can be cancelled, until
        recovery reconciles it with the engine (which may be down at start)."""
        if run_id not in self._runs:
            self._runs[run_id] = LiveRun(id=run_id, chat_id=chat_id, turn_id=turn_id, label=label, recovering=True)

    def is_own(self, run_id: str) -> bool:
        """True for a run this process supervises (started or re-attached here), not one on hold."""
        run = self._runs.get(run_id)
        return run is not None and not run.recovering

    def release_holds(self) -> None:
        """After recovery: runs still on hold had no container and no live record (cancelled meanwhile)."""
        for run in list(self._runs.values()):
            if run.recovering:
                del self._runs[run.id]

    def queued(self) -> int:
        """Runs accepted whose container has not started yet (status `queued`)."""
        return sum(1 for r in self._runs.values() if not r.stopped and not r.recovering and r.container_id is None)

    def running(self) -> int:
        """Runs whose container has started and is not confirmed stopped."""
        return sum(1 for r in self._runs.values() if not r.stopped and r.container_id is not None)

    def count(self, chat_id: int | None = None) -> int:
        """Runs holding a slot: a cancelled run holds it until its container is confirmed stopped."""
        return sum(1 for r in self._runs.values() if not r.stopped and (chat_id is None or r.chat_id == chat_id))
