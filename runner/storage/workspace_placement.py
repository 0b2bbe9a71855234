"""Where a run's /workspace lives, decided per chat and per run before its channel opens.

Two ways: the chat's folder, bind-mounted (a *folder* run), or a scratch folder of the run's own filled from the
chat's archive over the channel and pushed back at its end (a *synced* run, as on Kubernetes). The rule is the
chat's, never the deployment's, so that turning SUBAGENT_WARM_POOL off or on never hides a chat's files (two synced
runs of one chat at once each push, and the later one merges its changes onto the earlier's in its container:
runner/channel/workspace_desk.py, container/workspace_rebase.py):

- a chat is *archived* once its archive exists (its first synced run's push): every run of it is synced, pooled
  or cold, with the pool on or off;
- a chat with no archive whose folder holds files keeps its folder: every run mounts it, none is synced or
  pooled, and the host never empties or moves it (only an admin's `/workspace clear` does); once it is empty
  (after a clear) it is like a new chat;
- a chat with no archive and an empty (or missing) folder is synced when the pool is on (its first push archives
  it, and its runs can take pool members), else a folder run as without a pool;
- while a run of a chat lasts, every other run of that chat that starts takes the same way (a count per chat
  folder, in memory), so one chat never has two workspaces at once (a folder run beside a synced run would
  write where the other's push never looks, or be overwritten by it);
- Kubernetes: every run is synced (a pod shares no folder with the host), and the chat's folder is never touched
  (`/workspace clear` included).

Deciding a run's way takes the chat's lock (`held`), which `/workspace clear` holds across its whole clear
(runner/storage/workspaces.py), so a run is never placed in a workspace half cleared.

The host only ever stats, lists and measures a chat's folder here, never following a link.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from runner.storage.paths import DataPaths, hand_to_container
from runner.storage.workspace_archive import WorkspaceArchives


@dataclass(frozen=True, slots=True)
class Placement:
    """A run's /workspace: which host folder, and whether the chat's archive fills it over the channel."""

    folder: Path
    synced: bool
    on_host: bool = True  # the host holds the folder (and measures it); Kubernetes: the pod's emptyDir


@dataclass(slots=True)
class _Live:
    synced: bool
    runs: int = 0


@dataclass(slots=True)
class _ChatLock:
    """A chat's lock and how many hold or wait for it: it is forgotten only once none does."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class WorkspacePlacements:
    """Each live run's placement, and per chat folder the way its live runs took."""

    def __init__(self, paths: DataPaths, archives: WorkspaceArchives | None, *, always_synced: bool = False) -> None:
        self._paths = paths
        self._archives = archives  # None: no archives at all (a runtime that only mounts folders)
        self._always_synced = always_synced  # Kubernetes
        self._runs: dict[str, tuple[str, Placement]] = {}  # run id -> (chat folder, placement)
        self._live: dict[str, _Live] = {}  # chat folder -> the way its live runs took
        self._locks: dict[str, _ChatLock] = {}  # chat folder -> its lock, while held or waited for

    @property
    def archives(self) -> WorkspaceArchives | None:
        return self._archives

    @property
    def always_synced(self) -> bool:
        return self._always_synced

    async def place(self, run_id: str, folder: str, *, pool_on: bool) -> Placement:
        """The run's placement by the rule above, held until `release(run_id)`; its scratch folder (fresh: a
        leftover of an earlier attempt is removed first) or the chat's folder made, ready to mount."""
        if (known := self._runs.get(run_id)) is not None:
            return known[1]
        async with self.held(folder):  # two runs of one chat deciding at once decide the same; never amid a clear
            synced = await self._synced(folder, pool_on)
            place = self.placement(run_id, folder, synced)
            if not self._always_synced:  # Kubernetes: the pod's emptyDir, nothing on the host
                await asyncio.to_thread(_make_scratch if synced else hand_to_container, place.folder)
            self._hold(run_id, folder, place)
        return place

    def readopt(self, run_id: str, folder: str, *, pooled: bool) -> Placement:
        """A run re-attached after a restart: synced if it was (a pool member's, or its scratch folder is there)."""
        if (known := self._runs.get(run_id)) is not None:
            return known[1]
        synced = self._always_synced or pooled or self._paths.run_scratch(run_id).is_dir()
        place = self.placement(run_id, folder, synced and self._archives is not None)
        self._hold(run_id, folder, place)
        return place

    def placement(self, run_id: str, folder: str, synced: bool) -> Placement:
        if self._always_synced:  # the pod's emptyDir; the path only names the mount
            return Placement(self._paths.workspace(folder), synced=True, on_host=False)
        return Placement(self._paths.run_scratch(run_id) if synced else self._paths.workspace(folder), synced)

    async def ensure(self, run_id: str) -> None:
        """A synced run's scratch folder there again (a pool's claim that failed may have taken it)."""
        place = self.of(run_id)
        if place is not None and place.synced and place.on_host:
            await asyncio.to_thread(hand_to_container, place.folder)

    def of(self, run_id: str) -> Placement | None:
        known = self._runs.get(run_id)
        return known[1] if known is not None else None

    def live_runs(self, folder: str) -> int:
        """The chat's runs placed and not yet released."""
        live = self._live.get(folder)
        return 0 if live is None else live.runs

    @contextlib.asynccontextmanager
    async def held(self, folder: str) -> AsyncIterator[None]:
        """The chat's placement lock: `place` takes it, and `/workspace clear` holds it across its check that no
        run of the chat lasts and the whole clear, so no run is placed in a workspace being emptied."""
        chat = self._locks.setdefault(folder, _ChatLock())
        chat.users += 1
        try:
            async with chat.lock:
                yield
        finally:
            chat.users -= 1
            if chat.users == 0:
                del self._locks[folder]

    def release(self, run_id: str) -> Placement | None:
        known = self._runs.pop(run_id, None)
        if known is None:
            return None
        folder, place = known
        live = self._live[folder]
        live.runs -= 1
        if live.runs <= 0:
            del self._live[folder]
        return place

    async def archived(self, folder: str) -> bool:
        return self._archives is not None and await self._archives.chat(folder).size_bytes() is not None

    async def _synced(self, folder: str, pool_on: bool) -> bool:
        if self._archives is None:
            return False
        if self._always_synced:
            return True
        if (live := self._live.get(folder)) is not None:
            return live.synced  # one chat, one workspace
        if await self.archived(folder):
            return True
        return pool_on and not await asyncio.to_thread(has_entries, self._paths.workspace(folder))

    def _hold(self, run_id: str, folder: str, place: Placement) -> None:
        live = self._live.setdefault(folder, _Live(place.synced))
        live.runs += 1
        self._runs[run_id] = (folder, place)


def has_entries(folder: Path) -> bool:
    """Whether the chat's folder holds anything (a link in its place counts as nothing: never followed)."""
    try:
        if not folder.is_dir() or folder.is_symlink():
            return False
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


def _make_scratch(scratch: Path) -> None:
    """A fresh scratch folder: whatever an earlier attempt of the run left there is removed first."""
    remove_tree(scratch)
    scratch.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    hand_to_container(scratch)


def remove_tree(folder: Path) -> None:
    """shutil.rmtree opens each folder by descriptor and never follows a link (a scratch is the container's)."""
    shutil.rmtree(folder, ignore_errors=True)
