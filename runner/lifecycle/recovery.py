"""Restart recovery: reconcile the store's live runs with the engine's containers before taking work.

A run recorded live whose container still exists is re-attached (a finished container's result is
collected at once); one whose container is gone is `interrupted` and its chat told once; a queued run
(it never had a container) waits in the queue again and starts, in its order, as slots free.
Containers of this deployment with no live run are removed: warm pool members too, unless a run claimed one
(found by the container id on its record, written at the claim: a member keeps its pool labels), so a restart
drains the pool. A member claimed by a run still recorded queued never had its task (a run's channel serves only
once it is marked running), so its agent gave up when the old process died: it is removed and the run waits in
the queue again. Re-attached runs take back their workspace placements before any queued run may start, so a
queued run of the same chat takes the same way (runner/storage/workspace_placement.py).
Recovery that waited for the engine (down at start) leaves alone the runs this process started since:
their containers are its own, not survivors.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.logging import get_logger
from core.store.chats import ChatStore
from core.store.runs import RunRecord, RunStatus, RunStore
from runner.lifecycle.manager import TaskManager
from runner.runs.live_runs import LiveRuns
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_RUN_ID,
    ContainerInfo,
    ContainerRuntime,
)
from runner.storage.paths import DataPaths
from runner.storage.workspace_placement import WorkspacePlacements

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
        self,
        runs: RunStore,
        runtime: ContainerRuntime,
        *,
        manager: TaskManager,
        live: LiveRuns,
        paths: DataPaths,
        chats: ChatStore,
        placements: WorkspacePlacements,
    ) -> None:
        self._runs = runs
        self._runtime = runtime
        self._manager = manager
        self._live = live
        self._paths = paths
        self._chats = chats
        self._placements = placements

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
            pooled = info is not None and LABEL_POOL in info.labels
            # A member claimed by a run still queued never had its task: its agent gave up with the old process.
            unserved = pooled and record.status == RunStatus.QUEUED
            if info is not None and info.status in ADOPTABLE_STATES and not unserved:
                await self._readopt(record, pooled=pooled)  # before recovered() below lets a queued run place
                self._manager.reattach(record, info.id, started_at(record, info))
                report.reattached += 1
                continue
            if info is not None:
                if unserved:
                    log.info("warm_pool_claim_abandoned", run_id=record.id, container_id=info.id)
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

    async def _readopt(self, record: RunRecord, *, pooled: bool) -> None:
        """The re-attached run's placement as it started, held from now (its chat unknown: its run fails anyway)."""
        chat = await self._chats.get(record.chat_id)
        if chat is not None:
            self._placements.readopt(record.id, chat.folder, pooled=pooled)

    async def _discard(self, container_id: str) -> None:
        try:
            await self._runtime.kill(container_id)
        except Exception as exc:  # removing it below forces the kill anyway
            log.warning("orphan_container_not_killed", container_id=container_id, error=str(exc))
        try:
            await self._runtime.remove(container_id)
        except Exception as exc:
            log.warning("orphan_container_not_removed", container_id=container_id, error=str(exc))


def started_at(record: RunRecord, info: ContainerInfo) -> float | None:
    """When the re-attached run's time limit began: its container's start, but never before its run was marked
    running (a pool member's container started before any run claimed it, maybe long before)."""
    known = [t for t in (info.started_at, record.started_at) if t is not None]
    return max(known) if known else None
