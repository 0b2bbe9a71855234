"""A chat workspace's disk usage, and emptying it, without trusting anything a container wrote there.

Everything below a workspace (or a run dir) is the container's: it may hold symlinks, hardlinks, FIFOs,
sockets, devices, millions of entries or trees deeper than a path can name. Nothing here opens a file,
follows a link or names a path inside the tree for a write: directories are opened with O_NOFOLLOW and
checked to be the directory that was listed, and removal works on descriptors (`unlinkat`, `renameat`).
All of it blocks: callers run it in a thread (`measure_async`, `asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

BLOCK_BYTES = 512  # st_blocks counts 512-byte units whatever the filesystem's block size
OWNER_RWX = 0o700
HOISTED_PREFIX = ".crewbot-rm-"
MAX_HOIST_NAME_ATTEMPTS = 8
MAX_SWAP_RETRIES = 3  # an entry replaced between lstat and open is looked at again this often

# O_NONBLOCK: should a FIFO be swapped in for a directory, open() fails (O_DIRECTORY) instead of hanging.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What opening a listed directory raises when the container removed or replaced it meanwhile.
_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


@dataclass(frozen=True, slots=True)
class WorkspaceUsage:
    """`bytes` is real disk usage (allocated blocks, each inode once); `entries` counts names.

    `truncated`: the walk stopped at the entry cap or could not read part of the tree, so the true usage
    may be larger; callers treat it as over quota.
    """

    bytes: int
    entries: int
    truncated: bool

    def over(self, quota_bytes: int) -> bool:
        return self.truncated or self.bytes > quota_bytes


@dataclass(slots=True)
class _Tally:
    max_entries: int
    bytes: int = 0
    entries: int = 0
    truncated: bool = False
    seen: set[tuple[int, int]] = field(default_factory=set)

    def add_inode(self, st: os.stat_result) -> None:
        key = (st.st_dev, st.st_ino)
        if key not in self.seen:  # a hardlinked file costs its blocks once
            self.seen.add(key)
            self.bytes += st.st_blocks * BLOCK_BYTES

    def add_entry(self, st: os.stat_result) -> bool:
        """Count one name; False once the cap is passed (the walk stops)."""
        self.entries += 1
        if self.entries > self.max_entries:
            self.truncated = True
            return False
        self.add_inode(st)
        return True


def measure(path: Path, *, max_entries: int) -> WorkspaceUsage:
    """Walk the tree below `path` without following links or opening files (blocking).

    A missing `path`, or one that is not a real directory, measures as empty: nothing of it is inside.
    """
    tally = _Tally(max_entries=max_entries)
    try:
        root = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return WorkspaceUsage(0, 0, False)
    if not stat.S_ISDIR(root.st_mode):
        return WorkspaceUsage(0, 0, False)
    tally.add_inode(root)
    # Paths, not held descriptors: depth costs neither descriptors nor recursion; each directory is
    # checked on opening to be the one that was listed, so a swapped-in symlink is never walked.
    pending: list[tuple[str, os.stat_result]] = [(os.fspath(path), root)]
    while pending:
        dir_path, expected = pending.pop()
        if not _walk_one(dir_path, expected, root.st_dev, tally, pending):
            break
    return WorkspaceUsage(tally.bytes, tally.entries, tally.truncated)


def _walk_one(
    dir_path: str, expected: os.stat_result, device: int, tally: _Tally, pending: list[tuple[str, os.stat_result]]
) -> bool:
    """List one directory into `tally` and `pending`; False when the entry cap stops the walk."""
    try:
        fd = os.open(dir_path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno not in _GONE_ERRNOS:
            tally.truncated = True  # unreadable (mode 000) or too deep to name: usage unknown
        return True
    try:
        if not os.path.samestat(os.fstat(fd), expected):
            return True  # replaced since it was listed
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # vanished mid-walk
                if not tally.add_entry(st):
                    return False
                if stat.S_ISDIR(st.st_mode) and st.st_dev == device:
                    pending.append((os.path.join(dir_path, entry.name), st))
    except OSError:
        tally.truncated = True
    finally:
        os.close(fd)
    return True


async def measure_async(path: Path, *, max_entries: int) -> WorkspaceUsage:
    return await asyncio.to_thread(measure, path, max_entries=max_entries)


# --- removing -------------------------------------------------------------------------------------------


def clear(path: Path) -> None:
    """Remove everything inside the directory `path` and keep the directory itself (blocking).

    A missing `path` is left missing; a `path` that is a symlink or not a directory raises
    NotADirectoryError (it is neither followed nor touched).
    """
    with _open_parent(path) as parent_fd:
        st = _lstat_at(parent_fd, path.name)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory (left alone)", os.fspath(path))
        with _open_checked(parent_fd, path.name, st) as fd:
            if fd is None:
                raise NotADirectoryError(errno.ENOTDIR, "replaced while opening (left alone)", os.fspath(path))
            _empty(fd)


def remove_entry(dir_fd: int, name: str) -> bool:
    """Remove the entry `name` of the directory `dir_fd`: a link or special file is unlinked, a directory
    removed with everything below it. False when it was already gone."""
    for _ in range(MAX_SWAP_RETRIES):
        st = _lstat_at(dir_fd, name)
        if st is None:
            return False
        if not stat.S_ISDIR(st.st_mode):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                return False
            return True
        with _open_checked(dir_fd, name, st) as fd:
            if fd is not None:
                _empty(fd)
        if fd is None:
            continue  # swapped for something else since the lstat: look again
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        return True
    raise OSError(errno.EAGAIN, "entry keeps being replaced", name)


def _empty(top_fd: int) -> None:
    """Remove everything below `top_fd` with a fixed handful of descriptors, however deep the tree.

    Subdirectories of a top-level directory are first moved up into top (`renameat`), then the emptied
    directory is removed; so a deep tree costs passes, never descriptors, recursion or path length.
    Raises OSError when a pass removes nothing while entries remain.
    """
    while True:
        remaining = 0
        progress = 0
        with os.scandir(top_fd) as entries:
            for entry in entries:
                remaining += 1
                progress += _remove_one_level(top_fd, entry.name)
        if remaining == 0:
            return
        if progress == 0:
            raise OSError(errno.ENOTEMPTY, f"could not empty directory ({remaining} entries remain)")


def _remove_one_level(top_fd: int, name: str) -> int:
    """Unlink `name`, or empty it one level (hoisting its subdirectories into top) and remove it.
    Returns the number of changes made."""
    st = _lstat_at(top_fd, name)
    if st is None:
        return 1
    if not stat.S_ISDIR(st.st_mode):
        with suppress(FileNotFoundError):
            os.unlink(name, dir_fd=top_fd)
        return 1
    changes = 0
    with _open_checked(top_fd, name, st) as fd:
        if fd is None:
            return 0  # replaced meanwhile: the next pass sees what is there now
        with os.scandir(fd) as children:
            for child in children:
                child_st = _lstat_at(fd, child.name)
                if child_st is None:
                    continue
                if stat.S_ISDIR(child_st.st_mode):
                    if child_st.st_mode & OWNER_RWX != OWNER_RWX:
                        # Moving a directory to another parent rewrites its `..`: that needs its w bit.
                        _grant_owner(fd, child.name, child_st)
                    _hoist(fd, child.name, top_fd)
                else:
                    with suppress(FileNotFoundError):
                        os.unlink(child.name, dir_fd=fd)
                changes += 1
    try:
        os.rmdir(name, dir_fd=top_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:  # something appeared meanwhile: next pass
            raise
        return changes
    return changes + 1


def _hoist(src_fd: int, name: str, top_fd: int) -> None:
    for _ in range(MAX_HOIST_NAME_ATTEMPTS):
        target = f"{HOISTED_PREFIX}{secrets.token_hex(8)}"
        try:
            os.rename(name, target, src_dir_fd=src_fd, dst_dir_fd=top_fd)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
    raise OSError(errno.EEXIST, "no free name to move a directory up to")


@contextmanager
def _open_checked(dir_fd: int, name: str, expected: os.stat_result) -> Iterator[int | None]:
    """Open the subdirectory `name` if it is still the one `expected` describes, else yield None.

    The opened directory is given owner rwx where it lacks it (a container may chmod 000 what it made):
    listing and unlinking in it need that, and a non-root host is only its owner.
    """
    fd = _open_dir_at(dir_fd, name, expected)
    if fd is None:
        yield None
        return
    try:
        st = os.fstat(fd)
        if not os.path.samestat(st, expected):
            yield None
            return
        if st.st_mode & OWNER_RWX != OWNER_RWX:
            with suppress(PermissionError):  # root needs no permission bits
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | OWNER_RWX)
        yield fd
    finally:
        os.close(fd)


def _open_dir_at(dir_fd: int, name: str, expected: os.stat_result) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        pass
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return None
        raise
    if not _grant_owner(dir_fd, name, expected):
        return None
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _grant_owner(dir_fd: int, name: str, expected: os.stat_result) -> bool:
    """chmod u+rwx a directory that cannot be opened for reading, through an O_PATH descriptor: the
    /proc magic link names exactly that inode, so a symlink swapped in is never chmodded."""
    try:
        fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return False
        raise
    try:
        if not os.path.samestat(os.fstat(fd), expected):
            return False
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(expected.st_mode) | OWNER_RWX)
    finally:
        os.close(fd)
    return True


@contextmanager
def _open_parent(path: Path) -> Iterator[int]:
    """The directory holding `path`; it is the host's own, so a symlink on the way there is followed."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
