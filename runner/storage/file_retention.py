"""Retention of the files runs were given and sent, kept host-side in folders no container mounts.

A chat file's copy in DATA_DIR/files/in goes once no run has used it for the retention period (each use
touches its time), unless a live run was given it. The copy of a file a run sent, in
DATA_DIR/files/out/<run id>/, goes once its sending is over (sent or given up) and it is older than the
period; its record stays (stats, /subagents) without the copy. A finished run's folder goes once empty, and a
file in it that no record names (a crash between writing and recording it) goes by its age.

The host made these folders and wrote their files, but they are removed in retention's way all the same
(`runner.storage.prune_entries`: lstat'ed, removed through descriptors, nothing followed), in a thread. A
stored path that is not a file of a run's folder under files/out is never removed, only forgotten.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from core.logging import get_logger
from core.store.db import Database
from core.store.run_files import RunFileStore
from core.store.runs import FINAL_STATUSES, RunStatus
from runner.ipc.requests import printable
from runner.storage.chat_file_cache import copy_name
from runner.storage.paths import DataPaths
from runner.storage.prune_entries import Entry, Removed, list_entries, remove_names

log = get_logger(__name__)

RunRows = Callable[[Iterable[str]], Awaitable[dict[str, tuple[str, float | None]]]]  # id: (status, finished_at)
MAX_LOGGED_PATH_CHARS = 300


@dataclass(frozen=True, slots=True)
class FilesPruned:
    files_in: int = 0  # chat files' copies no run used for the period
    files_out: int = 0  # copies of files runs sent (and leftovers no record names)
    out_folders: int = 0  # finished runs' empty folders under files/out
    failures: int = 0


@dataclass(frozen=True, slots=True)
class _StoredGone:
    forgotten: list[int]  # records whose copy is gone now (or was already, or is not retention's to remove)
    removed: int
    failures: int


@dataclass(frozen=True, slots=True)
class _Tidied:
    leftovers: int = 0
    folders: int = 0
    failures: int = 0


class FileRetention:
    def __init__(self, db: Database, paths: DataPaths, run_rows: RunRows) -> None:
        self._db = db
        self._paths = paths
        self._store = RunFileStore(db)
        self._run_rows = run_rows  # the runs of these ids: their status and when they finished

    async def prune(self, cutoff: float) -> FilesPruned:
        in_use = await self._copies_in_use()
        files_in = await asyncio.to_thread(_prune_files_in, self._paths.files_in_dir, in_use, cutoff)
        out_dir = self._paths.files_out_dir
        gone = await asyncio.to_thread(_remove_stored, out_dir, await self._store.stored_out(cutoff))
        if gone.forgotten:
            await self._store.forget_stored(gone.forgotten)
        folders = [entry for entry in await asyncio.to_thread(list_entries, out_dir) if entry.is_dir]
        rows = await self._run_rows(entry.name for entry in folders)
        over = {entry.name for entry in folders if _run_over(entry, rows.get(entry.name), cutoff)}
        tidied = _Tidied()
        if over:
            kept = await self._still_stored(out_dir)
            tidied = await asyncio.to_thread(_tidy_folders, out_dir, over, kept, cutoff)
        return FilesPruned(
            files_in=files_in.removed,
            files_out=gone.removed + tidied.leftovers,
            out_folders=tidied.folders,
            failures=files_in.failures + gone.failures + tidied.failures,
        )

    async def _copies_in_use(self) -> set[str]:
        """The cache names of the chat files queued or running runs were given: kept however old."""
        async with self._db.conn.execute(
            "SELECT DISTINCT c.file_unique_id FROM run_files AS f JOIN chat_files AS c ON c.id = f.chat_file_id "
            "JOIN subagent_runs AS r ON r.id = f.run_id WHERE f.direction = 'in' AND r.status IN (?, ?)",
            (RunStatus.QUEUED, RunStatus.RUNNING),
        ) as cursor:
            return {copy_name(str(row[0])) for row in await cursor.fetchall()}

    async def _still_stored(self, out_dir: Path) -> set[tuple[str, str]]:
        """(run folder, file name) of every copy a record still names."""
        async with self._db.conn.execute(
            "SELECT stored FROM run_files WHERE direction = 'out' AND stored IS NOT NULL"
        ) as cursor:
            rows = await cursor.fetchall()
        return {where for row in rows if (where := out_location(out_dir, str(row[0]))) is not None}


def out_location(out_dir: Path, stored: str) -> tuple[str, str] | None:
    """(run folder, file name) of a stored copy: a file directly in a run's folder under `out_dir`, else None.
    DATA_DIR may be relative: paths are compared as given, and made absolute (from the working directory)."""
    path = Path(stored)
    for under, base in ((path, out_dir), (path.absolute(), out_dir.absolute())):
        try:
            parts = under.relative_to(base).parts
        except ValueError:
            continue
        if len(parts) == 2 and ".." not in parts:
            return parts[0], parts[1]
    return None


def _run_over(folder: Entry, row: tuple[str, float | None] | None, cutoff: float) -> bool:
    """A run that can send nothing more: finished, or unknown and its folder old (a leftover)."""
    if row is None:
        return folder.changed_at < cutoff
    return row[0] in FINAL_STATUSES


# --- blocking file work (run in a thread) -------------------------------------------------------------


def _prune_files_in(files_dir: Path, in_use: Collection[str], cutoff: float) -> Removed:
    """Copies unused since the cutoff, each looked at again just before it goes: a run may be touching it."""
    expired = [e.name for e in list_entries(files_dir) if e.changed_at < cutoff and e.name not in in_use]
    return remove_names(files_dir, expired, older_than=cutoff)


def _remove_stored(out_dir: Path, stored: list[tuple[int, str]]) -> _StoredGone:
    forgotten: list[int] = []
    by_folder: dict[str, list[tuple[int, str]]] = {}
    for file_id, path in stored:
        where = out_location(out_dir, path)
        if where is None:
            log.warning("retention_stored_elsewhere", file_id=file_id, path=printable(path)[:MAX_LOGGED_PATH_CHARS])
            forgotten.append(file_id)
            continue
        by_folder.setdefault(where[0], []).append((file_id, where[1]))
    removed = failures = 0
    for folder, files in by_folder.items():
        directory = out_dir / folder
        if not _is_folder(out_dir, folder):
            forgotten.extend(file_id for file_id, _ in files)  # no folder (or not one): no copies in it
            continue
        done = remove_names(directory, [name for _, name in files])
        removed += done.removed
        failures += done.failures
        forgotten.extend(file_id for file_id, name in files if not _exists(directory, name))
    return _StoredGone(forgotten, removed, failures)


def _tidy_folders(out_dir: Path, over: Collection[str], kept: Collection[tuple[str, str]], cutoff: float) -> _Tidied:
    """In the folders of runs that are over: old files no record names, then the folder once it is empty."""
    leftovers = folders = failures = 0
    for folder in over:
        directory = out_dir / folder
        if not _is_folder(out_dir, folder):
            continue
        stray = [e.name for e in list_entries(directory) if (folder, e.name) not in kept and e.changed_at < cutoff]
        done = remove_names(directory, stray)
        leftovers += done.removed
        failures += done.failures
        try:
            os.rmdir(directory)
        except OSError:
            continue  # not empty (a file still owed, or a recent one): next time
        folders += 1
    return _Tidied(leftovers, folders, failures)


def _is_folder(parent: Path, name: str) -> bool:
    """A folder itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(parent / name).st_mode)
    except FileNotFoundError:
        return False


def _exists(directory: Path, name: str) -> bool:
    try:
        os.lstat(directory / name)
    except FileNotFoundError:
        return False
    return True
