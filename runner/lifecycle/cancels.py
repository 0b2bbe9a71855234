"""A run's cancel, in the order that makes it quick: its container's kill is asked before anything is
awaited (no store write, no channel close ahead of it), and the outcome is recorded while the engine kills.

The kill is the supervisor's one shared call (`Supervisor.kill_soon`): the engine gets one kill per
container, not a cancel's and a supervisor's racing each other (bench/cancel.py measured the second one
holding the container up for 20–40 ms on Docker).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from core.delivery import Delivery
from core.logging import get_logger
from core.store.runs import RunStatus, RunStore
from runner.lifecycle.conclusion import Releases
from runner.lifecycle.supervisor import Supervisor
from runner.runs.live_runs import LiveRun, StopReason

log = get_logger(__name__)


class Cancels:
    def __init__(
        self,
        *,
        runs: RunStore,
        delivery: Delivery,
        releases: Releases,
        supervisor: Supervisor,
        close_channel: Callable[[str], Awaitable[None]],
    ) -> None:
        self._runs = runs
        self._delivery = delivery
        self._releases = releases
        self._supervisor = supervisor
        self._close_channel = close_channel

    def stop_now(self, live: LiveRun) -> bool:
        """A cancel's first step, with no await: the channel refuses the run's calls from here and its
        container's kill is on its way (one that has none yet is killed as its start returns). False if
        the run was cancelled already."""
        if live.cancelled:
            return False
        live.cancelled = True
        live.cancel_monotonic = time.monotonic()
        live.request_stop(StopReason.CANCELLED)
        if live.container_id is not None:
            self._supervisor.kill_soon(live)
        return True

    async def record(self, live: LiveRun, reason: str) -> bool:
        """After `stop_now`: its outcome, its unsent messages and its channel, while the engine kills its
        container; returns once the engine answered the kill (the supervisor asks again if it could not)."""
        recorded = await self._runs.finish(live.id, RunStatus.CANCELLED, error=f"cancelled: {reason}")
        if recorded:
            self._releases.release(live)
            dropped = await self._delivery.drop_run_messages(live.id, f"run cancelled: {reason}")
            if dropped:
                log.info("progress_messages_dropped", run_id=live.id, count=dropped)
        await self._close_channel(live.id)
        if live.kill_task is not None:
            try:
                await asyncio.shield(live.kill_task)
            except Exception as exc:
                log.warning("container_kill_failed", run_id=live.id, error=str(exc))
        elif live.task is None and not live.recovering:
            live.stopped = True  # never had a container and nothing supervises it
        log.info("run_cancelled", run_id=live.id, reason=reason, recorded=recorded)
        return recorded

    async def record_all(self, stopping: list[LiveRun], reason: str) -> int:
        return sum(await asyncio.gather(*(self.record(live, reason) for live in stopping)))
