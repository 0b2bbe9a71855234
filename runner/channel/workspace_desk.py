"""`GET`/`PUT`/`POST /run/workspace`: a chat's workspace as one opaque archive, for backends whose containers share
no folder with the host (container/contract.py, WORKSPACE_SYNC_ENV). The host stores and serves the bytes and never
opens them; the chat is the one the run's endpoint was built for, never anything in the request.

A run that cannot unpack what it was served says so (`POST`, container/workspace_sync.py), naming it by the id
the GET's answer gave it: the host sets that archive aside for an admin (runner/storage/workspace_archive.py),
so the chat's next run starts empty instead of failing on it too. Only an archive this run was served, and only
while it is still the chat's: a later push by another run is never set aside.

A PUT is bounded before and while it is read: it has a Content-Length (runner/channel/request_framing.py refuses
a chunked body), one over the quota is refused unread, the body is counted as it streams, a body that stalls for
`idle_seconds` is given up, one upload at a time per run and a few per run in all. Whatever fails or is
refused leaves the chat's previous archive whole (runner/storage/workspace_archive.py keeps the bytes).

Two runs of one chat may run at once, each from the archive it pulled: a GET names the archive's version, a PUT
the version it stands on, and the PUT is kept only if that is still the chat's archive (compared and renamed under
the archives' lock), else it is answered WORKSPACE_STALE_STATUS and the run puts its own changes on the newer
archive in its container and pushes again (container/workspace_rebase.py). The host never opens either archive.
A PUT that names no base (an agent from before versions, e.g. a run started before an upgrade that outlived the
host's restart) replaces the archive as it did then: refusing it would drop that run's files, and a container can
already push any archive it likes, so accepting it trusts it with nothing new.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol, runtime_checkable

from aiohttp import hdrs, web
from aiohttp.http_exceptions import BadHttpMessage

from container.contract import (
    EMPTY_VERSION,
    MAX_WORKSPACE_REBASES,
    VERSION_PATTERN,
    WORKSPACE_BASE_HEADER,
    WORKSPACE_PATH,
    WORKSPACE_SERVED_HEADER,
    WORKSPACE_STALE_STATUS,
    WORKSPACE_VERSION_HEADER,
)
from container.protocol import UnreadableWorkspace
from core.logging import get_logger
from runner.channel import bounded_json
from runner.channel.bounded_json import BodyRefused
from runner.channel.channel_answers import INVALID_STATUS, ChannelRefused, answer

log = get_logger(__name__)

# A pull is retried after a broken connection, a push too, and a push refused as stale pulls the newer archive
# and is sent again (container/workspace_rebase.py), up to MAX_WORKSPACE_REBASES times: a few retries each beyond
# that, never an unbounded disk or CPU sink (one upload at a time, each within the quota).
MAX_PULLS_PER_RUN = MAX_WORKSPACE_REBASES + 12
MAX_PUSHES_PER_RUN = MAX_WORKSPACE_REBASES + 8
VERSION_CHARS = 32  # contract.VERSION_PATTERN
_VERSION = re.compile(VERSION_PATTERN)
# A run reports its archive unreadable once (again only when the answer was lost): a few, then it is not that loop.
MAX_REPORTS_PER_RUN = 3
MAX_REPORT_BYTES = 4 * 1024  # an UnreadableWorkspace: an id, and a reason of 500 printable ASCII characters
MAX_REPORT_VALUES = 8
SERVED_ID_BYTES = 8
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


class StaleBase(Exception):
    """An upload based on an archive that is no longer the chat's: another run's push replaced it since."""


@dataclass(frozen=True, slots=True)
class ArchiveIdentity:
    """Which stored archive a reader opened: an upload's commit makes a new file, so a new identity."""

    device: int
    inode: int
    size_bytes: int
    modified_ns: int
    changed_ns: int

    @property
    def version(self) -> str:
        """The archive's version as a run is told it (WORKSPACE_VERSION_HEADER): a digest of its identity. No two
        commits of a chat share one: each commit's file is modified after the one it replaces
        (runner/storage/workspace_archive.py), so even an inode number used again differs."""
        raw = f"{self.device}:{self.inode}:{self.size_bytes}:{self.modified_ns}:{self.changed_ns}".encode()
        return hashlib.sha256(raw).hexdigest()[:VERSION_CHARS]


