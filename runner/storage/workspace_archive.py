"""A chat's workspace kept on the host as one opaque archive, for runs that share no folder with it (every run on
Kubernetes; an archived chat's on Docker, runner/storage/workspace_placement.py): the bytes a run's container
PUT, served back whole to the chat's next run, never opened here.

Host-only: DATA_DIR/workspace-archives/<chat folder>.tar, a folder no container mounts. An upload is written to
a new file whose name the host chose, counted against WORKSPACE_QUOTA_MB (read at each upload's start) as it
is written, and renamed over the stored archive only once complete: a refused, cut or failed upload leaves
the previous archive. An upload names the version of the archive its run started from (None: an agent from
before versions, which replaces whatever is stored): it is kept only if that is still the chat's archive, checked
and renamed under the folder's lock (a compare-and-swap), else refused as stale, so of two runs of a chat at once
the second push never silently drops the first's (its run merges and pushes again, container/workspace_rebase.py).
Every file call runs in a thread, in chunks of at most WRITE_BATCH_BYTES.

An archive a run could not unpack is moved aside, unopened, to DATA_DIR/workspace-archives/unreadable/<chat
folder>.<UTC time>.tar for an admin (the newest MAX_KEPT_ASIDE of a chat are kept), and only while it is the very
file the run was served: the commit's rename and that check take the folder's lock (flock), so another run's
newer archive is never the one moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from container.contract import EMPTY_VERSION
from core.logging import get_logger
from runner.channel.workspace_desk import ArchiveIdentity, AsideOutcome, OverQuota, StaleBase, over_quota_reason
from runner.storage.paths import DataPaths
from runner.storage.workspace_usage import WorkspaceUsage

log = get_logger(__name__)

ARCHIVES_DIR_NAME = "workspace-archives"
UNREADABLE_DIR_NAME = "unreadable"  # archives runs could not unpack, kept for an admin
MAX_KEPT_ASIDE = 3  # per chat, each at most WORKSPACE_QUOTA_MB: older ones are removed
NS_PER_SECOND = 1_000_000_000
ARCHIVE_SUFFIX = ".tar"
PARTIAL_SUFFIX = ".part"  # an upload in progress: `.<folder>.<token>.part`, hidden beside the archives
DIR_MODE = 0o700
FILE_MODE = 0o600
BYTES_PER_MB = 1024 * 1024
WRITE_BATCH_BYTES = 1024 * 1024  # bytes gathered before one write in a thread
TOKEN_BYTES = 8
FOLDER_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")  # core.store.chats.folder_for_chat's names
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def archives_dir(paths: DataPaths) -> Path:
    """Where the archives live: the host's alone (a DataPaths property once paths.py takes it)."""
    return paths.data_dir / ARCHIVES_DIR_NAME


class StoredReader:
    """The stored archive opened once: a rename over it meanwhile does not change what is read."""

    def __init__(self, fd: int, st: os.stat_result) -> None:
        self._fd = fd
        self._offset = 0
        self.size_bytes = st.st_size
        self.identity = identity_of(st)

    async def read(self, max_bytes: int) -> bytes:
        chunk = await asyncio.to_thread(os.pread, self._fd, max_bytes, self._offset)
        self._offset += len(chunk)
        return chunk

    async def close(self) -> None:
        await asyncio.to_thread(os.close, self._fd)


