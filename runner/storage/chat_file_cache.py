"""Chat files on the host: downloaded when a run needs one, once per platform file, into host-only storage
(`DATA_DIR/files/in`, which no container mounts). A run's channel serves them from here.

Two runs needing the same file at once share one download; a copy on disk is used again (and its time
touched, so retention keeps what is in use). A download that fails leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core.logging import get_logger
from core.store.chat_files import ChatFile, FileUnavailable
from runner.runs.file_source import FileSource

log = get_logger(__name__)

FILES_DIR_MODE = 0o700
FILE_MODE = 0o600
KEY_CHARS = 40  # of a sha256: a file name that no platform id can turn into a path


@dataclass(frozen=True, slots=True)
class LocalCopy:
    """A chat file's host-side copy, and its size as measured or written (no second look at the disk)."""

    path: Path
    size_bytes: int


class ChatFileCache:
    def __init__(self, files_dir: Path, source: FileSource | None) -> None:
        self._dir = files_dir
        self._source = source  # None: this process has no channel to download from (a tool, a test)
        self._downloads: dict[str, asyncio.Task[LocalCopy]] = {}

    def path_for(self, file: ChatFile) -> Path:
        return self._dir / copy_name(file.file_unique_id)

    async def local_copy(self, file: ChatFile, max_bytes: int) -> LocalCopy:
        """The file's host-side copy and its size, downloading it first if there is none; FileUnavailable says
        why not."""
        path = self.path_for(file)
        size = await asyncio.to_thread(_touch_size, path)
        if size is not None and size <= max_bytes:
            return LocalCopy(path, size)
        running = self._downloads.get(path.name)
        if running is None:
            running = asyncio.create_task(self._download(file, path, max_bytes), name=f"download-{file.ref}")
            self._downloads[path.name] = running
            running.add_done_callback(lambda done: self._finished(path.name, done))
        # Shielded: a run cancelled while it waits does not cancel another run's download of the same file.
        return await asyncio.shield(running)

    def _finished(self, key: str, done: asyncio.Task[LocalCopy]) -> None:
        self._downloads.pop(key, None)
        if not done.cancelled():
            done.exception()  # retrieved: every run that waited for it was cancelled meanwhile

    async def _download(self, file: ChatFile, path: Path, max_bytes: int) -> LocalCopy:
        if self._source is None:
            raise FileUnavailable("files cannot be downloaded in this process")
        data = await self._source.download_file(file.file_id, max_bytes)
        if len(data) > max_bytes:
            raise FileUnavailable(f"it has {len(data)} bytes, over the limit of {max_bytes}")
        await asyncio.to_thread(_write_atomic, path, data)
        log.info("chat_file_downloaded", file=file.ref, chat_id=file.chat_id, size_bytes=len(data))
        return LocalCopy(path, len(data))


def copy_name(file_unique_id: str) -> str:
    """The name of a platform file's copy in the cache (retention keeps the copies live runs were given)."""
    return hashlib.sha256(file_unique_id.encode()).hexdigest()[:KEY_CHARS]


def _touch_size(path: Path) -> int | None:
    """The copy's size, its time set to now (retention prunes copies unused for long); None: there is none."""
    try:
        os.utime(path)
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=FILES_DIR_MODE)
    fd, temp = tempfile.mkstemp(prefix=".download-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, FILE_MODE)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
