"""What runs did through the egress door, recorded: each connection event is counted in the metrics at once
and written to the store in batches (a hostile run may try thousands of connections a second; its writes
must not flood the database), up to MAX_RECORDED_PER_RUN records a run; its totals count every one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from core.logging import get_logger
from core.store.egress import EgressRecord, EgressStore
from runner.egress.records import EgressEvent
from runner.lifecycle.metrics import RunMetrics

log = get_logger(__name__)

MAX_RECORDED_PER_RUN = 500  # connections kept one by one for /subagents and logs; the rest only counted
FLUSH_SECONDS = 1.0  # events are written at most this late (the status card shows them then)


@dataclass(slots=True)
class _RunEvents:
    chat_id: int
    kept: int = 0
    pending: list[EgressRecord] = field(default_factory=list)
    pending_kept: int = 0


class EgressLog:
    def __init__(self, store: EgressStore, metrics: RunMetrics, on_written: Callable[[str], None]) -> None:
        self._store = store
        self._metrics = metrics
        self._on_written = on_written  # a run's totals changed (the status card shows its egress bytes)
        self._runs: dict[str, _RunEvents] = {}
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    def listener(self, run_id: str, chat_id: int) -> Callable[[EgressEvent], None]:
        """What the run's door calls with each connection's event (on the event loop, never blocking)."""
        self._runs.setdefault(run_id, _RunEvents(chat_id=chat_id))
        return lambda event: self._event(run_id, event)

    def _event(self, run_id: str, event: EgressEvent) -> None:
        self._metrics.count_egress(event.allowed, event.bytes_up, event.bytes_down)
        run = self._runs.get(run_id)
        if run is None:
            return  # its door reports after the run was closed: counted in the metrics only
        record = EgressRecord(
            run_id=run_id,
            chat_id=run.chat_id,
            host=event.host,
            port=event.port,
            address=event.address,
            allowed=event.allowed,
            reason=event.reason,
            bytes_up=event.bytes_up,
            bytes_down=event.bytes_down,
            started_at=event.started_at,
            ended_at=event.ended_at,
            lookups=event.lookups,
        )
        run.pending.append(record)
        self._wake.set()

    def start(self) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name="egress-log")

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(FLUSH_SECONDS)  # gathers a burst into one transaction
            self._wake.clear()
            await self.flush()

    async def flush(self, run_id: str | None = None) -> None:
        """Write what is pending (of one run, or all)."""
        for rid in [run_id] if run_id is not None else list(self._runs):
            run = self._runs.get(rid)
            if run is None or not run.pending:
                continue
            counted, run.pending = run.pending, []
            room = max(0, MAX_RECORDED_PER_RUN - run.kept)
            kept = counted[:room]
            run.kept += len(kept)
            try:
                await self._store.add(rid, kept, counted)
            except Exception:
                log.exception("egress_log_write_failed", run_id=rid, events=len(counted))
                continue
            self._on_written(rid)

    async def close_run(self, run_id: str) -> None:
        """The run's door is closed: write what is left and forget it."""
        await self.flush(run_id)
        self._runs.pop(run_id, None)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        await self.flush()
