"""A run's file desk as the host opens it, on a real Unix socket: the LLM proxy serving one run whose endpoint
is a real RunInbox with a real RunFileDesk over real SQLite stores (runs, run files, outbox), and the raw
requests a hostile container sends it (multipart bodies built by hand, so any of them can be wrong)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from container.protocol import FILES_PATH, TaskSpec
from core.delivery import Delivery
from core.outbox import Outbox
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.outbox import OutboxRow, OutboxStore, Outgoing
from core.store.run_files import RunFile, RunFileStore
from core.store.run_record import RunStatus
from core.store.runs import RunStore
from runner.channel import file_transfer, run_file_desk
from runner.channel.run_endpoint import RunInbox
from runner.channel.run_file_desk import FilesOut, RunFileDesk
from runner.runs.live_runs import LiveRun
from tests.runner.channel.run_api_client import SEND_PIECE, Answer, exchange_raw
from tests.runner.channel.run_api_server import new_proxy

RUN = "run-files1"
CHAT = -1001
MAX_FILE_BYTES = 256 * 1024
MAX_FILES = 3
BOUNDARY = "b0undary"
OFFERED = [b"first offered file\n", b"second,offered\n1,2\n"]


class SendSoon:
    """Delivery at its edge: records that the outbox was asked to send (rows stay pending, to be counted); what it
    stages for a progress message is the real Delivery's."""

    def __init__(self) -> None:
        self.chats: list[int] = []
        # Only its outgoing() is used, which touches neither the store nor the outbox.
        self._staging = Delivery(cast(OutboxStore, None), cast(Outbox, None), "Crew")

    def outgoing(self, chat_id: int, content: str, *, kind: str, sender_name: str | None = None) -> Outgoing:
        return self._staging.outgoing(chat_id, content, kind=kind, sender_name=sender_name)

    def send_soon(self, chat_id: int) -> None:
        self.chats.append(chat_id)


@dataclass
class FileThreads:
    """Where the desk's file work ran: the thread of every create, write, flush, close and removal; `created`
    is set when an upload's file is created (its meta was read and taken), `removed` once one is removed."""

    ids: set[int] = field(default_factory=set)
    created: threading.Event = field(default_factory=threading.Event)
    removed: threading.Event = field(default_factory=threading.Event)
    creates: int = 0

    def note(self) -> None:
        self.ids.add(threading.get_ident())


class _Noted:
    """A file being written whose every call records its thread (when called, not when looked up)."""

    def __init__(self, handle: BinaryIO, threads: FileThreads) -> None:
        self._handle = handle
        self._threads = threads

    def write(self, data: bytes) -> int:
        self._threads.note()
        return self._handle.write(data)

    def flush(self) -> None:
        self._threads.note()
        self._handle.flush()

    def fileno(self) -> int:
        self._threads.note()
        return self._handle.fileno()

    def close(self) -> None:
        self._threads.note()
        self._handle.close()


@dataclass
class DeskRig:
    data: Path
    socket: Path
    db: Database
    runs: RunStore
    files: RunFileStore
    outbox: OutboxStore
    live: LiveRun
    inbox: RunInbox
    delivery: SendSoon
    threads: FileThreads

    @property
    def out_dir(self) -> Path:
        return self.data / "files" / "out" / RUN

    @property
    def invalid_count(self) -> int:
        count: int = self.inbox._invalid_requests  # what the run is stopped by
        return count

    async def post(self, body: bytes, *, content_type: str | None = None, length: int | None = None) -> Answer:
        pieces = [body[start : start + SEND_PIECE] for start in range(0, len(body), SEND_PIECE)]
        return await exchange_raw(self.socket, upload_head(body, content_type, length), pieces)

    async def upload(self, data: bytes, *, upload_id: str = "upload-01", name: str = "a.txt", **meta: Any) -> Answer:
        return await self.post(multipart(meta_part({"upload_id": upload_id, "name": name, **meta}), file_part(data)))

    async def get(self, target: str) -> Answer:
        head = f"GET {target} HTTP/1.1\r\nHost: run\r\nConnection: close\r\n\r\n".encode()
        return await exchange_raw(self.socket, head, [])

    async def out_rows(self) -> list[OutboxRow]:
        return await self.outbox.pending(CHAT)

    async def files_out(self) -> list[RunFile]:
        return await self.files.of_run(RUN)

    def every_file(self) -> set[Path]:
        """Every file in the test's folder but the database and the socket, relative to the data folder."""
        root = self.data.parent
        return {
            Path(os.path.relpath(path, self.data))
            for path in root.rglob("*")
            if path.is_file() and not path.name.startswith("crewbot.sqlite3")
        }

    def kept_out(self) -> list[Path]:
        return sorted(self.out_dir.iterdir()) if self.out_dir.exists() else []


