"""The running watcher on a real filesystem with real watchfiles: inotify, polling, restarts, races."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from container.protocol import SpawnRequest
from runner.ipc import ensure_chat_dirs, write_spawn_request
from runner.watcher import IpcWatcher
from tests.runner.ipc_helpers import (
    ARRIVAL_TIMEOUT_SECONDS,
    CHATS,
    FolderMap,
    Recorder,
    left_in,
    make_watcher,
    quarantined,
    request_json,
    until,
)

# Long enough that a file arriving before it can only have come through the watch, not a rescan.
NO_RESCAN_SECONDS = 600.0


@asynccontextmanager
async def running(watcher: IpcWatcher) -> AsyncIterator[IpcWatcher]:
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.ready.wait(), ARRIVAL_TIMEOUT_SECONDS)
        yield watcher
    finally:
        await asyncio.wait_for(watcher.close(), ARRIVAL_TIMEOUT_SECONDS)
        await task


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ipc = tmp_path / "ipc"
    for folder in CHATS:
        ensure_chat_dirs(ipc, folder)
    return ipc


@pytest.mark.parametrize("force_polling", [False, True], ids=["inotify", "polling"])
async def test_request_written_after_start_arrives_through_the_watch(root: Path, force_polling: bool) -> None:
    recorder = Recorder()
    watcher = make_watcher(root, recorder, rescan_interval_seconds=NO_RESCAN_SECONDS, force_polling=force_polling)
    async with running(watcher):
        started = time.monotonic()
        write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-000001", task="t"))
        await asyncio.wait_for(recorder.arrived.wait(), ARRIVAL_TIMEOUT_SECONDS)
        latency = recorder.arrival_times["req-000001"] - started
        await until(lambda: left_in(root) == [])
    print(f"pickup latency ({'polling' if force_polling else 'inotify'}): {latency * 1000:.1f} ms")
    assert [chat_id for chat_id, _ in recorder.requests] == [1]


async def test_file_present_before_start_is_swept(root: Path) -> None:
    recorder = Recorder()
    write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-000001", task="t"))
    async with running(make_watcher(root, recorder, rescan_interval_seconds=NO_RESCAN_SECONDS)):
        # ready means the startup sweep is done
        assert recorder.request_ids() == ["req-000001"]


async def test_ipc_root_missing_at_start_is_created(tmp_path: Path) -> None:
    root = tmp_path / "data" / "ipc"
    async with running(make_watcher(root, Recorder(), rescan_interval_seconds=NO_RESCAN_SECONDS)):
        assert (root / "errors").is_dir()


@pytest.mark.parametrize("force_polling", [False, True], ids=["inotify", "polling"])
async def test_chat_folder_created_after_start(root: Path, force_polling: bool) -> None:
    recorder = Recorder()
    folders = FolderMap(CHATS)
    watcher = make_watcher(
        root, recorder, folders, rescan_interval_seconds=NO_RESCAN_SECONDS, force_polling=force_polling
    )
    async with running(watcher):
        folders.chats["chat_77"] = 77
        ensure_chat_dirs(root, "chat_77")
        await asyncio.sleep(0.3)  # the watch restarts to take in the new folders
        write_spawn_request(root, "chat_77", SpawnRequest(request_id="req-000001", task="t"))
        await asyncio.wait_for(recorder.arrived.wait(), ARRIVAL_TIMEOUT_SECONDS)
    assert [chat_id for chat_id, _ in recorder.requests] == [77]


async def test_file_written_right_after_a_new_chat_folder_is_not_missed(root: Path) -> None:
    recorder = Recorder()
    folders = FolderMap(CHATS)
    async with running(make_watcher(root, recorder, folders, rescan_interval_seconds=NO_RESCAN_SECONDS)):
        folders.chats["chat_77"] = 77
        ensure_chat_dirs(root, "chat_77")
        write_spawn_request(root, "chat_77", SpawnRequest(request_id="req-000001", task="t"))
        await asyncio.wait_for(recorder.arrived.wait(), ARRIVAL_TIMEOUT_SECONDS)
    assert [chat_id for chat_id, _ in recorder.requests] == [77]


async def test_watch_and_rescan_racing_hand_each_file_over_once(root: Path) -> None:
    """A slow handler, a rescan every 10 ms and inotify all see the same files."""
    recorder = Recorder(delay_seconds=0.2)
    count = 20
    async with running(make_watcher(root, recorder, rescan_interval_seconds=0.01)):
        for i in range(count):
            write_spawn_request(root, "chat_1", SpawnRequest(request_id=f"req-{i:06d}", task="t"))
            await asyncio.sleep(0.005)
        await until(lambda: len(recorder.requests) >= count, within_seconds=30)
        await asyncio.sleep(0.3)  # time for a second handing-over, if there were one
    ids = recorder.request_ids()
    assert sorted(ids) == [f"req-{i:06d}" for i in range(count)]
    assert left_in(root) == [] and quarantined(root) == {}


async def test_watcher_survives_a_failing_handler(root: Path) -> None:
    recorder = Recorder(fail_ids={"req-bad000"})
    watcher = make_watcher(root, recorder, rescan_interval_seconds=0.05, max_handler_failures=3)
    async with running(watcher):
        write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-bad000", task="t"))
        await until(lambda: len(quarantined(root)) == 1)
        write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-good00", task="t"))
        await until(lambda: "req-good00" in recorder.request_ids())
    assert list(quarantined(root).values()) == ["handler failed 3 times; last error: RuntimeError: boom\n"]
    assert recorder.calls == 4


async def test_watcher_survives_a_name_watchfiles_cannot_decode(root: Path) -> None:
    """watchfiles raises on a non-UTF-8 file name; the watch restarts and its sweep quarantines the file."""
    recorder = Recorder()
    async with running(make_watcher(root, recorder, rescan_interval_seconds=NO_RESCAN_SECONDS)) as watcher:
        fd = os.open(os.fsencode(root / "chat_1" / "tasks") + b"/\xff\xfe.json", os.O_CREAT | os.O_WRONLY)
        os.close(fd)
        await until(lambda: len(quarantined(root)) == 1)
        await until(watcher.ready.is_set)
        write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-after1", task="t"))
        await asyncio.wait_for(recorder.arrived.wait(), ARRIVAL_TIMEOUT_SECONDS)
    assert recorder.request_ids() == ["req-after1"]
    ((name, reason),) = quarantined(root).items()
    assert name.endswith("-chat_1-__.json") and reason.startswith("invalid JSON")


async def test_ipc_root_deleted_and_recreated(root: Path) -> None:
    recorder = Recorder()
    folders = FolderMap(CHATS)
    async with running(make_watcher(root, recorder, folders, rescan_interval_seconds=0.2)):
        shutil.rmtree(root)
        await until(lambda: (root / "errors").is_dir())  # the watcher put the root back
        ensure_chat_dirs(root, "chat_1")
        await asyncio.sleep(0.3)
        write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-000001", task="t"))
        await asyncio.wait_for(recorder.arrived.wait(), ARRIVAL_TIMEOUT_SECONDS)
    assert recorder.request_ids() == ["req-000001"]


async def test_unauthorised_file_is_quarantined_while_running(root: Path) -> None:
    recorder = Recorder()
    async with running(make_watcher(root, recorder, rescan_interval_seconds=NO_RESCAN_SECONDS)):
        (root / "chat_1" / "tasks" / "req-000001.json").write_bytes(request_json(chat_id=-100200))
        await until(lambda: len(quarantined(root)) == 1)
    assert recorder.calls == 0


async def test_close_is_prompt_and_run_can_be_cancelled(root: Path) -> None:
    watcher = make_watcher(root, Recorder(), rescan_interval_seconds=NO_RESCAN_SECONDS)
    task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(watcher.ready.wait(), ARRIVAL_TIMEOUT_SECONDS)
    started = time.monotonic()
    await watcher.close()
    await task
    assert time.monotonic() - started < 1.0
    assert not watcher.ready.is_set()

    task = asyncio.create_task(watcher.run())  # runs again after a stop
    await asyncio.wait_for(watcher.ready.wait(), ARRIVAL_TIMEOUT_SECONDS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
