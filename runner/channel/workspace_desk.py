"""`GET`/`PUT /run/workspace`: a chat's workspace as one opaque archive, for backends whose containers share no
folder with the host (container/contract.py, WORKSPACE_SYNC_ENV). The host stores and serves the bytes and never
opens them; the chat is the one the run's endpoint was built for, never anything in the request.

A PUT is bounded before and while it is read: a declared length over the quota is refused unread, the body is
counted as it streams (Content-Length or chunked) and cut one byte past the quota, a body that stalls for
`idle_seconds` is given up, one upload at a time per run and a few per run in all. Whatever fails or is
refused leaves the chat's previous archive whole (runner/storage/workspace_archive.py keeps the bytes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from container.contract import WORKSPACE_PATH
from core.logging import get_logger
from runner.channel.channel_answers import ChannelRefused, answer

log = get_logger(__name__)

# A pull is retried after a broken connection, a push too: a few of each, never an unbounded disk or CPU sink.
MAX_PULLS_PER_RUN = 8
MAX_PUSHES_PER_RUN = 4
IDLE_SECONDS = 60.0  # an upload that sends nothing for this long is given up (a slow body holds a temp file)
READ_CHUNK_BYTES = 256 * 1024
SEND_CHUNK_BYTES = 1024 * 1024
ARCHIVE_CONTENT_TYPE = "application/x-tar"
NOT_SYNCED = (
    "this run's workspace is a folder mounted into its container, not synced over the channel "
    "(only backends without a shared folder, such as Kubernetes, sync it)"
)


class OverQuota(Exception):
    """An upload went past the chat's quota; the message says by how much it may grow."""


class ArchiveReader(Protocol):
    """The stored archive, opened: a snapshot that a later upload's rename does not change."""

    @property
    def size_bytes(self) -> int: ...

    async def read(self, max_bytes: int) -> bytes:
        """The next bytes (b"" at the end), read in a thread."""

    async def close(self) -> None: ...


class ArchiveUpload(Protocol):
    """One upload, written to a file of its own until it is committed."""

    async def write(self, chunk: bytes) -> None:
        """Add `chunk`; OverQuota once the upload is past the quota (nothing past it is kept)."""

    async def commit(self) -> int:
        """Replace the chat's archive with this one, whole; returns its size."""

    async def abandon(self) -> None:
        """Remove what was written; the chat's archive stays as it was."""


class ArchiveStore(Protocol):
    """One chat's stored archive."""

    def quota_bytes(self) -> int: ...

    async def open(self) -> ArchiveReader | None:
        """None when the chat has no archive yet."""

    async def begin(self) -> ArchiveUpload: ...


