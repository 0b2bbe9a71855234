"""Listing and removing the entries of a host-owned folder for retention, never following anything.

Entries are lstat'ed, aged by the earlier of mtime and ctime, and removed through the folder's descriptor
(`runner.storage.workspace_usage.remove_entry`): a symlink goes as a link, a tree without following. All
of it blocks: callers run it in a thread.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from core.logging import get_logger
from runner.ipc.requests import printable
from runner.storage.workspace_usage import remove_entry

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Removed:
    removed: int
    failures: int


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    st: os.stat_result

    @property
    def changed_at(self) -> float:
        """A container can set mtime to any time but not ctime: the earlier of the two ages honest entries
        by mtime, and a forged future mtime cannot keep an entry forever."""
        return changed_at(self.st)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)


def changed_at(st: os.stat_result) -> float:
    return min(st.st_mtime, st.st_ctime)


def list_entries(directory: Path) -> list[Entry]:
    """The entries of a host-owned directory, each lstat'ed (never followed); none when it is missing."""
    entries: list[Entry] = []
    try:
        with os.scandir(directory) as found:
            for item in found:
                try:
                    entries.append(Entry(item.name, item.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return []
    return entries


def remove_names(directory: Path, names: Collection[str], *, older_than: float | None = None) -> Removed:
    """Remove entries of a host-owned directory; a symlink is removed as a link, a tree without following.
    With `older_than`, an entry is looked at again just before and kept if it changed since (in use again)."""
    if not names:
        return Removed(0, 0)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return remove_at(fd, names, older_than=older_than, shown=str(directory))
    finally:
        os.close(fd)


def remove_at(dir_fd: int, names: Collection[str], *, older_than: float | None = None, shown: str = "") -> Removed:
    """`remove_names` on an open directory; `shown` names it in the log."""
    removed = failures = 0
    for name in names:
        try:
            if older_than is not None and not _still_older(dir_fd, name, older_than):
                continue
            removed += remove_entry(dir_fd, name)
        except OSError as exc:
            failures += 1
            log.warning("retention_remove_failed", directory=shown, name=printable(name), error=str(exc))
    return Removed(removed, failures)


def _still_older(dir_fd: int, name: str, cutoff: float) -> bool:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return changed_at(st) < cutoff
