"""Restart recovery: reconcile the store's live runs with the engine's containers before taking work.

A run recorded live whose container still exists is re-attached (a finished container's result is
collected at once); one whose container is gone is `interrupted` and its chat told once; a queued run
(it never had a container) waits in the queue again and starts, in its order, as slots free.
Containers of this deployment with no live run are removed: warm pool members too, unless a run claimed one
(found by the container id on its record: a member keeps its pool labels), so a restart drains the pool.
Recovery that waited for the engine (down at start) leaves alone the runs this process started since:
their containers are its own, not survivors.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.logging import get_logger
from core.store.runs import RunStatus, RunStore
from runner.lifecycle.manager import TaskManager
from runner.runs.live_runs import LiveRuns
from runner.runtimes.runtime import LABEL_APP, LABEL_INSTANCE, LABEL_POOL, LABEL_RUN_ID, ContainerRuntime
from runner.storage.paths import DataPaths

log = get_logger(__name__)

ADOPTABLE_STATES = frozenset({"running", "exited"})  # created/dead/paused containers are not worth saving
GONE_REASON = "the bot restarted and the subagent's container was gone"


@dataclass(slots=True)
class RecoveryReport:
    reattached: int = 0
    restarted: int = 0
    interrupted: int = 0
    removed: int = 0
    drained: int = 0  # warm pool members no run had claimed


class Recovery:
    def __init__(
        self, runs: RunStore, runtime: ContainerRuntime, *, manager: TaskManager, live: LiveRuns, paths: DataPaths
    ) -> None:
        self._runs = runs
        self._runtime = runtime
        self._manager = manager
        self._live = live
        self._paths = paths

    async def run(self) -> RecoveryReport:
        report = RecoveryReport()
        containers = await self._runtime.list({LABEL_APP: "1", LABEL_INSTANCE: self._paths.instance_id})
        members = {c.id: c for c in containers if LABEL_POOL in c.labels}
        by_run = {c.labels.get(LABEL_RUN_ID, ""): c for c in containers if LABEL_POOL not in c.labels}
        for record in await self._runs.with_status(RunStatus.QUEUED, RunStatus.RUNNING):
            info = by_run.pop(record.id, None)
            if info is None and record.container_id is not None:
                info = members.pop(record.container_id, None)  # a claimed member, now this run's
            if self._live.is_own(record.id):
                continue
            if info is not None and info.status in ADOPTABLE_STATES:
                self._manager.reattach(record, info.id, info.started_at)
                report.reattached += 1
                continue
            if info is not None:
                await self._discard(info.id)
            if record.status == RunStatus.QUEUED:
                report.restarted += 1  # it waits in the queue (SubagentService.start put it there) for a slot
            elif await self._manager.interrupt(record, GONE_REASON):
                report.interrupted += 1
        for run_id, info in by_run.items():
            if self._live.is_own(run_id):
                continue
            await self._discard(info.id)
            report.removed += 1
        for info in members.values():
            await self._discard(info.id)
            report.drained += 1
        self._live.release_holds()
        self._manager.recovered()  # queued runs, in their order, take the slots left free
        log.info(
            "recovery_done",
            reattached=report.reattached,
            restarted=report.restarted,
            interrupted=report.interrupted,
            removed=report.removed,
            drained=report.drained,
        )
        return report

    async def _discard(self, container_id: str) -> None:
        try:
            await self._runtime.kill(container_id)
        except Exception as exc:  # removing it below forces the kill anyway
            log.warning("orphan_container_not_killed", container_id=container_id, error=str(exc))
        try:
            await self._runtime.remove(container_id)
        except Exception as exc:
            log.warning("orphan_container_not_removed", container_id=container_id, error=str(exc))
