"""Files on the run API: `GET /run/files/<index>` serves an offered file from host-only storage, and
`POST /run/files` takes one file a run sends (multipart: a `meta` part, then a `file` part).

An upload is bounded before and while it is read: a declared length is required and capped, the body is read
within the rules of runner/channel/multipart_bounds.py (no preamble, a few lines outside its parts), the meta
part is measured and validated like every body, the file part is counted as it streams to a host-chosen
path (written in a thread, never on the event loop), and what it is, photo or document, is decided from
its first bytes. Anything malformed counts against the run's invalid requests; nothing of a refused
upload is kept.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import BinaryIO, Protocol

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import BadHttpMessage

from container.protocol import MAX_FILE_META_BYTES, FileMeta
from core.logging import get_logger
from runner.channel import bounded_json
from runner.channel.bounded_json import BodyRefused
from runner.channel.channel_answers import INVALID_STATUS, ChannelRefused, answer
from runner.channel.multipart_bounds import bounded_multipart
from runner.channel.photo_kind import PHOTO_HEAD_BYTES, photo_of
from runner.channel.run_file_desk import ReceivedFile

log = get_logger(__name__)

READ_CHUNK_BYTES = 64 * 1024
WRITE_BATCH_BYTES = 1024 * 1024  # bytes gathered before one write in a thread
MULTIPART_OVERHEAD_BYTES = 8 * 1024  # boundaries and part headers around the meta and the file
MAX_META_VALUES = 16
PART_HEADERS = frozenset({"content-disposition", "content-type"})
FILE_MODE = 0o600


class FileEndpoint(Protocol):
    """A run's files, as its endpoint hands them out and takes them in (runner/channel/run_file_desk.py)."""

    @property
    def max_file_bytes(self) -> int: ...

    def offered_file(self, index: int) -> Path:
        """The host path of offered file `index`; ChannelRefused when there is none."""

    async def begin_upload(self, meta: FileMeta) -> Path | None:
        """Where to write an upload's bytes (a new host path); None: it was sent already (a retry)."""

    async def file_received(self, meta: FileMeta, received: ReceivedFile) -> str:
        """The bytes are written: record and send the file; the answer's detail, or ChannelRefused."""

    async def abandon_upload(self, target: Path) -> None:
        """The upload failed: its bytes are removed."""

    def invalid(self, status: int, reason: str) -> None: ...


async def serve_offered(endpoint: FileEndpoint, request: web.Request, index_text: str) -> web.StreamResponse:
    if not (index_text.isascii() and index_text.isdigit()) or len(index_text) > 3:
        return answer(404, False, f"{index_text[:20]!r} is not the index of an offered file")
    try:
        path = endpoint.offered_file(int(index_text))
    except ChannelRefused as exc:
        return answer(exc.status, False, exc.reason)
    # The path is the host's own (DATA_DIR/files/in); aiohttp opens and sends it off the event loop.
    return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})