class AsideOutcome(enum.Enum):
    SET_ASIDE = "set aside"  # it was the chat's archive: moved aside, the chat has none now
    GONE = "gone"  # the chat has no archive now (another run of it set that one aside already)
    REPLACED = "replaced"  # the chat's archive is another one now: nothing was moved


class ArchiveReader(Protocol):
    """The stored archive, opened: a snapshot that a later upload's rename does not change."""

    @property
    def size_bytes(self) -> int: ...

    @property
    def identity(self) -> ArchiveIdentity: ...

    async def read(self, max_bytes: int) -> bytes:
        """The next bytes (b"" at the end), read in a thread."""

    async def close(self) -> None: ...


class ArchiveUpload(Protocol):
    """One upload, written to a file of its own until it is committed."""

    async def write(self, chunk: bytes) -> None:
        """Add `chunk`; OverQuota once the upload is past the quota (nothing past it is kept)."""

    async def commit(self, base: str | None) -> int:
        """Replace the chat's archive with this one, whole, if its version is still `base` (None: whatever it
        is); returns its size. StaleBase when it is not (nothing is replaced)."""

    async def abandon(self) -> None:
        """Remove what was written; the chat's archive stays as it was."""


class ArchiveStore(Protocol):
    """One chat's stored archive."""

    def quota_bytes(self) -> int: ...

    async def open(self) -> ArchiveReader | None:
        """None when the chat has no archive yet."""

    async def begin(self) -> ArchiveUpload: ...

    async def version(self) -> str:
        """The stored archive's version now (EMPTY_VERSION when there is none)."""

    async def set_aside(self, served: ArchiveIdentity, reason: str) -> AsideOutcome:
        """Keep the archive `served` aside for an admin if it is still the chat's; `reason` is the run's word."""


