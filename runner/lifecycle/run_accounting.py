"""What the manager tells the store and the metrics at a run's milestones: given its files, started, a file
sent, stopped, ended.

Kept apart from the manager so its lifecycle reads as a lifecycle: queue wait and start latency when the
container starts, resource figures (runner/runtimes/resource_use.py) and cancel latency once it has stopped, the
outcome and duration once the run is over.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from core.logging import get_logger
from core.store.run_files import Direction, GivenFile
from core.store.runs import FINAL_STATUSES, RunRecord, RunStatus, RunStore
from runner.lifecycle.metrics import CapKind, RunMetrics
from runner.runs.live_runs import LiveRun

log = get_logger(__name__)


class RunAccounting:
    def __init__(self, runs: RunStore, metrics: RunMetrics) -> None:
        self._runs = runs
        self._metrics = metrics

    @property
    def metrics(self) -> RunMetrics:
        return self._metrics

    async def record_usage(self, run_id: str, input_tokens: int, output_tokens: int, requests: int) -> None:
        """The LLM proxy's usage sink: the run's record and the token counter."""
        await self._runs.record_usage(run_id, input_tokens, output_tokens, requests)
        self._metrics.count_tokens(input_tokens, output_tokens)

    def not_started(self, status: RunStatus, reason: str | None) -> None:
        """A request recorded with a final status at once (refused by a cap, or cancelled before pickup)."""
        self._metrics.runs.labels(outcome=status.value).inc()
        if status is RunStatus.REJECTED:
            cap = CapKind.CHAT if reason is not None and "this chat" in reason else CapKind.GLOBAL
            self._metrics.refusals.labels(cap=cap).inc()

    def files_given(self, files: Sequence[GivenFile]) -> None:
        """A run starts with these chat files (counted once: a run re-attached after a restart is not)."""
        if files:
            self._metrics.count_files(Direction.IN, len(files), sum(f.size_bytes for f in files))

    def file_sent(self, size_bytes: int) -> None:
        """A file a run sent was accepted and is owed to the chat (a retry of it is not counted again)."""
        self._metrics.count_files(Direction.OUT, 1, size_bytes)

    async def started(self, live: LiveRun, container_id: str, marked_running_at: float) -> None:
        live.container_started_at = time.time()
        await self._runs.set_container(live.id, container_id, live.container_started_at)
        if live.created_at is not None:
            self._metrics.queue_wait.observe(max(marked_running_at - live.created_at, 0.0))
        self._metrics.start_latency.observe(max(live.container_started_at - marked_running_at, 0.0))

    async def stopped(self, live: LiveRun) -> None:
        """Its container has exited or been stopped: keep what it used."""
        if live.cancel_monotonic is not None:
            self._metrics.cancel_latency.observe(max(time.monotonic() - live.cancel_monotonic, 0.0))
        usage = live.usage
        try:
            await self._runs.record_resources(
                live.id, memory_peak_bytes=usage.memory_peak_bytes, cpu_seconds=usage.cpu_seconds, samples=usage.samples
            )
        except Exception:  # figures must never cost a run its outcome
            log.exception("run_resources_not_recorded", run_id=live.id)
            return
        if usage.memory_peak_bytes is not None:
            self._metrics.memory_peak.observe(usage.memory_peak_bytes)
        if usage.cpu_seconds is not None:
            self._metrics.cpu.observe(usage.cpu_seconds)

    async def ended(self, live: LiveRun) -> None:
        """Its outcome is recorded (by whichever path came first): count it once, here."""
        record: RunRecord | None = await self._runs.get(live.id)
        if record is None or record.status not in FINAL_STATUSES:
            return
        self._metrics.runs.labels(outcome=record.status.value).inc()
        if record.started_at is not None and record.finished_at is not None:
            self._metrics.duration.observe(max(record.finished_at - record.started_at, 0.0))
