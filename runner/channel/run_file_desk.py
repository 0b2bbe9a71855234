"""One run's files on its channel: the chat files it is offered (served from host-only storage by index,
never by a name the container chose) and the files it sends (written by the host under names the host
chose, in a folder no container mounts, then owed to the chat through the outbox, exactly once).
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from container.file_names import safe_file_name
from container.protocol import FileMeta
from core.delivery import Delivery
from core.logging import get_logger
from core.store.chat_files import FileKind, NewFile, sent_file_id, size_text
from core.store.messages import NewMessage
from core.store.outbox import Outgoing, OutgoingFile, SentFileKind
from core.store.run_files import FileOutOutcome, RunFileStore
from core.store.runs import RunStore
from runner.channel.channel_answers import ChannelRefused
from runner.channel.photo_kind import Photo
from runner.runs.live_runs import LiveRun
from runner.runs.outcome import SUBAGENT_SENDER

log = get_logger(__name__)

OUT_DIR_MODE = 0o700
NAME_TOKEN_BYTES = 8
MAX_UNIQUE_ID_CHARS = 200  # a sent photo's unique id: its run and upload (the container names the upload)


@dataclass(frozen=True, slots=True)
class ReceivedFile:
    """A file's bytes as the host wrote them, and what they are."""

    path: Path
    size_bytes: int
    photo: Photo | None  # None: sent as a document


@dataclass(slots=True)
class FilesOut:
    """Where and how much a run may send: its folder under DATA_DIR/files/out, and its limits."""

    out_dir: Path
    store: RunFileStore
    max_files: int
    max_file_bytes: int
    accepted: set[str] = field(default_factory=set)  # upload ids taken in this process
    retried: set[str] = field(default_factory=set)  # of those, the ones whose retry was answered "already sent"


class RunFileDesk:
    def __init__(
        self,
        live: LiveRun,
        *,
        offered: list[Path],
        out: FilesOut,
        runs: RunStore,
        delivery: Delivery,
        on_sent: Callable[[int], None] | None = None,
    ) -> None:
        self._live = live
        self._offered = offered
        self._out = out
        self._runs = runs
        self._delivery = delivery
        self._on_sent = on_sent  # a file was accepted, its size: the metrics count it
        self._uploading = False
        self._over_limit = 0  # uploads refused as over SUBAGENT_MAX_FILES

    @property
    def max_file_bytes(self) -> int:
        return self._out.max_file_bytes

    def offered_file(self, index: int) -> Path:
        if not 0 <= index < len(self._offered):
            raise ChannelRefused(404, f"this run was offered {len(self._offered)} files; there is no file {index}")
        return self._offered[index]

    def admit(self) -> None:
        """Before an upload's body is read: one at a time. The run's limit is checked once its meta is read
        (a few KB): a retry of the upload that reached the limit must still learn it was sent."""
        if self._uploading:
            raise ChannelRefused(409, "one file at a time: wait for the answer to the last one")

    async def begin(self, meta: FileMeta) -> Path | None:
        """Where to write the file's bytes; None: a retry of an upload already sent (nothing to write)."""
        if meta.upload_id in self._out.accepted:
            self._retry(meta.upload_id)
            return None
        self.admit()
        if len(self._out.accepted) >= self._out.max_files:
            raise self._over_files()
        self._uploading = True
        # A name no other upload of this run has, in this process or an earlier one (a re-attached run's
        # folder holds its earlier files: a name that repeats one would fail, and its clean-up remove that file).
        target = self._out.out_dir / f"{len(self._out.accepted) + 1:03d}-{secrets.token_hex(NAME_TOKEN_BYTES)}"
        try:
            await asyncio.to_thread(self._out.out_dir.mkdir, mode=OUT_DIR_MODE, parents=True, exist_ok=True)
        except BaseException:
            self._uploading = False
            raise
        return target

    def _over_files(self) -> ChannelRefused:
        """The tool counts the files it sent and stops at the limit (container/tools.py): one refusal tells a run
        that lost count; each after it counts against the run (each costs the host an upload's meta)."""
        self._over_limit += 1
        reason = f"this run has sent its {self._out.max_files} files (SUBAGENT_MAX_FILES)"
        return ChannelRefused(429, reason, invalid=self._over_limit > 1)

    def _retry(self, upload_id: str) -> None:
        """A retry learns its upload was sent; the client retries once after a lost answer, and a run that
        sends it again is not that client (each repeat costs the host a read of the body: invalid)."""
        if upload_id in self._out.retried:
            raise ChannelRefused(409, "this upload was sent, and its retry was answered so already", invalid=True)
        self._out.retried.add(upload_id)

    async def abandon(self, target: Path | None) -> None:
        """The upload failed or was refused: its bytes are not kept."""
        self._uploading = False
        if target is not None:
            await asyncio.to_thread(_remove, target)

    async def received(self, meta: FileMeta, file: ReceivedFile) -> str:
        """The bytes are written: record the file and owe it to the chat (or say why not)."""
        try:
            return await self._record(meta, file)
        finally:
            self._uploading = False

    async def _record(self, meta: FileMeta, file: ReceivedFile) -> str:
        name = safe_file_name(meta.name)
        kind = SentFileKind.PHOTO if file.photo is not None else SentFileKind.DOCUMENT
        caption = (meta.caption or "").strip()
        shown = f"[file sent: {name}, {size_text(file.size_bytes)}]"
        seen = None
        if file.photo is not None:  # the main agent sees it on its next turn, from the host's copy (bot/senses/)
            seen = NewFile(
                kind=FileKind.PHOTO,
                file_id=sent_file_id(self._live.id, file.path.name),
                file_unique_id=f"sent:{self._live.id}:{meta.upload_id}"[:MAX_UNIQUE_ID_CHARS],
                name=name,
                mime_type=file.photo.mime_type,
                size_bytes=file.size_bytes,
            )
        outgoing = Outgoing(
            message=NewMessage(
                chat_id=self._live.chat_id,
                sender_name=SUBAGENT_SENDER,
                content=f"{shown} {caption}".rstrip(),
                is_bot=True,
                kind="file",
                file=seen,
            ),
            text=caption,
            run_id=self._live.id,
            reply_to=await self._runs.asked_by(self._live.id),
            file=OutgoingFile(path=file.path, name=name, kind=kind),
        )
        outcome = await self._out.store.add_out(
            self._live.id,
            meta.upload_id,
            outgoing,
            stored=str(file.path),
            size_bytes=file.size_bytes,
            max_files=self._out.max_files,
        )
        if outcome is not FileOutOutcome.ACCEPTED:
            await asyncio.to_thread(_remove, file.path)
        if outcome is FileOutOutcome.DUPLICATE:  # sent by this run before the host restarted: this is its retry
            self._out.accepted.add(meta.upload_id)
            self._out.retried.add(meta.upload_id)
            return "already sent"
        if outcome is FileOutOutcome.OVER_LIMIT:
            raise self._over_files()
        if outcome is FileOutOutcome.NOT_LIVE:
            raise ChannelRefused(403, f"run {self._live.id} is cancelled or finished")
        self._out.accepted.add(meta.upload_id)
        if self._on_sent is not None:
            self._on_sent(file.size_bytes)
        log.info("run_file_sent", run_id=self._live.id, name=name, size_bytes=file.size_bytes, kind=kind.value)
        self._delivery.send_soon(self._live.chat_id)
        return "sent"


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