class WorkspaceDesk:
    """One run's workspace endpoints over its chat's `ArchiveStore`."""

    def __init__(
        self,
        store: ArchiveStore,
        *,
        check_live: Callable[[], None],
        invalid: Callable[[int, str], None],
        idle_seconds: float = IDLE_SECONDS,
        run_id: str = "",
        chat_id: int | None = None,
    ) -> None:
        self._store = store
        self._run_id = run_id  # named in its log lines, with its chat, for an admin
        self._chat_id = chat_id
        self._check_live = check_live  # raises ChannelRefused when the run is cancelled or finished
        self._invalid = invalid
        self._idle_seconds = idle_seconds
        self._pulls = 0
        self._pushes = 0
        self._reports = 0
        self._uploading = False
        self._served: dict[str, ArchiveIdentity] = {}  # by the id each GET's answer gave: MAX_PULLS_PER_RUN at most

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """The stored archive as it is (200), or 204 when the chat has none yet."""
        self._check_live()
        self._pulls += 1
        if self._pulls > MAX_PULLS_PER_RUN:
            self._refuse_invalid(429, f"this run has fetched its workspace {MAX_PULLS_PER_RUN} times already")
        reader = await self._store.open()
        if reader is None or reader.size_bytes == 0:
            version = EMPTY_VERSION if reader is None else reader.identity.version
            if reader is not None:
                await reader.close()
            return web.Response(status=204, headers={WORKSPACE_VERSION_HEADER: version})
        served = secrets.token_hex(SERVED_ID_BYTES)
        self._served[served] = reader.identity
        try:
            response = web.StreamResponse(
                headers={
                    "Content-Type": ARCHIVE_CONTENT_TYPE,
                    WORKSPACE_SERVED_HEADER: served,
                    WORKSPACE_VERSION_HEADER: reader.identity.version,
                }
            )
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
        base = request.headers.get(WORKSPACE_BASE_HEADER)  # None: an agent from before versions, kept as then
        if base is not None and not _VERSION.fullmatch(base):
            self._refuse_invalid(INVALID_STATUS, f"{WORKSPACE_BASE_HEADER} is a version a GET's answer gave")
        quota = self._store.quota_bytes()
        declared = request.content_length
        if declared is not None and declared > quota:
            return answer(413, False, _over_quota(quota, f"{declared} bytes"))
        self._pushes += 1
        if base is not None and await self._store.version() != base:  # stale already: refused unread
            return _stale()
        self._uploading = True
        try:
            size = await self._store_body(request, base)
        except OverQuota as exc:
            return answer(413, False, str(exc))
        except StaleBase:  # another run's push was kept while this one arrived
            return _stale()
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
        if base is None:  # kept over whatever was stored, unchecked: another run's save may be gone
            log.warning("workspace_push_without_base", run_id=self._run_id, chat_id=self._chat_id, size_bytes=size)
        return answer(200, True, f"kept ({size} bytes)")

    async def _store_body(self, request: web.Request, base: str | None) -> int:
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
            size = await upload.commit(base)
        except BaseException:
            # Shielded: the temp file goes even when the handler is cancelled (the run's socket closing).
            await asyncio.shield(upload.abandon())
            raise
        return size

    async def set_aside(self, request: web.Request) -> web.Response:
        """The run could not unpack the archive it was served: that one goes aside, if still the chat's."""
        self._check_live()
        self._reports += 1
        if self._reports > MAX_REPORTS_PER_RUN:
            self._refuse_invalid(429, f"this run has reported its workspace unreadable {MAX_REPORTS_PER_RUN} times")
        report = await self._read_report(request)
        served = self._served.get(report.served)
        if served is None:
            self._refuse_invalid(
                INVALID_STATUS, "this run was served no workspace by that id: only one it fetched can be set aside"
            )
        outcome = await self._store.set_aside(served, report.reason)
        if outcome is AsideOutcome.REPLACED:
            log.info("workspace_set_aside_refused", reason=report.reason)
            return answer(
                409,
                False,
                "the chat's workspace was replaced by another run's since this run fetched it; nothing was set "
                "aside (the chat's next run starts from the new one)",
            )
        if outcome is AsideOutcome.GONE:
            return answer(200, True, "the chat has no stored workspace now (it was set aside already)")
        return answer(200, True, "set aside for an admin; the chat has no stored workspace now")

    async def _read_report(self, request: web.Request) -> UnreadableWorkspace:
        """The body: a small JSON with its length declared and nothing compressed, as the container sends it."""
        declared = request.content_length
        if hdrs.CONTENT_ENCODING in request.headers or declared is None or declared > MAX_REPORT_BYTES:
            self._refuse_invalid(
                INVALID_STATUS, f"a report is an uncompressed body of at most {MAX_REPORT_BYTES} bytes, with its length"
            )
        try:
            body = await asyncio.wait_for(request.content.readexactly(declared), self._idle_seconds)
        except TimeoutError:
            raise ChannelRefused(408, f"the report did not arrive in {self._idle_seconds:g} s") from None
        except asyncio.IncompleteReadError:
            raise ChannelRefused(400, "the report broke off") from None
        try:
            return bounded_json.validate(UnreadableWorkspace, body, MAX_REPORT_VALUES)
        except BodyRefused as exc:
            self._refuse_invalid(INVALID_STATUS, f"not a valid UnreadableWorkspace: {exc}")

    def _refuse_invalid(self, status: int, reason: str) -> NoReturn:
        """A refusal a working agent never meets: it counts against the run's invalid requests."""
        self._invalid(status, reason)
        raise ChannelRefused(status, reason)


def declared_short(request: web.Request) -> bool:
    """aiohttp ends the body at EOF when the peer hangs up; its parser flags a Content-Length not reached."""
    return not request.content.is_eof()


def _stale() -> web.Response:
    log.info("workspace_push_stale")
    return answer(
        WORKSPACE_STALE_STATUS,
        False,
        "stale: another run of this chat saved the workspace since this run fetched it; fetch it again, put this "
        "run's changes on it and send that",
    )


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
        if request.method == "POST":
            return await desk.set_aside(request)
    except ChannelRefused as exc:
        return answer(exc.status, False, exc.reason)
    return answer(405, False, f"{WORKSPACE_PATH} takes GET, PUT or POST, not {request.method[:20]}")
