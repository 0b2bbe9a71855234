"""The loop-lag probe and its statistics: how late a sleeping task wakes up, and which collections ran.

A probe task sleeps PROBE_INTERVAL_SECONDS in a loop and records how late each wake-up is (its gap); a
window's figures are its longest gap and its p99 gap. Python's collections are timed through
`gc.callbacks`, so a gap can be told apart from a full (generation-2) collection that caused it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import ms

PROBE_INTERVAL_SECONDS = 0.005
TAIL_SECONDS = 0.3  # each window goes on this long after its work is done (deferred work shows up too)


class LagProbe:
    """Sleeps `interval` in a loop; each wake-up's lateness is a gap, kept with when it woke."""

    def __init__(self, interval: float = PROBE_INTERVAL_SECONDS) -> None:
        self._interval = interval
        self.samples: list[tuple[float, float]] = []  # (woke at, gap): time.monotonic, the helpers' clock too
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        interval = self._interval
        while True:
            before = time.monotonic()
            await asyncio.sleep(interval)
            woke = time.monotonic()
            self.samples.append((woke, woke - before - interval))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass(frozen=True, slots=True)
class GcPause:
    start: float
    stop: float
    generation: int

    @property
    def seconds(self) -> float:
        return self.stop - self.start


class GcRecorder:
    """Times every collection through `gc.callbacks` (called in whichever thread triggered it)."""

    def __init__(self) -> None:
        self.pauses: list[GcPause] = []
        self._started: tuple[float, int] | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._started = (now, info["generation"])
        elif self._started is not None:
            self.pauses.append(GcPause(self._started[0], now, self._started[1]))
            self._started = None

    def __enter__(self) -> GcRecorder:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)

    def between(self, start: float, stop: float) -> list[GcPause]:
        return [p for p in self.pauses if p.stop > start and p.start < stop]


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


@dataclass(slots=True)
class Window:
    """One measured stretch: the probe's gaps and the collections within it."""

    name: str
    seconds: float
    gaps: list[tuple[float, float]]
    pauses: list[GcPause]
    facts: dict[str, float | int | str] = field(default_factory=dict)
    phases: list[tuple[str, float]] = field(default_factory=list)  # (name, when it began), in order

    def longest_gap_phase(self) -> str:
        """The phase of the work in which the longest gap began: when that wake-up was due."""
        woke, gap = max(self.gaps, key=lambda sample: sample[1])
        due = woke - gap
        found = ""
        for name, began in self.phases:
            if due >= began:
                found = name
        return found

    @property
    def max_ms(self) -> float:
        return ms(max(gap for _, gap in self.gaps))

    @property
    def p99_ms(self) -> float:
        return ms(nearest_rank([gap for _, gap in self.gaps], 0.99))

    @property
    def longest_gc_ms(self) -> float:
        return ms(max((p.seconds for p in self.pauses), default=0.0))

    @property
    def longest_gen2_ms(self) -> float:
        return ms(max((p.seconds for p in self.pauses if p.generation == 2), default=0.0))

    @property
    def gen2_count(self) -> int:
        return sum(1 for p in self.pauses if p.generation == 2)

    def gc_in_longest_gap_ms(self) -> float:
        """How much of the longest gap was spent collecting (any generation, any thread)."""
        woke, gap = max(self.gaps, key=lambda sample: sample[1])
        start = woke - gap - PROBE_INTERVAL_SECONDS
        return ms(sum(max(0.0, min(p.stop, woke) - max(p.start, start)) for p in self.pauses))

    def summary(self) -> dict[str, float | int | str]:
        return {
            "seconds": round(self.seconds, 3),
            "max_ms": round(self.max_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "wakeups": len(self.gaps),
            "longest_gc_ms": round(self.longest_gc_ms, 3),
            "gen2_collections": self.gen2_count,
            "longest_gen2_ms": round(self.longest_gen2_ms, 3),
            "gc_in_longest_gap_ms": round(self.gc_in_longest_gap_ms(), 3),
            **self.facts,
        }


Work = Callable[[], Awaitable[tuple[dict[str, Any], list[tuple[str, float]]]]]


async def measured(name: str, recorder: GcRecorder, work: Work) -> Window:
    """Run `work` with the probe on, then TAIL_SECONDS more; `work` returns facts and its phases."""
    probe = LagProbe()
    probe.start()
    started = time.monotonic()
    try:
        facts, phases = await work()
        tail = time.monotonic()
        await asyncio.sleep(TAIL_SECONDS)
    finally:
        await probe.stop()
    ended = time.monotonic()
    if not probe.samples:
        raise RuntimeError(f"the probe never woke during {name}")
    phases = [("start", started), *phases, ("tail", tail)]
    return Window(name, ended - started, probe.samples, recorder.between(started, ended), facts, phases)
