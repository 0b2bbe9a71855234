"""Posted images made ready for the model once per platform file (`file_unique_id`) and kept on disk, host-side
(`DATA_DIR/files/seen`, which no container mounts): the prepared JPEG, or the reason it was refused, so a bomb
is downloaded and refused once, not at every turn that has it in its window. Retention removes what was not
used for DATA_RETENTION_DAYS (each use touches its time).

Downloads and decodes run off the event loop: the download is the channel's (async), the decode runs in a
thread, one at a time in the process so memory stays bounded however many chats post photos at once.
Two turns wanting the same image share one preparation.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bot.senses.image_prep import ImageRefused, PreparedImage, image_size, prepare_image
from core.logging import get_logger
from core.store.chat_files import ChatFile, FileUnavailable, size_text

log = get_logger(__name__)

# Telegram's photos are at most 10 MB; a bigger image document is refused unread (its declared size) or cut off.
MAX_IMAGE_DOWNLOAD_BYTES = 10 * 1024 * 1024
KEY_CHARS = 40
# Images downloaded at once, all chats together (each up to MAX_IMAGE_DOWNLOAD_BYTES held until decoded).
MAX_CONCURRENT_DOWNLOADS = 4
IMAGE_SUFFIX = ".jpg"
REFUSED_SUFFIX = ".refused"
MAX_REASON_BYTES = 400
DIR_MODE = 0o700
FILE_MODE = 0o600


class FileDownloader(Protocol):
    """The channel's download of a posted file by its id (bot.channels.base.Channel has it)."""

    async def download_file(self, file_id: str, max_bytes: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Seen:
    """An image as the model is shown it, or why it is not (`image` None, `refused` the reason)."""

    file: ChatFile
    image: PreparedImage | None = None
    refused: str | None = None


class SeenImages:
    def __init__(self, seen_dir: Path, downloader: FileDownloader) -> None:
        self._dir = seen_dir
        self._downloader = downloader
        self._preparing: dict[str, asyncio.Task[Seen]] = {}
        self._decode = asyncio.Semaphore(1)
        self._downloads = asyncio.Semaphore(MAX_CONCURRENT_DOWNLOADS)

    def key(self, file: ChatFile) -> str:
        return seen_key(file.file_unique_id)

    async def see(self, file: ChatFile) -> Seen:
        """The prepared image (from disk when it was made before), or the refusal's reason."""
        key = self.key(file)
        running = self._preparing.get(key)
        if running is None:
            running = asyncio.create_task(self._see(file, key), name=f"see-{file.ref}")
            self._preparing[key] = running
            running.add_done_callback(lambda _: self._preparing.pop(key, None))
        # Shielded: a turn cancelled by a merge does not cancel the preparation the next turn waits for.
        return await asyncio.shield(running)

    async def _see(self, file: ChatFile, key: str) -> Seen:
        kept = await asyncio.to_thread(_read_kept, self._dir, key)
        if kept is not None:
            return _seen(file, kept)
        if file.size_bytes is not None and file.size_bytes > MAX_IMAGE_DOWNLOAD_BYTES:
            most = size_text(MAX_IMAGE_DOWNLOAD_BYTES)
            reason = f"it has {size_text(file.size_bytes)}, over the {most} images are read up to"
            return await self._refuse(file, key, reason)
        async with self._downloads:  # held until decoded: the bytes in memory are bounded too
            try:
                data = await self._downloader.download_file(file.file_id, MAX_IMAGE_DOWNLOAD_BYTES)
            except FileUnavailable as exc:
                # Not kept: Telegram may hand it out next time (a failed download is not the file's fault).
                return Seen(file, refused=f"it could not be downloaded: {exc}")
            async with self._decode:
                try:
                    prepared = await asyncio.to_thread(prepare_image, data)
                except ImageRefused as exc:
                    return await self._refuse(file, key, str(exc))
            del data
        await asyncio.to_thread(_keep, self._dir, key + IMAGE_SUFFIX, prepared.data)
        log.info(
            "image_prepared",
            file=file.ref,
            chat_id=file.chat_id,
            source=f"{prepared.source_width}x{prepared.source_height} {prepared.source_format}",
            sent=f"{prepared.width}x{prepared.height}",
            size_bytes=len(prepared.data),
        )
        return Seen(file, image=prepared)

    async def _refuse(self, file: ChatFile, key: str, reason: str) -> Seen:
        log.info("image_refused", file=file.ref, chat_id=file.chat_id, reason=reason)
        await asyncio.to_thread(_keep, self._dir, key + REFUSED_SUFFIX, reason.encode()[:MAX_REASON_BYTES])
        return Seen(file, refused=reason)


def seen_key(file_unique_id: str) -> str:
    """The file name stem of a platform file's prepared image: no platform id can turn it into a path."""
    return hashlib.sha256(b"seen\0" + file_unique_id.encode()).hexdigest()[:KEY_CHARS]


def _seen(file: ChatFile, kept: tuple[str, bytes]) -> Seen:
    suffix, data = kept
    if suffix == REFUSED_SUFFIX:
        return Seen(file, refused=data.decode(errors="replace"))
    size = image_size(data) or (0, 0)
    return Seen(file, image=PreparedImage(data, size[0], size[1], "JPEG", size[0], size[1]))


def _read_kept(seen_dir: Path, key: str) -> tuple[str, bytes] | None:
    """What was kept for the file, its time touched (retention keeps what is in use); None: nothing yet."""
    for suffix in (IMAGE_SUFFIX, REFUSED_SUFFIX):
        path = seen_dir / (key + suffix)
        try:
            data = path.read_bytes()
            os.utime(path)
        except FileNotFoundError:
            continue
        return suffix, data
    return None


def _keep(seen_dir: Path, name: str, data: bytes) -> None:
    seen_dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    fd, temp = tempfile.mkstemp(prefix=".seen-", dir=seen_dir)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temp, FILE_MODE)
        os.replace(temp, seen_dir / name)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
