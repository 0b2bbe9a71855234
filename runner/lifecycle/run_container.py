"""How a run meets its container: a warm pool member it claims (runner/lifecycle/warm_pool.py), or one started
for it, cold, as without a pool.

Where its /workspace comes from is the chat's rule (runner/storage/workspace_placement.py), decided before the
run's channel opens: a synced run gets a scratch folder of its own (fresh) and the chat's archive over the
channel, as on Kubernetes; a folder run mounts the chat's folder as without a pool. Only a synced run can take a
pool member: a member belongs to no chat until its claim, so the chat's folder cannot be its mount (a bind mount
added at the claim would need mount propagation and CAP_SYS_ADMIN on the host, which a non-root bot does not
have). The scratch folder keeps today's disk behaviour (not the container's memory, as a tmpfs would): the host
only measures it, never following a link, for WORKSPACE_QUOTA_MB while the run lasts, and removes it afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from core.logging import get_logger
from core.settings import Settings
from core.store.chats import Chat
from core.store.runs import RunStore
from runner.lifecycle.container_spec import run_container_spec
from runner.lifecycle.warm_pool import Claimed, WarmPool
from runner.runs.live_runs import LiveRun
from runner.runtimes.runtime import POOL_NAME_PREFIX, ContainerGone, ContainerRuntime
from runner.storage.paths import DataPaths
from runner.storage.workspace_placement import Placement, WorkspacePlacements, remove_tree

log = get_logger(__name__)

MEMBER_SERVE_SECONDS = 2.0  # a live member's agent asks in milliseconds; after this its exit is looked for
EXIT_LOOK_SECONDS = 0.2


class RunContainers:
    def __init__(
        self,
        settings: Settings,
        runtime: ContainerRuntime,
        paths: DataPaths,
        runs: RunStore,
        *,
        pool: WarmPool | None = None,
        placements: WorkspacePlacements | None = None,
    ) -> None:
        self._settings = settings
        self._runtime = runtime
        self._paths = paths
        self._runs = runs  # a claimed member's container id goes on its run's record at once
        self._pool = pool
        self._placements = placements or WorkspacePlacements(paths, None)  # none: every run mounts its chat's folder
        self._claimed: dict[str, socket.socket] = {}  # a claimed member's listening socket, closed with its run

    async def place(self, live: LiveRun, chat: Chat) -> Placement:
        """The run's /workspace, decided before its channel opens (which serves the archive to a synced run only)."""
        pool_on = self._pool is not None and self._pool.target > 0
        return await self._placements.place(live.id, chat.folder, pool_on=pool_on)

    async def claim(self, live: LiveRun, chat: Chat) -> Claimed | None:
        """Before the run's channel opens: its placement decided, then a member (its folders renamed the run's), or
        None (cold). A folder run never takes one (a member cannot mount the chat's folder): a miss. A run
        cancelled meanwhile takes none."""
        ahead = self._pool.look_ahead() if self._pool is not None and self._pool.target > 0 else None
        place = await self.place(live, chat)
        if self._pool is None or live.cancelled:
            return None
        if not place.synced:
            self._pool.missed()
            return None
        claimed = await self._pool.claim(live.id, ahead)
        if claimed is None:
            await self._placements.ensure(live.id)  # a failed claim may have removed its fresh scratch folder
            return None
        live.container_id = claimed.container_id  # removed with the run from here on, whatever happens
        self._claimed[live.id] = claimed.listening
        # On its record before anything else is awaited: a member's labels name no run, so after a crash from here
        # on this id is how recovery finds it (a queued run's is removed and the run starts again, never leaked).
        await self._runs.set_container(live.id, claimed.container_id)
        try:
            # Before the channel answers the agent's waiting request: its next connections must reach the run's
            # folder (Kubernetes repoints the pod's bridge there; Docker's bind mount followed the rename).
            await self._runtime.claim(claimed.container_id, self._paths.channel_dir(live.id))
        except Exception as exc:  # gone meanwhile (retired, killed) or the engine away: a miss, the run starts cold
            log.warning("warm_pool_claim_lost", run_id=live.id, container_id=claimed.container_id, error=str(exc))
            await self._lost(live, claimed)
            return None
        return claimed

    async def _lost(self, live: LiveRun, claimed: Claimed) -> None:
        """A claimed member that cannot serve its run: removed, its socket closed, and the run's folders fresh."""
        self._claimed.pop(live.id, None)
        claimed.listening.close()
        await self._drop_member(live, claimed)
        await asyncio.to_thread(remove_tree, self._paths.channel_dir(live.id))  # the host's: its socket file
        await discard_scratch(self._paths, live.id)
        await self._placements.ensure(live.id)

    async def _drop_member(self, live: LiveRun, claimed: Claimed) -> None:
        """The claimed member is no longer the run's: counted lost and removed (recovery does it, if the engine
        cannot now)."""
        live.container_id = None
        assert self._pool is not None
        self._pool.lost()
        try:
            await self._runtime.remove(claimed.container_id)
        except Exception as exc:  # recovery removes it at the next start
            log.warning("warm_pool_member_not_removed", container_id=claimed.container_id, error=str(exc))

    async def start(self, live: LiveRun, claimed: Claimed | None) -> str:
        """The run's container, running: the claimed member, or a new one."""
        if claimed is not None:
            # A cancel meanwhile killed it: the supervisor sees that exit and records the cancel, no cold start.
            if live.cancelled or await self._serves(live, claimed.container_id) or live.cancelled:
                return claimed.container_id
            await self._exited_before_served(live, claimed)  # a miss: the run starts cold
        place = self._placements.of(live.id)
        assert place is not None, "placed before its channel opened"
        spec = run_container_spec(
            self._settings,
            run_id=live.id,
            chat_id=live.chat_id,
            instance_id=self._paths.instance_id,
            workspace=place.folder,
            channel_dir=self._paths.channel_dir(live.id),
            sync_workspace=place.synced,
        )
        return await self._runtime.start(spec)

    async def _serves(self, live: LiveRun, container_id: str) -> bool:
        """A claimed member's agent asked for its workspace after its task (at once on a hit: a pooled run is
        synced); False when it is seen exited before that."""
        if live.inbox is None:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(MEMBER_SERVE_SECONDS):
                await live.inbox.workspace_asked.wait()
                return True
        try:  # not heard from yet: alive (slow, a loaded host) or dead since just before its claim
            return await self._runtime.wait(container_id, EXIT_LOOK_SECONDS) is None
        except ContainerGone:
            return False
        except Exception:  # the engine away: the supervisor decides, as for any run
            return True

    async def _exited_before_served(self, live: LiveRun, claimed: Claimed) -> None:
        log.warning("warm_pool_member_exited_before_served", run_id=live.id, container_id=claimed.container_id)
        await self._drop_member(live, claimed)
        await discard_scratch(self._paths, live.id)  # the channel stays: its server listens on the member's socket
        await self._placements.ensure(live.id)

    async def reattached(self, live: LiveRun, chat: Chat) -> None:
        """A run re-attached after a restart, before its channel opens again: its placement as it started (synced
        if a pool member's, or if its scratch folder is there; recovery re-adopted it already, before any queued
        run could be placed), and a claimed pool member, whose name says nothing of its run, told again which
        run's folder it serves (Kubernetes makes its bridge towards it)."""
        pooled = live.container_id is not None and live.container_id.startswith(POOL_NAME_PREFIX)
        self._placements.readopt(live.id, chat.folder, pooled=pooled)
        if pooled:
            assert live.container_id is not None
            await self._runtime.claim(live.container_id, self._paths.channel_dir(live.id))

    async def release(self, live: LiveRun) -> None:
        """After its container is removed (or found gone): its channel and scratch folders go; a chat's folder is
        never emptied here."""
        listening = self._claimed.pop(live.id, None)
        if listening is not None:  # the channel server closed it, unless the run ended before its channel opened
            listening.close()
        self._placements.release(live.id)
        await asyncio.to_thread(remove_tree, self._paths.channel_dir(live.id))
        await discard_scratch(self._paths, live.id)


async def discard_scratch(paths: DataPaths, run_id: str) -> None:
    """A run's scratch folder, if it had one: removed by descriptor, never following a link."""
    await asyncio.to_thread(remove_tree, paths.run_scratch(run_id))
