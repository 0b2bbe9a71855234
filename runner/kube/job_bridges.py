"""Each Job's bridge (runner/kube/pod_bridge.py): made once its pod runs, towards the run's host sockets, and
ended with the run. A warm pool member's bridge is made the same way before any run is its own, towards the
member's folder (the pool listens on its run socket, the idle agent's task request waits there); `claim()`
points it at the run's folder, which is the member's renamed, and so at the run's door too."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

from container.contract import BRIDGE_TARGET_EGRESS, BRIDGE_TARGET_RUN, CHANNEL_SOCKET_FILE, EGRESS_SOCKET_FILE
from core.logging import get_logger
from runner.kube.kube_calls import PodView

log = get_logger(__name__)

BRIDGE_SOCKETS = {BRIDGE_TARGET_RUN: CHANNEL_SOCKET_FILE, BRIDGE_TARGET_EGRESS: EGRESS_SOCKET_FILE}


class Bridge(Protocol):
    async def run(self) -> None: ...
    async def close(self) -> None: ...
    def repoint(self, sockets: Mapping[str, Path | None]) -> None: ...


# (job name, pod name, host sockets by bridge target (None: that target is refused), whether its container still
# runs, whether it is a pool member's (its run's door, if any, comes at the claim)) → the run's bridge.
StillRunning = Callable[[], Awaitable[bool]]
BridgeFactory = Callable[[str, str, dict[str, Path | None], StillRunning, bool], Bridge]
PodOf = Callable[[str], Awaitable[PodView | None]]


async def sockets_in(channel_dir: Path) -> dict[str, Path | None]:
    """The run's host sockets by bridge target, None for one the run does not have (no door: egress is off)."""
    sockets: dict[str, Path | None] = {}
    for target, file_name in BRIDGE_SOCKETS.items():
        path = channel_dir / file_name
        sockets[target] = path if await asyncio.to_thread(path.exists) else None
    return sockets


class JobBridges:
    """`until_running(job)`: its pod once it runs, None once it never will; `pod(job)`: its pod now."""

    def __init__(self, factory: BridgeFactory, *, until_running: PodOf, pod: PodOf) -> None:
        self._factory = factory
        self._until_running = until_running
        self._pod = pod
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._live: dict[str, Bridge] = {}  # each job's bridge while it runs
        self._claims: dict[str, dict[str, Path | None]] = {}  # a claimed pool member's host sockets
        self._pooled: set[str] = set()
        self._pods: dict[str, str] = {}  # the pod each job's bridge found running: a kill deletes it without a list

    def __contains__(self, job: str) -> bool:
        return job in self._tasks

    def running_pod(self, job: str) -> str | None:
        """The name of the job's pod its bridge found running, if it did (this process)."""
        return self._pods.get(job)

    def ensure(self, job: str, channel_dir: Path, *, pooled: bool = False) -> None:
        if pooled:
            self._pooled.add(job)
        task = self._tasks.get(job)
        if task is None or task.done():
            self._tasks[job] = asyncio.create_task(self._bridge(job, channel_dir), name=f"bridge-{job}")

    async def claim(self, job: str, channel_dir: Path) -> None:
        """Its streams go to `channel_dir`'s sockets from now on (those its agent opened while idle went with the
        renamed folder)."""
        # Both, whether the run has its door yet or not: a claim comes before the run's door opens, and a stream to
        # a socket that is not there is reset as one to no target is (the folder is the host's own, never a path
        # from the pod).
        sockets = self._claims[job] = {target: channel_dir / name for target, name in BRIDGE_SOCKETS.items()}
        bridge = self._live.get(job)
        if bridge is not None:
            bridge.repoint(sockets)
        else:  # its pod does not run yet (its bridge will read the claim), or re-attached after a restart
            self.ensure(job, channel_dir, pooled=True)

    async def _bridge(self, job: str, channel_dir: Path) -> None:
        """Once the pod runs, the bridge carries its connections until the run ends (this task is cancelled)."""
        pod = await self._until_running(job)
        if pod is None:
            return
        self._pods[job] = pod.name
        sockets = await sockets_in(channel_dir)
        sockets = self._claims.get(job, sockets)  # read after the await: a claim that came meanwhile wins

        async def still_running() -> bool:
            now = await self._pod(job)
            return now is not None and now.name == pod.name and now.exit_code is None and not now.deleting

        bridge = self._live[job] = self._factory(job, pod.name, sockets, still_running, job in self._pooled)
        try:
            await bridge.run()
        except Exception as exc:  # not expected (the bridge ends quietly), but never an unretrieved task error
            log.error("kube_bridge_failed", job=job, error=str(exc))
        finally:
            if self._live.get(job) is bridge:
                del self._live[job]
            await asyncio.shield(bridge.close())

    async def stop(self, job: str) -> None:
        task = self._tasks.pop(job, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def forget(self, job: str) -> None:
        await self.stop(job)
        self._claims.pop(job, None)
        self._pods.pop(job, None)
        self._pooled.discard(job)

    async def close(self) -> None:
        for job in list(self._tasks):
            await self.stop(job)
