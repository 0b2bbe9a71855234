"""What `/workspace` shows and does: a chat's workspace measured on disk, and cleared when no run uses it.

The workspace is the one folder a container writes, so both walk it without following a link
(runner/storage/workspace_usage.py), in a thread. Which workspace is the chat's follows its placement
(runner/storage/workspace_placement.py): an archived chat's is its archive (runner/storage/workspace_archive.py),
whose size is the usage, and while a run of it lasts on Docker that run's own scratch folder, which is what its
push would store (each synced run unpacks the whole archive into its own, so a chat's runs are measured each on
its own, never summed); a chat whose runs mount its folder, that folder. A run is only ever measured where it
writes. Clearing deletes the archive, along with the chat's archives that runs could not unpack and set aside
(`/workspace` counts them), and on Docker the chat's folder; it holds the chat's placement lock throughout, so no
run of the chat is placed meanwhile (runner/storage/workspace_placement.py). On Kubernetes the chat's folder on the
host is never touched: no run there uses it.
"""

from __future__ import annotations

import asyncio

from core.store.chats import ChatStore
from runner.runs.live_runs import LiveRuns
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import ChatArchive, WorkspaceArchives
from runner.storage.workspace_placement import WorkspacePlacements
from runner.storage.workspace_usage import WorkspaceUsage, clear, measure_async

BYTES_PER_MB = 1024 * 1024
WORKSPACE_MAX_ENTRIES = 200_000  # more files than this counts as over quota (and bounds a measurement)


class Workspaces:
    def __init__(
        self,
        paths: DataPaths,
        chats: ChatStore,
        live: LiveRuns,
        quota_mb: int,
        archives: WorkspaceArchives | None = None,
        placements: WorkspacePlacements | None = None,
    ) -> None:
        self._paths = paths
        self._chats = chats
        self._live = live
        self._quota_mb = quota_mb
        self._placements = placements or WorkspacePlacements(paths, archives)
        self._archives = self._placements.archives  # None: no chat is ever archived (every run mounts its folder)

    def served(self, run_id: str, folder: str) -> ChatArchive | None:
        """The chat's archive when the run's placement is synced (its /workspace is filled from it and pushed back
        over the channel); None for a run that mounts the chat's folder, or one not placed."""
        place = self._placements.of(run_id)
        if self._archives is None or place is None or not place.synced:
            return None
        return self._archives.chat(folder)

    async def _measure(self, folder: str, run_id: str | None = None) -> WorkspaceUsage:
        place = self._placements.of(run_id) if run_id is not None else None
        # A synced run's own scratch folder: what its push would make the chat's workspace (each synced run
        # unpacks the whole archive, so the chat's runs together are never one workspace); a folder run's, the
        # chat's folder, shared by the chat's runs.
        if place is not None and place.on_host:
            return await measure_async(place.folder, max_entries=WORKSPACE_MAX_ENTRIES)
        if self._archives is not None and (self._placements.always_synced or await self._placements.archived(folder)):
            return await self._archives.usage(folder)  # Kubernetes: the archive, or nothing yet
        return await measure_async(self._paths.workspace(folder), max_entries=WORKSPACE_MAX_ENTRIES)

    async def over_quota(self, folder: str, run_id: str | None = None) -> str | None:
        """The chat's message when its workspace is over WORKSPACE_QUOTA_MB, else None; `run_id`: while that run
        lasts (its live workspace, where the host can measure it)."""
        usage = await self._measure(folder, run_id)
        if not usage.over(self._quota_mb * BYTES_PER_MB):
            return None
        size = f"over {WORKSPACE_MAX_ENTRIES} files" if usage.truncated else f"{usage.bytes / BYTES_PER_MB:.0f} MB"
        return (
            f"the chat's workspace uses {size}, over its quota of {self._quota_mb} MB (WORKSPACE_QUOTA_MB). "
            "Ask me to delete files there, or an admin can clear it with /workspace clear."
        )

    async def describe(self, chat_id: int) -> str:
        chat = await self._chats.get(chat_id)
        if chat is None:
            return "This chat has no workspace yet."
        usage = await self._measure(chat.folder)
        size = f"more than {WORKSPACE_MAX_ENTRIES} files" if usage.truncated else f"{usage.bytes / BYTES_PER_MB:.1f} MB"
        text = (
            f"This chat's workspace (files its subagents keep between runs) uses {size} of {self._quota_mb} MB "
            f"({usage.entries} entries). An admin can empty it with /workspace clear."
        )
        kept = await self._archives.chat(chat.folder).kept_aside() if self._archives is not None else 0
        if kept:
            text += (
                f" {kept} stored workspace(s) that a run could not unpack were set aside on the host for an admin "
                "(DATA_DIR/workspace-archives/unreadable/); /workspace clear deletes them too."
            )
        return text

    async def clear(self, chat_id: int) -> str:
        chat = await self._chats.get(chat_id)
        if chat is None:
            return "This chat has no workspace yet."
        async with self._placements.held(chat.folder):  # no run of the chat is placed until the clear is done
            running = max(self._live.count(chat_id), self._placements.live_runs(chat.folder))
            if running:
                return (
                    f"{running} subagent run(s) of this chat are using the workspace: /cancel all first, then clear it."
                )
            dropped = 0
            if self._archives is not None:
                await self._archives.chat(chat.folder).clear()
                dropped = await self._archives.chat(chat.folder).drop_kept_aside()
            if not self._placements.always_synced:  # Kubernetes: no run uses the host's folder, left as it is
                await asyncio.to_thread(clear, self._paths.workspace(chat.folder))
        aside = f", and the {dropped} unreadable workspace(s) set aside" if dropped else ""
        return f"Cleared this chat's workspace{aside}."