class Upload:
    """One upload in its own file (`partial`) until `commit` renames it to `target`."""

    def __init__(self, fd: int, partial: Path, target: Path, quota_bytes: int) -> None:
        self._fd = fd
        self._partial = partial
        self._target = target
        self._quota_bytes = quota_bytes
        self._batch = bytearray()
        self._written = 0  # counted as received, batched or written
        self._closed = False
        self._committed = False
        # A write still running in its thread when the handler is cancelled finishes before abandon closes
        # the descriptor: never a write to a number reused meanwhile.
        self._lock = threading.Lock()

    async def write(self, chunk: bytes) -> None:
        if self._written + len(chunk) > self._quota_bytes:
            raise OverQuota(over_quota_reason(self._quota_bytes, self._quota_bytes))
        self._written += len(chunk)
        self._batch += chunk
        if len(self._batch) >= WRITE_BATCH_BYTES:
            batch, self._batch = bytes(self._batch), bytearray()
            await asyncio.to_thread(self._write, batch)

    async def commit(self, base: str | None = None) -> int:
        """Rename it over the chat's archive if that is still version `base` (None: whatever it is); StaleBase
        (the upload kept for `abandon`) when another commit replaced it since."""
        batch, self._batch = bytes(self._batch), bytearray()
        await asyncio.to_thread(self._finish, batch, base)
        return self._written

    def _write(self, batch: bytes) -> None:
        with self._lock:
            if self._closed:
                raise OSError("the upload was abandoned")
            _write_all(self._fd, batch)

    def _finish(self, batch: bytes, base: str | None) -> None:
        with self._lock:
            if self._closed:
                raise OSError("the upload was abandoned")
            _write_all(self._fd, batch)
            os.fsync(self._fd)
            # The check of the base and the rename under the folder's lock: a compare-and-swap per chat, so of two
            # runs' pushes based on one archive only the first is kept and the other is told (StaleBase).
            with _locked(self._target.parent):
                current = _stat(self._target)
                if base is not None and (EMPTY_VERSION if current is None else identity_of(current).version) != base:
                    raise StaleBase(base)
                # Modified after the one it replaces, so its version is new even with an inode number used again.
                floor_ns = 0 if current is None else current.st_mtime_ns + 1
                now_ns = max(time.time_ns(), floor_ns)
                os.utime(self._fd, ns=(now_ns, now_ns))
                self._close()
                # The rename is the commit: a reader sees the old archive or this one, never a mix.
                os.replace(self._partial, self._target)
            self._committed = True
        _sync_dir(self._target.parent)

    async def abandon(self) -> None:
        await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        with self._lock:
            self._close()
            if not self._committed:
                with contextlib.suppress(FileNotFoundError):
                    self._partial.unlink()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)


class ChatArchive:
    """One chat's archive: the `ArchiveStore` of runner/channel/workspace_desk.py."""

    def __init__(self, directory: Path, folder: str, quota_mb: Callable[[], int]) -> None:
        if not FOLDER_PATTERN.fullmatch(folder):
            raise ValueError(f"{folder[:80]!r} is not a chat folder name")
        self._directory = directory
        self._folder = folder
        self._quota_mb = quota_mb

    @property
    def path(self) -> Path:
        return self._directory / f"{self._folder}{ARCHIVE_SUFFIX}"

    def quota_bytes(self) -> int:
        return self._quota_mb() * BYTES_PER_MB

    async def open(self) -> StoredReader | None:
        return await asyncio.to_thread(self._open)

    def _open(self) -> StoredReader | None:
        try:
            fd = os.open(self.path, _READ_FLAGS)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{self.path} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return StoredReader(fd, st)

    async def begin(self) -> Upload:
        quota = self.quota_bytes()
        return await asyncio.to_thread(self._begin, quota)

    def _begin(self, quota_bytes: int) -> Upload:
        self._directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        partial = self._directory / f".{self._folder}.{secrets.token_hex(TOKEN_BYTES)}{PARTIAL_SUFFIX}"
        fd = os.open(partial, _CREATE_FLAGS, FILE_MODE)
        return Upload(fd, partial, self.path, quota_bytes)

    async def version(self) -> str:
        """The stored archive's version now (EMPTY_VERSION: none): a push based on another is stale already."""
        st = await asyncio.to_thread(_stat, self.path)
        return EMPTY_VERSION if st is None else identity_of(st).version

    async def size_bytes(self) -> int | None:
        """The stored archive's size; None when there is none."""
        return await asyncio.to_thread(self._size)

    def _size(self) -> int | None:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    async def clear(self) -> bool:
        """Forget the stored archive (the chat's next run starts empty); False when there was none."""
        return await asyncio.to_thread(self._unlink)

    async def set_aside(self, served: ArchiveIdentity, reason: str) -> AsideOutcome:
        """Move the stored archive aside if it is still `served` (the file a run was served)."""
        outcome, kept = await asyncio.to_thread(self._set_aside, served)
        if kept is not None:
            log.warning("workspace_archive_set_aside", folder=self._folder, kept=str(kept), reason=reason)
        return outcome

    def _set_aside(self, served: ArchiveIdentity) -> tuple[AsideOutcome, Path | None]:
        aside = self._directory / UNREADABLE_DIR_NAME
        try:
            with _locked(self._directory):
                try:
                    st = os.stat(self.path, follow_symlinks=False)
                except FileNotFoundError:
                    return AsideOutcome.GONE, None
                if identity_of(st) != served:
                    return AsideOutcome.REPLACED, None
                aside.mkdir(mode=DIR_MODE, exist_ok=True)
                now_ns = time.time_ns()
                stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_ns // NS_PER_SECOND))
                kept = aside / f"{self._folder}.{stamp}.{now_ns % NS_PER_SECOND:09d}Z{ARCHIVE_SUFFIX}"
                os.rename(self.path, kept)
        except FileNotFoundError:  # no archives folder: the chat never had one
            return AsideOutcome.GONE, None
        _sync_dir(self._directory)
        for old in self._kept_aside()[:-MAX_KEPT_ASIDE]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
        return AsideOutcome.SET_ASIDE, kept

    def _kept_aside(self) -> list[Path]:
        """The archives of this chat set aside, oldest first (their names start with the time)."""
        try:
            names = os.listdir(self._directory / UNREADABLE_DIR_NAME)
        except FileNotFoundError:
            return []
        prefix = f"{self._folder}."  # a folder name has no dot: `chat_1.` is never `chat_10.`
        aside = self._directory / UNREADABLE_DIR_NAME
        return [aside / name for name in sorted(names) if name.startswith(prefix) and name.endswith(ARCHIVE_SUFFIX)]

    async def kept_aside(self) -> int:
        """How many archives of this chat that runs could not unpack are kept aside."""
        return len(await asyncio.to_thread(self._kept_aside))

    async def drop_kept_aside(self) -> int:
        """Remove the archives kept aside (`/workspace clear`); their count."""
        return await asyncio.to_thread(self._drop_kept_aside)

    def _drop_kept_aside(self) -> int:
        removed = 0
        for kept in self._kept_aside():
            with contextlib.suppress(FileNotFoundError):
                kept.unlink()
                removed += 1
        return removed

    def _unlink(self) -> bool:
        # Under the lock a commit's compare-and-swap takes: a push that checked its base against the archive
        # before this cannot rename it back after "Cleared"; one after finds no archive and is stale.
        try:
            with _locked(self._directory):
                self.path.unlink()
        except FileNotFoundError:  # no archive, or no archives folder: the chat never had one
            return False
        return True


