"""A chat's stored workspace unpacked into /workspace, in the channel's thread (container/workspace_pack.py
makes the archive a run sends back).

The archive the host hands back is what some earlier run of the chat sent: hostile input. `unpack` therefore
places every entry itself, through directory descriptors opened with O_NOFOLLOW from the workspace down, so no
entry is ever written through a link, wherever the links in the archive point (they are kept as links). It
refuses absolute names, `..`, devices, FIFOs and sparse files, and skips each such entry with a reason. The
image's Python (3.11.2) has no `tarfile.data_filter`; this does not rely on it. What tarfile holds in memory is
bounded (container/workspace_stream.py), and so is the number of members: past it, or past a member's header
bound, the archive is refused whole (ArchiveRefused), which the run reports (container/workspace_sync.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from container.channel_files import LocalFileFailed
from container.workspace_stream import FILE_READ_BYTES, ArchiveRefused, DownloadCut, StreamBody, TarSource

T = TypeVar("T")

MAX_NAME_BYTES = 4096  # PATH_MAX: a longer name could not be opened anyway
# Files, folders and links in one archive, as a mounted workspace counts WORKSPACE_MAX_ENTRIES
# (runner/storage/workspaces.py): pack sends no more, and unpack refuses an archive with more.
MAX_MEMBERS = 200_000
MAX_SKIPS_SHOWN = 10
DIR_MODE = 0o755
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# A folder on an entry's way is a link, a file, or missing: the archive is inconsistent or hostile; skip it.
_REFUSED_WAY = frozenset({errno.ELOOP, errno.ENOTDIR, errno.ENOENT})
# What else an entry's own name or kind makes the file system refuse: the entry is skipped, the run goes on.
_REFUSED_ENTRY = _REFUSED_WAY | {errno.EEXIST, errno.ENAMETOOLONG, errno.EMLINK}
# What tarfile raises on some hostile headers besides its own errors (a number out of range, a name it cannot
# decode, a sparse map that does not add up): the archive is not one pack made.
_PARSE_ERRORS = (ValueError, OverflowError, EOFError, IndexError, RecursionError)


@dataclass(slots=True)
class Skips:
    """Entries left out, and why: the first few named, all counted."""

    count: int = 0
    shown: list[str] = field(default_factory=list)

    def add(self, name: str, reason: str) -> None:
        self.count += 1
        if len(self.shown) < MAX_SKIPS_SHOWN:
            self.shown.append(f"{name[:200]!r}: {reason}")

    def describe(self) -> str:
        more = f" and {self.count - len(self.shown)} more" if self.count > len(self.shown) else ""
        return "; ".join(self.shown) + more


# --- unpack ---------------------------------------------------------------------------------------------


def unpack(
    body: StreamBody, root: Path, skips: Skips, *, keep: frozenset[str] = frozenset(), seen: set[str] | None = None
) -> int:
    """Write the archive streamed by `body` into the folder `root`; returns the entries placed. `keep`: names
    (relative, `a/b`) left as they are in `root`, never placed; `seen` gathers every name the archive holds.

    tarfile.TarError: the archive is not a tar stream, or past a bound (ArchiveRefused). LocalFileFailed: the
    workspace could not be written. DownloadCut: the download broke off."""
    root_fd = _local(lambda: os.open(root, _DIR_FLAGS))
    source = TarSource(body)
    placed = members = 0
    try:
        with source.headers():
            tar = tarfile.TarFile(fileobj=source, mode="r", encoding="utf-8", errors="surrogateescape")
        with tar:
            while True:
                with source.headers():
                    member = tar.next()
                if member is None:
                    break
                # tarfile keeps every member it read (a million entries, a million objects); typeshed omits the list.
                tar.members.clear()  # type: ignore[attr-defined]
                members += 1
                _check_bounds(tar, members)
                name = relative(member.name)
                if name is not None and seen is not None:
                    seen.add(name)
                if name is not None and name in keep:
                    continue
                reason = _place(tar, member, root_fd)
                if reason is None:
                    placed += 1
                else:
                    skips.add(member.name, reason)
        source.drain()
    except _PARSE_ERRORS as exc:
        raise ArchiveRefused(f"a header tarfile cannot read: {type(exc).__name__}: {str(exc)[:200]}") from exc
    finally:
        os.close(root_fd)
    return placed


def _check_bounds(tar: tarfile.TarFile, members: int) -> None:
    if members > MAX_MEMBERS:
        raise ArchiveRefused(f"more than {MAX_MEMBERS} files, folders and links")
    # A global header's keys would apply to, and be copied into, every later member: pack writes none.
    if tar.pax_headers:
        raise ArchiveRefused("a global pax header, which no workspace archive has")


def empty(root: Path) -> None:
    """Remove everything in `root` (a retried download starts over); links are removed, never followed."""
    try:
        with os.scandir(root) as listing:
            entries = list(listing)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    except OSError as exc:
        raise LocalFileFailed(exc) from exc


def _place(tar: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int) -> str | None:
    """Create `member` below `root_fd`; the reason it was skipped, or None."""
    parts = _parts(member.name)
    if parts is None:
        return "an absolute name, `..`, or too long: outside the workspace"
    if not parts:
        return None if member.isdir() else "no name"
    if member.issparse() or not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "a device, FIFO, sparse or other special file is not restored"
    try:
        parent = _open_way(root_fd, parts[:-1], create=True)
    except OSError as exc:
        if exc.errno in _REFUSED_WAY:
            return "a folder on its way is a link or a file"
        if exc.errno in _REFUSED_ENTRY:
            return f"a folder on its way could not be made: {exc.strerror}"
        raise LocalFileFailed(exc) from exc
    try:
        return _make(tar, member, parts[-1], parent, root_fd)
    except DownloadCut:
        raise
    except OSError as exc:
        if exc.errno in _REFUSED_ENTRY:
            return f"not placed: {exc.strerror}"
        raise LocalFileFailed(exc) from exc
    finally:
        os.close(parent)


def _make(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, parent: int, root_fd: int) -> str | None:
    if member.isdir():
        try:
            os.mkdir(name, DIR_MODE, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                return "a file or link of that name came first"
        return None
    if not _clear_name(parent, name):
        return "a folder of that name came first"
    if member.issym():
        if not member.linkname or "\x00" in member.linkname:
            return "a link to nothing"
        os.symlink(member.linkname, name, dir_fd=parent)  # kept as the archive says; nothing is written through it
        return None
    if member.islnk():
        return _hard_link(member.linkname, name, parent, root_fd)
    _write_file(tar, member, name, parent)
    return None


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, parent: int) -> None:
    source = tar.extractfile(member)
    if source is None:
        raise tarfile.ReadError(f"{member.name[:200]!r} has no data")
    fd = os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=parent)
    try:
        written = 0
        while chunk := source.read(FILE_READ_BYTES):
            _write_all(fd, chunk)
            written += len(chunk)
        if written != member.size:
            raise tarfile.ReadError(f"{member.name[:200]!r} ended after {written} of {member.size} bytes")
        # As tarfile's data filter: no setuid or group/other write bits, always the owner's read and write.
        mode = member.mode & 0o755 | 0o600
        os.fchmod(fd, mode if member.mode & 0o100 else mode & ~0o111)
        with contextlib.suppress(OverflowError, ValueError):  # a time no file can have: it keeps the present one
            os.utime(fd, (member.mtime, member.mtime))
    finally:
        os.close(fd)


def _hard_link(target: str, name: str, parent: int, root_fd: int) -> str | None:
    parts = _parts(target)
    if not parts:
        return "a hard link to outside the workspace"
    source_dir = _open_way(root_fd, parts[:-1], create=False)
    try:
        if not stat.S_ISREG(os.stat(parts[-1], dir_fd=source_dir, follow_symlinks=False).st_mode):
            return "a hard link to something that is not a file"
        os.link(parts[-1], name, src_dir_fd=source_dir, dst_dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(source_dir)
    return None


def relative(name: str) -> str | None:
    """An archive's name as the workspace's relative name (`a/b`); None for one that leaves it, or the root."""
    parts = _parts(name)
    return "/".join(parts) if parts else None


def open_way(root_fd: int, folders: list[str]) -> int:
    """The existing folder `folders` below `root_fd`, never through a link (OSError when one is on the way)."""
    return _open_way(root_fd, folders, create=False)


def _parts(name: str) -> list[str] | None:
    """The name's folders and last part, relative to the workspace; None for a name that leaves it."""
    if name.startswith("/") or "\x00" in name or len(os.fsencode(name)) > MAX_NAME_BYTES:
        return None
    parts = [part for part in name.split("/") if part not in ("", ".")]
    return None if ".." in parts else parts


def _open_way(root_fd: int, folders: list[str], *, create: bool) -> int:
    """The folder `folders` below `root_fd`, each step opened with O_NOFOLLOW: a link on the way raises ELOOP
    or ENOTDIR, never leads elsewhere."""
    fd = os.dup(root_fd)
    try:
        for folder in folders:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, DIR_MODE, dir_fd=fd)
            step = os.open(folder, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _clear_name(parent: int, name: str) -> bool:
    """Make room for a new entry `name`: an earlier file or link of that name goes; False for a folder."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if stat.S_ISDIR(st.st_mode):
        return False
    os.unlink(name, dir_fd=parent)
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _local(work: Callable[[], T]) -> T:
    try:
        return work()
    except OSError as exc:
        raise LocalFileFailed(exc) from exc
