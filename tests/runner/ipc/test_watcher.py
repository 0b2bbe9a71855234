"""The running watcher on a real filesystem with real watchfiles: inotify, polling, restarts, races."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import pytest

from container.protocol import SpawnRequest
from runner.ipc.requests import ERRORS_DIR, ensure_chat_dirs, write_spawn_request
from runner.ipc.watcher import IpcWatcher
from tests.runner.ipc.ipc_helpers import (
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
JUNK_FILES = 10_000
# Generous: the aim is < 50 ms on a quiet machine (bench/loop_stall.py measures it); this catches the loop
# doing the file work again, which stalled it for seconds, without failing when other work shares the CPUs.
MAX_LOOP_GAP_SECONDS = 1.0
PROBE_SLEEP_SECONDS = 0.005
FLOOD_TIMEOUT_SECONDS = 120.0


@asynccontextmanager
async def running(watcher: IpcWatcher) -> AsyncIterator[IpcWatcher]:
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.ready.wait(), ARRIVAL_TIMEOUT_SECONDS)
        yield watcher
    finally:
        await asyncio.wait_for(watcher.close(), ARRIVAL_TIMEOUT_SECONDS)
        await task


class LagProbe:
    """Sleeps 5 ms in a loop and keeps the largest gap between two wake-ups: how long the loop was busy."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(PROBE_SLEEP_SECONDS)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        with suppress(asyncio.CancelledError):
            await self._task
        return self.worst


# Junk comes from outside the process (a thread of ours writing it would compete for the GIL and
# measure the test instead of the watcher).
JUNK_WRITER = """
import pathlib, sys
folder, count = pathlib.Path(sys.argv[1]), int(sys.argv[2])
for i in range(count):
    (folder / f"junk-{i:05d}.json").write_bytes(b"{")
"""


async def write_junk(tasks: Path, count: int) -> None:
    writer = await asyncio.create_subprocess_exec(sys.executable, "-c", JUNK_WRITER, str(tasks), str(count))
    assert await writer.wait() == 0


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """Keep the test process's own garbage out of the lag figure: a full collection of its heap (pytest,
    hypothesis, ...) took 90-170 ms on a loaded 2-CPU machine, and the flood's change events trigger one.
    That pause is the heap's, not the watcher's; frozen, a collection only scans what the test made."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def quarantined_count(root: Path) -> int:
    # In a thread: listing 20,000 entries on the loop would be the very stall the probe looks for.
    return len(await asyncio.to_thread(os.listdir, root / ERRORS_DIR)) // 2


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


@pytest.mark.parametrize("arrival", ["while-running", "before-start"])
@pytest.mark.usefixtures("frozen_heap")
async def test_a_flood_of_junk_is_quarantined_without_stalling_the_loop(root: Path, arrival: str) -> None:
    """10,000 junk files in one chat's tasks/: all quarantined, a request after them handed over, and the
    loop never busy for long: the file work happens in threads (the probe shares the loop with the watcher)."""
    recorder = Recorder()
    tasks = root / "chat_1" / "tasks"
    if arrival == "before-start":
        await write_junk(tasks, JUNK_FILES)
    probe = LagProbe()
    probe.start()
    watcher = make_watcher(root, recorder, rescan_interval_seconds=0.5)
    started = time.monotonic()
    task = asyncio.create_task(watcher.run())
    try:
        # Ready follows the start-up sweep, which has the whole flood to go through when it came first.
        await asyncio.wait_for(watcher.ready.wait(), FLOOD_TIMEOUT_SECONDS)
        if arrival == "while-running":
            await write_junk(tasks, JUNK_FILES)
        request = SpawnRequest(request_id="req-after1", task="t")
        await asyncio.to_thread(write_spawn_request, root, "chat_1", request)
        deadline = time.monotonic() + FLOOD_TIMEOUT_SECONDS
        # Done when every junk file is quarantined and the request handed over and deleted (the handler accepts
        # it first, then a thread deletes it: waiting for the handing-over alone raced with that deletion).
        while (
            await quarantined_count(root) < JUNK_FILES
            or not recorder.requests
            or await asyncio.to_thread(lambda: bool(os.listdir(tasks)))
        ):
            assert time.monotonic() < deadline, f"{await quarantined_count(root)} quarantined so far"
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        await asyncio.wait_for(watcher.close(), ARRIVAL_TIMEOUT_SECONDS)
        await task
    worst = await probe.stop()
    print(
        f"{JUNK_FILES} junk files ({arrival}): quarantined in {elapsed:.1f} s, largest loop gap {worst * 1000:.1f} ms"
    )
    assert recorder.request_ids() == ["req-after1"]
    assert await asyncio.to_thread(os.listdir, tasks) == []
    reasons = await asyncio.to_thread(lambda: {p.read_text() for p in (root / ERRORS_DIR).glob("*.reason.txt")})
    assert {reason.split(":")[0] for reason in reasons} == {"invalid JSON"}
    assert worst < MAX_LOOP_GAP_SECONDS, f"the loop stalled for {worst * 1000:.0f} ms"


@pytest.mark.parametrize("force_polling", [False, True], ids=["inotify", "polling"])
async def test_a_file_in_a_messages_folder_is_quarantined_never_handed_over(root: Path, force_polling: bool) -> None:
    """Progress messages travel over the run channel now; a messages/ folder is an entry that does not belong."""
    recorder = Recorder()
    watcher = make_watcher(root, recorder, rescan_interval_seconds=NO_RESCAN_SECONDS, force_polling=force_polling)
    async with running(watcher):
        staging = root.parent / "messages"
        staging.mkdir()
        (staging / "req-000001.json").write_bytes(request_json())
        staging.rename(root / "chat_1" / "messages")
        await until(lambda: len(quarantined(root)) == 1)
        write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-000002", task="t"))
        await asyncio.wait_for(recorder.arrived.wait(), ARRIVAL_TIMEOUT_SECONDS)
        await until(lambda: left_in(root) == [])  # deleted (in a thread) once the handler accepted it
    assert recorder.request_ids() == ["req-000002"]
    ((name, reason),) = quarantined(root).items()
    assert name.endswith("-chat_1-messages") and reason == "unexpected directory in a chat folder\n"
    assert (root / ERRORS_DIR / name / "req-000001.json").read_bytes() == request_json()
    assert left_in(root) == []
