"""How a run meets its container: a warm pool member it claims (runner/lifecycle/warm_pool.py), or one started
for it, cold, as without a pool.

Where its /workspace comes from: the chat's folder, bind-mounted, on Docker without a pool. With a pool a member
belongs to no chat until its claim, so the chat's workspace cannot be its mount (a bind mount added at the claim
would need mount propagation and CAP_SYS_ADMIN on the host, which a non-root bot does not have): every run of
the deployment, pooled or cold, gets a scratch folder of its own as /workspace and the chat's workspace travels
as an archive over the channel, as on Kubernetes, so a chat sees the same files whichever way its run started.
The scratch folder keeps today's disk behaviour (not the container's memory, as a tmpfs would): the host only
measures it, never following a link, for WORKSPACE_QUOTA_MB while the run lasts, and removes it afterwards.
A chat whose folder still holds files from before the pool (and has no archive) runs cold once with that folder
mounted: its run pushes it into the archive, after which the host empties the folder (no link followed).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from core.settings import Settings
from core.store.chats import Chat
from runner.lifecycle.container_spec import run_container_spec
from runner.lifecycle.warm_pool import Claimed, WarmPool
from runner.runs.live_runs import LiveRun
from runner.runtimes.runtime import POOL_NAME_PREFIX, ContainerRuntime
from runner.storage.paths import DataPaths, hand_to_container
from runner.storage.workspace_archive import WorkspaceArchives
from runner.storage.workspace_usage import clear


@dataclass(frozen=True, slots=True)
class Placement:
    """A run's /workspace: which host folder, and whether the chat's archive fills it over the channel."""

    folder: Path
    synced: bool
    moving_folder: bool = False  # the chat's old folder, mounted once to move its files into the archive


class RunContainers:
    def __init__(
        self,
        settings: Settings,
        runtime: ContainerRuntime,
        paths: DataPaths,
        *,
        pool: WarmPool | None = None,
        archives: WorkspaceArchives | None = None,
    ) -> None:
        self._settings = settings
        self._runtime = runtime
        self._paths = paths
        self._pool = pool
        # Docker with a pool: chats' workspaces are archives, and each run's /workspace a scratch folder.
        self._archives = archives if pool is not None else None
        self._moving: dict[str, str] = {}  # run id -> the chat's folder its run is moving into the archive
        self._claimed: dict[str, socket.socket] = {}  # a claimed member's listening socket, closed with its run

    async def claim(self, live: LiveRun, chat: Chat) -> Claimed | None:
        """Before the run's channel opens (its folder is the member's, renamed): a member, or None (cold; a chat
        whose old folder is to be moved into its archive too: that needs the folder mounted)."""
        if self._pool is None:
            return None
        if await self._moves_folder(chat):
            self._pool.missed()
            return None
        claimed = await self._pool.claim(live.id)
        if claimed is not None:
            live.container_id = claimed.container_id  # removed with the run from here on, whatever happens
            self._claimed[live.id] = claimed.listening
            # Before the channel answers the agent's waiting request: its next connections must reach the run's
            # folder (Kubernetes repoints the pod's bridge there; Docker's bind mount followed the rename).
            await self._runtime.claim(claimed.container_id, self._paths.channel_dir(live.id))
        return claimed

    async def start(self, live: LiveRun, chat: Chat, claimed: Claimed | None) -> str:
        """The run's container, running: the claimed member, or a new one."""
        if claimed is not None:  # told at its claim
            return claimed.container_id
        place = await self._placement(live.id, chat)
        if place.moving_folder:
            self._moving[live.id] = chat.folder
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

    async def reattached(self, live: LiveRun) -> None:
        """A run re-attached after a restart: a claimed pool member's name says nothing of its run, so the runtime
        is told again which run's folder it serves (Kubernetes makes its bridge towards it; Docker: nothing)."""
        if live.container_id is not None and live.container_id.startswith(POOL_NAME_PREFIX):
            await self._runtime.claim(live.container_id, self._paths.channel_dir(live.id))

    async def release(self, live: LiveRun) -> None:
        """After its container is removed: its scratch folder goes; a chat folder moved into the archive is
        emptied once the archive holds it (else the next run moves it again)."""
        listening = self._claimed.pop(live.id, None)
        if listening is not None:  # the channel server closed it, unless the run ended before its channel opened
            listening.close()
        if self._archives is None:
            return
        await asyncio.to_thread(shutil.rmtree, self._paths.run_scratch(live.id), True)
        folder = self._moving.pop(live.id, None)
        if folder is not None and await self._archives.chat(folder).size_bytes() is not None:
            await asyncio.to_thread(clear, self._paths.workspace(folder))

    async def _placement(self, run_id: str, chat: Chat) -> Placement:
        if self._archives is None:
            return Placement(self._paths.workspace(chat.folder), synced=False)
        if await self._moves_folder(chat):
            return Placement(self._paths.workspace(chat.folder), synced=True, moving_folder=True)
        scratch = self._paths.run_scratch(run_id)
        await asyncio.to_thread(_make_scratch, scratch)
        return Placement(scratch, synced=True)

    async def _moves_folder(self, chat: Chat) -> bool:
        """The chat's folder still holds files from before the pool, and it has no archive yet."""
        if self._archives is None or await self._archives.chat(chat.folder).size_bytes() is not None:
            return False
        return await asyncio.to_thread(_has_entries, self._paths.workspace(chat.folder))


def _has_entries(folder: Path) -> bool:
    """Whether the chat's folder holds anything (a link in its place counts as nothing: never followed)."""
    try:
        if not folder.is_dir() or folder.is_symlink():
            return False
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


def _make_scratch(scratch: Path) -> None:
    scratch.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    hand_to_container(scratch)