class WorkspaceDesk:
    """One run's workspace endpoints over its chat's `ArchiveStore`."""

    def __init__(
        self,
        store: ArchiveStore,
        *,
        check_live: Callable[[], None],
        invalid: Callable[[int, str], None],
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self._store = store
        self._check_live = check_live  # raises ChannelRefused when the run is cancelled or finished
        self._invalid = invalid
        self._idle_seconds = idle_seconds
        self._pulls = 0
        self._pushes = 0
        self._uploading = False

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """The stored archive as it is (200), or 204 when the chat has none yet."""
        self._check_live()
        self._pulls += 1
        if self._pulls > MAX_PULLS_PER_RUN:
            self._refuse_invalid(429, f"this run has fetched its workspace {MAX_PULLS_PER_RUN} times already")
        reader = await self._store.open()
        if reader is None or reader.size_bytes == 0:
            if reader is not None:
                await reader.close()
            return web.Response(status=204)
        try:
            response = web.StreamResponse(headers={"Content-Type": ARCHIVE_CONTENT_TYPE})
            response.content_length = reader.size_bytes
            await response.prepare(request)
            sent = 0
            # Exactly the size announced: the snapshot cannot grow, and a short file would break the framing.
            while sent < reader.size_bytes:
                chunk = await reader.read(min(SEND_CHUNK_BYTES, reader.size_bytes - sent))
                if not chunk:
                    raise OSError(f"the stored archive ended after {sent} of {reader.size_bytes} bytes")
                try:
                    await response.write(chunk)
                except ConnectionError:  # the container hung up: it may ask again
                    log.info("workspace_download_broken", sent_bytes=sent, size_bytes=reader.size_bytes)
                    return response
                sent += len(chunk)
            await response.write_eof()
            return response
        finally:
            await reader.close()

    async def receive(self, request: web.Request) -> web.Response:
        """Store the body as the chat's archive once it has arrived whole and within the quota."""
        self._check_live()
        if self._uploading:
            self._refuse_invalid(409, "one workspace upload at a time: this run is sending one already")
        if self._pushes >= MAX_PUSHES_PER_RUN:
            self._refuse_invalid(429, f"this run has sent its workspace {MAX_PUSHES_PER_RUN} times already")
        quota = self._store.quota_bytes()
        declared = request.content_length
        if declared is not None and declared > quota:
            return answer(413, False, _over_quota(quota, f"{declared} bytes"))
        self._pushes += 1
        self._uploading = True
        try:
            size = await self._store_body(request)
        except OverQuota as exc:
            return answer(413, False, str(exc))
        except ChannelRefused as exc:
            return answer(exc.status, False, exc.reason)
        # A body cut short (the container hung up, a chunked body that never ended): aiohttp raises these.
        except (BadHttpMessage, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.info("workspace_upload_broken", error=str(exc)[:200])
            return answer(400, False, f"the upload broke off: {str(exc)[:200]}; the previous workspace is kept")
        except OSError as exc:  # the host's disk: full, or failing
            log.warning("workspace_not_kept", error=str(exc))
            return answer(507, False, "the host could not keep the workspace; the previous one is kept")
        finally:
            self._uploading = False
        return answer(200, True, f"kept ({size} bytes)")

    async def _store_body(self, request: web.Request) -> int:
        upload = await self._store.begin()
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(request.content.read(READ_CHUNK_BYTES), self._idle_seconds)
                except TimeoutError:
                    raise ChannelRefused(
                        408, f"the upload sent nothing for {self._idle_seconds:g} s; the previous workspace is kept"
                    ) from None
                if not chunk:
                    break
                await upload.write(chunk)
            if declared_short(request):
                raise ConnectionError("the body ended before its Content-Length")
            self._check_live()  # a run cancelled meanwhile keeps nothing
            size = await upload.commit()
        except BaseException:
            # Shielded: the temp file goes even when the handler is cancelled (the run's socket closing).
            await asyncio.shield(upload.abandon())
            raise
        return size

    def _refuse_invalid(self, status: int, reason: str) -> None:
        """A refusal a working agent never meets: it counts against the run's invalid requests."""
        self._invalid(status, reason)
        raise ChannelRefused(status, reason)


def declared_short(request: web.Request) -> bool:
    """aiohttp ends the body at EOF when the peer hangs up; its parser flags a Content-Length not reached."""
    return not request.content.is_eof()


def _over_quota(quota_bytes: int, what: str) -> str:
    return (
        f"the workspace ({what}) is over the chat's quota of {quota_bytes} bytes (WORKSPACE_QUOTA_MB); "
        "the previous workspace is kept: delete files to make it fit"
    )


def over_quota_reason(quota_bytes: int, written_bytes: int) -> str:
    """OverQuota's message, for the storage that raises it."""
    return _over_quota(quota_bytes, f"more than {written_bytes} bytes")


@runtime_checkable
class SyncedEndpoint(Protocol):
    """A run endpoint that may sync its workspace: `workspace` is None when its run does not."""

    @property
    def workspace(self) -> WorkspaceDesk | None: ...


async def handle_workspace(endpoint: object, request: web.Request) -> web.StreamResponse:
    """`WORKSPACE_PATH` for the run whose socket the request came in on."""
    desk = endpoint.workspace if isinstance(endpoint, SyncedEndpoint) else None
    if desk is None:
        return answer(409, False, NOT_SYNCED)
    try:
        if request.method == "GET":
            return await desk.serve(request)
        if request.method == "PUT":
            return await desk.receive(request)
    except ChannelRefused as exc:
        return answer(exc.status, False, exc.reason)
    return answer(405, False, f"{WORKSPACE_PATH} takes GET or PUT, not {request.method[:20]}")