async def receive_file(endpoint: FileEndpoint, request: web.Request) -> web.Response:
    limit = endpoint.max_file_bytes + MAX_FILE_META_BYTES + MULTIPART_OVERHEAD_BYTES
    if request.content_length is None:
        return answer(411, False, "a file upload needs a Content-Length")
    if request.content_length > limit:
        # The tool measures a file before it sends it (container/tools.py): only another client sends one too big.
        reason = f"the upload is over the limit of {endpoint.max_file_bytes} bytes a file"
        endpoint.invalid(413, reason)
        return answer(413, False, reason)
    target: Path | None = None
    try:
        reader = bounded_multipart(request)
        meta = await _meta(await _part(reader, "meta"))
        target = await endpoint.begin_upload(meta)
        if target is None:
            return answer(200, True, "already sent")
        received = await _write(await _part(reader, "file"), target, endpoint.max_file_bytes)
        # The closing boundary must follow: a third part, or a body cut off before its end, is not an upload.
        if await reader.next() is not None:
            raise ChannelRefused(INVALID_STATUS, "not a valid file upload: nothing may follow the `file` part")
        detail = await endpoint.file_received(meta, received)
        target = None  # kept: the outbox sends it from there
        return answer(200, True, detail)
    except ChannelRefused as exc:
        if exc.invalid or exc.status == 413:
            endpoint.invalid(exc.status, exc.reason)
        return answer(exc.status, False, exc.reason)
    # aiohttp's multipart parser on malformed input; BadHttpMessage: a part's header line too long, too many
    # of them, or a body that ended before its Content-Length.
    except (ValueError, AssertionError, RuntimeError, BadHttpMessage) as exc:
        reason = f"not a valid file upload: {str(exc)[:200]}"
        endpoint.invalid(INVALID_STATUS, reason)
        return answer(INVALID_STATUS, False, reason)
    except OSError as exc:  # the host's disk (full, failing), or the container hung up mid-upload
        log.warning("run_file_not_kept", error=str(exc))
        return answer(507, False, "the host could not keep the file; try again later")
    finally:
        if target is not None:
            await endpoint.abandon_upload(target)


async def _part(reader: MultipartReader, name: str) -> BodyPartReader:
    part = await reader.next()
    if not isinstance(part, BodyPartReader) or part.name != name:
        raise ChannelRefused(INVALID_STATUS, f"not a valid file upload: the next part must be `{name}`")
    # Our client sends these two (container/channel_files.py). Others change how aiohttp reads the part: a
    # base64 Content-Transfer-Encoding costs ten times the loop time of the same bytes plain.
    if {header.lower() for header in part.headers} - PART_HEADERS:
        raise ChannelRefused(
            INVALID_STATUS, "not a valid file upload: a part may carry only Content-Disposition and Content-Type"
        )
    return part


async def _meta(part: BodyPartReader) -> FileMeta:
    body = bytearray()
    while chunk := await part.read_chunk(READ_CHUNK_BYTES):
        body += chunk
        if len(body) > MAX_FILE_META_BYTES:
            raise ChannelRefused(INVALID_STATUS, f"the upload's meta part is over {MAX_FILE_META_BYTES} bytes")
    try:
        return bounded_json.validate(FileMeta, bytes(body), MAX_META_VALUES)
    except BodyRefused as exc:
        raise ChannelRefused(INVALID_STATUS, f"not a valid file upload's meta: {exc}") from None


async def _write(part: BodyPartReader, target: Path, max_bytes: int) -> ReceivedFile:
    """Stream the part to `target` (a new file), counting; its first bytes say whether it is a photo."""
    handle = await asyncio.to_thread(_create, target)
    try:
        size = 0
        head = bytearray()
        batch = bytearray()
        while chunk := await part.read_chunk(READ_CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise ChannelRefused(413, f"the file is over the limit of {max_bytes} bytes (SUBAGENT_MAX_FILE_MB)")
            if len(head) < PHOTO_HEAD_BYTES:
                head += chunk[: PHOTO_HEAD_BYTES - len(head)]
            batch += chunk
            if len(batch) >= WRITE_BATCH_BYTES:
                await asyncio.to_thread(handle.write, bytes(batch))
                batch.clear()
        await asyncio.to_thread(_finish, handle, bytes(batch))
    finally:
        await asyncio.to_thread(handle.close)
    if size == 0:
        # The tool refuses an empty file before it sends it (container/tools.py): only another client sends one.
        raise ChannelRefused(422, "the file is empty: Telegram takes no empty files", invalid=True)
    return ReceivedFile(path=target, size_bytes=size, photo=photo_of(bytes(head), size))


def _create(target: Path) -> BinaryIO:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    return os.fdopen(fd, "wb")


def _finish(handle: BinaryIO, rest: bytes) -> None:
    handle.write(rest)
    handle.flush()
    os.fsync(handle.fileno())