class WorkspaceArchives:
    """Every chat's archive under DATA_DIR; no state of its own, so building more than one is harmless."""

    def __init__(self, paths: DataPaths, quota_mb: Callable[[], int]) -> None:
        self._directory = archives_dir(paths)
        self._quota_mb = quota_mb  # read at each upload's start: WORKSPACE_QUOTA_MB as it is then

    def chat(self, folder: str) -> ChatArchive:
        return ChatArchive(self._directory, folder, self._quota_mb)

    async def usage(self, folder: str) -> WorkspaceUsage:
        """The chat's workspace usage on this backend: its stored archive's size (one entry), as `/workspace`
        and the quota watch measure a mounted workspace."""
        size = await self.chat(folder).size_bytes()
        return WorkspaceUsage(bytes=size or 0, entries=0 if size is None else 1, truncated=False)

    async def sweep_partial(self) -> int:
        """Remove uploads a previous process left unfinished (call at start-up, before runs); their count."""
        return await asyncio.to_thread(self._sweep)

    def _sweep(self) -> int:
        removed = 0
        try:
            entries = list(os.scandir(self._directory))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if entry.name.startswith(".") and entry.name.endswith(PARTIAL_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
        return removed


def identity_of(st: os.stat_result) -> ArchiveIdentity:
    return ArchiveIdentity(
        device=st.st_dev,
        inode=st.st_ino,
        size_bytes=st.st_size,
        modified_ns=st.st_mtime_ns,
        changed_ns=st.st_ctime_ns,
    )


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """The archives folder's lock, held by a commit's rename and by a set-aside's check and move. An flock on a
    descriptor of one's own: threads of this process exclude each other as other processes do."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _stat(path: Path) -> os.stat_result | None:
    """The stored archive's stat, never through a link; None when there is none."""
    try:
        return os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_dir(directory: Path) -> None:
    """The rename survives a crash once the folder is synced."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
