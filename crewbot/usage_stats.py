"""The arithmetic of `crewbot stats`: what runs did over a period, from their records alone.

Definitions (the run queue keeps them): queue wait = run start minus request creation; a run is
*queued* from its request's creation until it starts (or ends without starting), *running* from its
start until its outcome. Concurrency and queue length over time are step functions of those intervals;
"at the cap" means running >= the MAX_CONCURRENT_SUBAGENTS in force at that moment (live changes included).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.store.egress import EgressTotals
from core.store.run_files import FileTotals
from core.store.runs import RunRecord, RunStatus

CapAt = Callable[[float], int]  # the MAX_CONCURRENT_SUBAGENTS in force at a moment


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear interpolation between the closest ranks (as numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class Spread:
    p50: float | None
    p95: float | None
    known: int  # values behind the percentiles
    unknown: int  # runs for which the figure is not known

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        known = [v for v in values if v is not None]
        return cls(percentile(known, 0.5), percentile(known, 0.95), len(known), len(values) - len(known))


@dataclass(frozen=True, slots=True)
class Step:
    """From `at` on (until the next step): this many running and queued, under this cap."""

    at: float
    running: int
    queued: int
    cap: int


@dataclass(frozen=True, slots=True)
class UsageStats:
    start: float
    end: float
    requests: int
    by_outcome: dict[str, int]
    refusals: int
    waited: int  # runs that started after waiting longer than the noticeable wait
    queue_wait_seconds: Spread
    start_latency_seconds: Spread  # run start -> the engine's container start returned
    duration_seconds: Spread
    memory_peak_bytes: Spread
    cpu_seconds: Spread
    cpu_cores: Spread  # CPU time / run duration: how many cores a run kept busy on average
    share_at_cap: float  # of the period's time, how much had running >= cap
    peak_running: int
    peak_queued: int
    peak_wanted: int  # running + queued + refused requests (each counted for the median run's duration)
    tokens_by_chat: dict[int, int]
    timeline: list[Step] = field(repr=False)
    files: FileTotals = field(
        default_factory=FileTotals
    )  # files and bytes runs were given (in) and sent (out) in the period
    egress: EgressTotals = field(default_factory=EgressTotals)  # the runs' connections through the door, and bytes


NOTICEABLE_WAIT_SECONDS = 5.0  # a queue wait longer than this counts as "had to wait"


def _run_interval(record: RunRecord, now: float) -> tuple[float, float] | None:
    if record.started_at is None:
        return None
    return record.started_at, record.finished_at if record.finished_at is not None else now


def _queue_interval(record: RunRecord, now: float) -> tuple[float, float] | None:
    if record.status is RunStatus.REJECTED:
        return None  # never queued: refused at once
    end = next((at for at in (record.started_at, record.finished_at) if at is not None), now)
    return (record.created_at, end) if end > record.created_at else None


def timeline(
    records: Sequence[RunRecord], start: float, end: float, cap_at: CapAt, cap_changes: Sequence[float] = ()
) -> list[Step]:
    """Running and queued counts (and the cap) at every change within [start, end]."""
    events: list[tuple[float, int, int]] = [(at, 0, 0) for at in cap_changes]  # (time, running, queued deltas)
    for record in records:
        for interval, running in ((_run_interval(record, end), 1), (_queue_interval(record, end), 0)):
            if interval is None:
                continue
            events.append((interval[0], running, 1 - running))
            events.append((interval[1], -running, running - 1))
    steps: list[Step] = []
    running = queued = 0
    for at, d_running, d_queued in sorted(events, key=lambda e: (e[0], e[1] + e[2])):  # ends before starts
        running, queued = running + d_running, queued + d_queued
        clipped = min(max(at, start), end)
        if steps and steps[-1].at == clipped:
            steps[-1] = Step(clipped, running, queued, cap_at(clipped))
        else:
            steps.append(Step(clipped, running, queued, cap_at(clipped)))
    if not steps or steps[0].at > start:
        steps.insert(0, Step(start, 0, 0, cap_at(start)))
    return steps


def _share_at_cap(steps: Sequence[Step], end: float) -> float:
    total = end - steps[0].at if steps else 0.0
    if total <= 0:
        return 0.0
    at_cap = sum(
        (following - step.at)
        for step, following in zip(steps, [s.at for s in steps[1:]] + [end], strict=True)
        if step.running >= step.cap
    )
    return at_cap / total


def _peak_wanted(records: Sequence[RunRecord], end: float, median_duration: float) -> int:
    """Slots wanted at once: running and queued runs, and each refused request as if it had run for the
    median run's duration from when it was made (what it would have needed under a higher cap)."""
    events: list[tuple[float, int]] = []
    for record in records:
        if record.status is RunStatus.REJECTED:
            events += [(record.created_at, 1), (record.created_at + median_duration, -1)]
            continue
        finish = record.finished_at if record.finished_at is not None else end
        if record.started_at is not None or record.status in (RunStatus.QUEUED, RunStatus.RUNNING):
            events += [(record.created_at, 1), (max(finish, record.created_at), -1)]
    wanted = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        wanted += delta
        peak = max(peak, wanted)
    return peak


def compute(
    records: Sequence[RunRecord], start: float, end: float, cap_at: CapAt, cap_changes: Sequence[float] = ()
) -> UsageStats:
    """`cap_changes`: when the cap was changed live (the timeline gets a step there)."""
    waits = [r.started_at - r.created_at for r in records if r.started_at is not None]
    durations = [
        r.finished_at - r.started_at for r in records if r.started_at is not None and r.finished_at is not None
    ]
    ran = [r for r in records if r.started_at is not None]

    def cores(record: RunRecord) -> float | None:
        if record.cpu_seconds is None or record.started_at is None or record.finished_at is None:
            return None
        return record.cpu_seconds / max(record.finished_at - record.started_at, 1e-3)

    tokens: Counter[int] = Counter()
    for record in records:
        tokens[record.chat_id] += record.input_tokens + record.output_tokens
    steps = timeline(records, start, end, cap_at, cap_changes)
    median_duration = percentile(durations, 0.5) or 0.0
    return UsageStats(
        start=start,
        end=end,
        requests=len(records),
        by_outcome=dict(Counter(r.status.value for r in records)),
        refusals=sum(1 for r in records if r.status is RunStatus.REJECTED),
        waited=sum(1 for w in waits if w > NOTICEABLE_WAIT_SECONDS),
        queue_wait_seconds=Spread.of(waits),
        start_latency_seconds=Spread.of(
            [r.container_started_at - r.started_at for r in ran if r.container_started_at and r.started_at]
        ),
        duration_seconds=Spread.of(durations),
        memory_peak_bytes=Spread.of([None if r.memory_peak_bytes is None else float(r.memory_peak_bytes) for r in ran]),
        cpu_seconds=Spread.of([r.cpu_seconds for r in ran]),
        cpu_cores=Spread.of([cores(r) for r in ran]),
        share_at_cap=_share_at_cap(steps, end),
        peak_running=max(s.running for s in steps),
        peak_queued=max(s.queued for s in steps),
        peak_wanted=_peak_wanted(records, end, median_duration),
        tokens_by_chat=dict(tokens),
        timeline=steps,
    )
