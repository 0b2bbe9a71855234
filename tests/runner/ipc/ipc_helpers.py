"""Test helpers shared by the IPC and watcher tests: a resolver, a recording handler, a watcher factory and
ways to read back what was handed over, quarantined or left behind."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from container.protocol import SpawnRequest
from runner.ipc.batch import RequestOutcome
from runner.ipc.requests import ERRORS_DIR, REASON_SUFFIX
from runner.ipc.watcher import IpcWatcher

CHATS = {"chat_1": 1, "chat_m100200": -100200}
MAX_BYTES = 4096
# Generous bounds: these tests check the path a file takes, not its speed (bench/ measures that).
ARRIVAL_TIMEOUT_SECONDS = 5.0


class FolderMap:
    """The resolver: folder -> chat id, None for folders that are no allowed chat."""

    def __init__(self, chats: dict[str, int]) -> None:
        self.chats = dict(chats)
        self.fail = False

    async def __call__(self, folder: str) -> int | None:
        if self.fail:
            raise RuntimeError("database is locked")
        return self.chats.get(folder)


@dataclass
class Recorder:
    """Request handler: records, can sleep, fail the first N calls or report duplicates."""

    result: RequestOutcome = RequestOutcome.ACCEPTED
    fail_first: int = 0
    fail_ids: set[str] = field(default_factory=set)
    delay_seconds: float = 0.0
    dedupe: bool = False
    requests: list[tuple[int, SpawnRequest]] = field(default_factory=list)
    calls: int = 0
    concurrent: int = 0
    max_concurrent: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    arrival_times: dict[str, float] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)

    async def _handle(self, request_id: str) -> RequestOutcome:
        self.calls += 1
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.delay_seconds:
                await asyncio.sleep(self.delay_seconds)
            if self.calls <= self.fail_first or request_id in self.fail_ids:
                raise RuntimeError("boom")
            if self.dedupe:
                if request_id in self._seen:
                    return RequestOutcome.DUPLICATE
                self._seen.add(request_id)
            return self.result
        finally:
            self.concurrent -= 1

    async def on_request(self, chat_id: int, request: SpawnRequest) -> RequestOutcome:
        result = await self._handle(request.request_id)
        self.requests.append((chat_id, request))
        self.arrival_times.setdefault(request.request_id, time.monotonic())
        self.arrived.set()
        return result

    def request_ids(self) -> list[str]:
        return [request.request_id for _, request in self.requests]


def make_watcher(
    root: Path,
    recorder: Recorder,
    folders: FolderMap | None = None,
    *,
    rescan_interval_seconds: float = 60.0,
    force_polling: bool = False,
    max_file_bytes: int = MAX_BYTES,
    max_handler_failures: int = 5,
    clock: Callable[[], float] = time.time,
) -> IpcWatcher:
    return IpcWatcher(
        root,
        folders or FolderMap(CHATS),
        recorder.on_request,
        rescan_interval_seconds=rescan_interval_seconds,
        force_polling=force_polling,
        max_file_bytes=max_file_bytes,
        max_handler_failures=max_handler_failures,
        clock=clock,
    )


def request_json(request_id: str = "req-000001", **fields: object) -> bytes:
    body: dict[str, object] = {"request_id": request_id, "task": "count the files", **fields}
    return json.dumps(body).encode()


def quarantined(root: Path) -> dict[str, str]:
    """errors/ as {quarantined entry name: reason line}."""
    errors = root / ERRORS_DIR
    out: dict[str, str] = {}
    for entry in sorted(os.listdir(errors)):
        if entry.endswith(REASON_SUFFIX):
            continue
        out[entry] = (errors / (entry + REASON_SUFFIX)).read_text(encoding="utf-8")
    return out


def only_reason(root: Path) -> str:
    """The reason of the one entry in errors/ (there must be exactly one)."""
    entries = quarantined(root)
    assert len(entries) == 1, entries
    (reason,) = entries.values()
    assert reason.endswith("\n") and reason.count("\n") == 1
    return reason.strip()


def left_in(root: Path) -> list[str]:
    """Every non-directory entry under the root outside errors/."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel.parts[:1] == (ERRORS_DIR,):
            continue
        found += [str(rel / name) for name in filenames]
        found += [str(rel / name) for name in dirnames if (Path(dirpath) / name).is_symlink()]
    return sorted(found)


async def until(condition: Callable[[], bool], within_seconds: float = ARRIVAL_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + within_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)