@asynccontextmanager
async def desk_rig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, max_files: int = MAX_FILES
) -> AsyncIterator[DeskRig]:
    data = tmp_path / "data"
    files_in = data / "files" / "in"
    files_in.mkdir(parents=True)
    offered = []
    for index, content in enumerate(OFFERED):
        path = files_in / f"offered-{index}"
        path.write_bytes(content)
        offered.append(path)
    threads = FileThreads()
    _record_file_threads(monkeypatch, threads)
    db = await Database.open(data / "crewbot.sqlite3")
    proxy = new_proxy()
    try:
        await ChatStore(db).ensure(CHAT, "group", "main")
        runs = RunStore(db)
        await runs.create(
            RUN, chat_id=CHAT, turn_id=None, task="t", label="l", include_context=False, status=RunStatus.RUNNING
        )
        files = RunFileStore(db)
        live = LiveRun(id=RUN, chat_id=CHAT, turn_id=None, label="l")
        delivery = SendSoon()
        out = FilesOut(
            out_dir=data / "files" / "out" / RUN, store=files, max_files=max_files, max_file_bytes=MAX_FILE_BYTES
        )
        desk = RunFileDesk(live, offered=offered, out=out, runs=runs, delivery=delivery)  # type: ignore[arg-type]
        spec = TaskSpec(run_id=RUN, task="t", label="l")
        socket = tmp_path / "run.sock"
        inbox = RunInbox(
            live,
            spec,
            socket_path=socket,
            runs=runs,
            delivery=delivery,  # type: ignore[arg-type]
            max_messages=5,
            session_max_messages=10,
            files=desk,
        )
        await proxy.open_run(RUN, socket, endpoint=inbox)
        yield DeskRig(data, socket, db, runs, files, OutboxStore(db), live, inbox, delivery, threads)
    finally:
        await proxy.close()
        await db.close()


def _record_file_threads(monkeypatch: pytest.MonkeyPatch, threads: FileThreads) -> None:
    create, finish, remove = file_transfer._create, file_transfer._finish, run_file_desk._remove

    def noted_create(target: Path) -> BinaryIO:
        threads.note()
        handle = create(target)
        threads.creates += 1
        threads.created.set()
        return _Noted(handle, threads)  # type: ignore[return-value]

    def noted(work: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            threads.note()
            work(*args)

        return call

    def noted_remove(path: Path) -> None:
        threads.note()
        remove(path)
        threads.removed.set()

    monkeypatch.setattr(file_transfer, "_create", noted_create)
    monkeypatch.setattr(file_transfer, "_finish", noted(finish))
    monkeypatch.setattr(run_file_desk, "_remove", noted_remove)


# --- bodies ---------------------------------------------------------------------------------------------


def part(headers: list[str], body: bytes) -> bytes:
    return f"--{BOUNDARY}\r\n".encode() + "".join(f"{h}\r\n" for h in headers).encode() + b"\r\n" + body + b"\r\n"


def meta_part(meta: dict[str, Any] | bytes) -> bytes:
    body = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return part(['Content-Disposition: form-data; name="meta"', "Content-Type: application/json"], body)


def file_part(data: bytes, name: str = "file") -> bytes:
    headers = [f'Content-Disposition: form-data; name="{name}"; filename="x"', "Content-Type: application/octet-stream"]
    return part(headers, data)


def multipart(*parts: bytes, closed: bool = True) -> bytes:
    return b"".join(parts) + (f"--{BOUNDARY}--\r\n".encode() if closed else b"")


def upload_head(body: bytes, content_type: str | None, length: int | None) -> bytes:
    lines = [
        f"POST {FILES_PATH} HTTP/1.1",
        "Host: run",
        "Connection: close",
        f"Content-Type: {content_type or f'multipart/form-data; boundary={BOUNDARY}'}",
        f"Content-Length: {len(body) if length is None else length}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked_head(content_type: str = f"multipart/form-data; boundary={BOUNDARY}") -> bytes:
    lines = [f"POST {FILES_PATH} HTTP/1.1", "Host: run", "Connection: close", f"Content-Type: {content_type}"]
    return ("\r\n".join([*lines, "Transfer-Encoding: chunked"]) + "\r\n\r\n").encode()


def png(width: int = 4, height: int = 3) -> bytes:
    """A real PNG: signature, IHDR with its CRC, one IDAT, IEND."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    raw = b"".join(b"\x00" + b"\x00\x00\x00" * width for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def os_files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []
