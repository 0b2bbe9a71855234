"""The workspace as a tar stream whose length is known before a byte is sent: the run channel takes a body only
with a Content-Length (the host refuses chunked bodies, which cost its event loop per chunk).

`plan` walks /workspace once and notes what each entry will be (its header and the size of its data) without
reading a file; `PackPlan.stream` then sends exactly that: each file read once, by descriptor, at the size it
had when planned (cut or padded with zeros if it changes meanwhile, as a file that vanished or changed kind
is sent as zeros), so the stream is always `length` bytes. Nothing is staged (/tmp is a small tmpfs).
FIFOs, sockets and devices are skipped; symlinks are stored as links, never followed.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from container.channel_files import LocalFileFailed
from container.workspace_stream import FILE_READ_BYTES
from container.workspace_tar import MAX_MEMBERS, Skips

BLOCK_BYTES = tarfile.BLOCKSIZE
RECORD_BYTES = tarfile.RECORDSIZE
PIECE_BYTES = 256 * 1024  # small entries are gathered into pieces of this size before they are sent
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class _Member:
    """One entry as planned: its header's fields (the header is made again from them, byte for byte)."""

    rel: str
    kind: bytes
    mode: int
    mtime: int
    linkname: str = ""
    size: int = 0

    def header(self) -> bytes:
        info = tarfile.TarInfo(self.rel)
        info.type = self.kind
        info.mode = self.mode
        info.mtime = self.mtime
        info.linkname = self.linkname
        info.size = self.size
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class PackPlan:
    root: Path
    members: tuple[_Member, ...]
    length: int  # bytes of the whole stream, the closing blocks and the record padding included

    def stream(self, skips: Skips) -> Iterator[bytes]:
        """The archive, exactly `length` bytes; a fresh iterator per attempt."""
        pending = bytearray()
        sent = 0
        for piece in self._pieces(skips):
            sent += len(piece)
            if len(piece) >= PIECE_BYTES:
                if pending:
                    yield bytes(pending)
                    pending.clear()
                yield piece
                continue
            pending += piece
            if len(pending) >= PIECE_BYTES:
                yield bytes(pending)
                pending.clear()
        yield bytes(pending) + bytes(self.length - sent)  # the closing blocks and the padding

    def _pieces(self, skips: Skips) -> Iterator[bytes]:
        for member in self.members:
            yield member.header()
            if member.kind == tarfile.REGTYPE:
                yield from _data(os.path.join(self.root, member.rel), member, skips)


def plan(root: Path, skips: Skips) -> PackPlan:
    """Blocking: what the archive of everything below `root` will hold. Over MAX_MEMBERS entries it raises
    LocalFileFailed: nothing is sent, and the host keeps the chat's previous archive."""
    members: list[_Member] = []
    length = 0
    stack: list[tuple[str, str]] = [("", os.fspath(root))]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            with os.scandir(abs_dir) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            skips.add(rel_dir or ".", f"not listed: {exc.strerror}")
            continue
        folders: list[tuple[str, str]] = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            member = _member(entry, rel, skips)
            if member is None:
                continue
            if len(members) >= MAX_MEMBERS:  # the next run's unpack would refuse the archive: it is not sent
                raise LocalFileFailed(OSError(errno.EFBIG, f"the workspace has over {MAX_MEMBERS} entries"))
            members.append(member)
            length += len(member.header()) + member.size + -member.size % BLOCK_BYTES
            if member.kind == tarfile.DIRTYPE:
                folders.append((rel, entry.path))
        stack.extend(reversed(folders))
    end = 2 * BLOCK_BYTES  # two zero blocks end an archive; tar pads it to whole records
    end += -(length + end) % RECORD_BYTES
    return PackPlan(root, tuple(members), length + end)


def pack(root: Path, skips: Skips) -> Iterator[bytes]:
    """The archive of everything below `root`, planned and sent in one go (blocking)."""
    yield from plan(root, skips).stream(skips)


def _member(entry: os.DirEntry[str], rel: str, skips: Skips) -> _Member | None:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None  # vanished meanwhile
    mode, mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    if stat.S_ISDIR(st.st_mode):
        return _Member(rel, tarfile.DIRTYPE, mode, mtime)
    if stat.S_ISLNK(st.st_mode):
        try:
            return _Member(rel, tarfile.SYMTYPE, mode, mtime, linkname=os.readlink(entry.path))
        except OSError as exc:
            skips.add(rel, f"link not read: {exc.strerror}")
            return None
    if stat.S_ISREG(st.st_mode):
        return _Member(rel, tarfile.REGTYPE, mode, mtime, size=st.st_size)
    skips.add(rel, "a FIFO, socket or device is not kept")
    return None


def _data(path: str, member: _Member, skips: Skips) -> Iterator[bytes]:
    """The file's planned `size` bytes, then its padding to whole blocks; zeros for what it no longer has."""
    left = member.size
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        fd = -1
        skips.add(member.rel, f"not read: {exc.strerror} (sent as zeros)")
    try:
        if fd >= 0 and not stat.S_ISREG(os.fstat(fd).st_mode):
            skips.add(member.rel, "replaced while it was packed (sent as zeros)")
            os.close(fd)
            fd = -1
        while left:
            try:
                chunk = os.read(fd, min(FILE_READ_BYTES, left)) if fd >= 0 else b""
            except OSError:
                chunk = b""
            if not chunk:  # shrank, failed or gone: the header promised `size` bytes
                if fd >= 0:
                    skips.add(member.rel, "changed while it was packed (padded with zeros)")
                    os.close(fd)
                    fd = -1
                chunk = bytes(min(FILE_READ_BYTES, left))
            left -= len(chunk)
            yield chunk
        yield bytes(-member.size % BLOCK_BYTES)
    finally:
        if fd >= 0:
            os.close(fd)
