"""Where the senses read an image from: a photo a subagent sent is the host's own copy (DATA_DIR/files/out, which
no container can write: the run channel took its bytes), any other file is downloaded from the channel."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from bot.senses.seen_images import FileDownloader
from core.store.chat_files import FileUnavailable, parse_sent_file_id


class SentOrPosted:
    """A FileDownloader: `sent:<run>/<name>` ids from the host's copies under `out_dir`, others from `channel`."""

    def __init__(self, channel: FileDownloader, out_dir: Path) -> None:
        self._channel = channel
        self._out_dir = out_dir

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        sent = parse_sent_file_id(file_id)
        if sent is None:
            return await self._channel.download_file(file_id, max_bytes)
        run_id, name = sent
        return await asyncio.to_thread(_read_kept, self._out_dir / run_id / name, max_bytes)


def _read_kept(path: Path, max_bytes: int) -> bytes:
    """The copy's bytes, up to `max_bytes`: a regular file, opened without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        raise FileUnavailable("its copy is no longer kept (DATA_RETENTION_DAYS)") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise FileUnavailable("its copy is not a regular file")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileUnavailable(f"it is over the limit of {max_bytes} bytes")
    return data
