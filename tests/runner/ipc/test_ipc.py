"""IPC files on a real filesystem: what is handed over, what is quarantined and why (via `sweep()`).

The chat folders themselves and the quarantine helpers: test_ipc_folders.py."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from container.protocol import SpawnRequest
from runner.ipc import batch as ipc_batch
from runner.ipc.requests import ERRORS_DIR, ensure_chat_dirs, write_spawn_request
from runner.ipc.scan import BATCH_ENTRIES
from tests.runner.ipc.ipc_helpers import (
    CHATS,
    MAX_BYTES,
    FolderMap,
    Recorder,
    left_in,
    make_watcher,
    only_reason,
    quarantined,
    request_json,
)

HOUR_SECONDS = 3600.0
QUARANTINE_NAME = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-(?P<folder>[A-Za-z0-9._-]+?)-(?P<name>[A-Za-z0-9._-]+?)(-\d+)?$")


# --- helpers used only here -----------------------------------------------------------------------------


def put(root: Path, folder: str, kind: str, name: str, data: bytes) -> Path:
    path = root / folder / kind / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ipc = tmp_path / "ipc"
    for folder in CHATS:
        ensure_chat_dirs(ipc, folder)
    return ipc


# --- handing over -----------------------------------------------------------------------------------


async def test_valid_request_is_handed_over_with_the_folders_chat_and_deleted(root: Path) -> None:
    recorder = Recorder()
    path = put(root, "chat_m100200", "tasks", "req-000001.json", request_json(label="files"))
    await make_watcher(root, recorder).sweep()
    assert [(chat_id, r.request_id, r.label) for chat_id, r in recorder.requests] == [(-100200, "req-000001", "files")]
    assert not path.exists()
    assert quarantined(root) == {}


async def test_matching_chat_id_in_the_file_is_accepted(root: Path) -> None:
    recorder = Recorder()
    put(root, "chat_1", "tasks", "req-000001.json", request_json(chat_id=1))
    await make_watcher(root, recorder).sweep()
    assert len(recorder.requests) == 1


async def test_write_spawn_request_round_trips(root: Path) -> None:
    recorder = Recorder()
    request = SpawnRequest(request_id="req-abcdef", task="t", include_context=True)
    path = write_spawn_request(root, "chat_1", request)
    assert path == root / "chat_1" / "tasks" / "req-abcdef.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    await make_watcher(root, recorder).sweep()
    assert recorder.requests == [(1, request)]


async def test_the_files_a_request_names_round_trip(root: Path) -> None:
    recorder = Recorder()
    request = SpawnRequest(request_id="req-files1", task="plot it", files=["f3", "f12"])
    write_spawn_request(root, "chat_1", request)
    await make_watcher(root, recorder).sweep()
    assert [r.files for _, r in recorder.requests] == [["f3", "f12"]]


@pytest.mark.parametrize("ref", ["3", "f0", "f03", "../f3", "f3/..", "F3", "f" + "9" * 19, "f3 "])
def test_a_request_naming_a_file_by_anything_but_its_id_is_refused(ref: str) -> None:
    # The spawn tool shows this message to the model, which can correct itself.
    with pytest.raises(ValidationError, match="is not a file id like f3"):
        SpawnRequest(request_id="req-files2", task="plot it", files=[ref])


def test_a_request_names_at_most_the_files_one_run_may_be_given() -> None:
    with pytest.raises(ValidationError, match="at most 10 items"):
        SpawnRequest(request_id="req-files3", task="plot it", files=[f"f{n}" for n in range(1, 12)])


@pytest.mark.parametrize("read_budget", [ipc_batch.MAX_BATCH_READ_BYTES, 300], ids=["default", "tiny"])
async def test_many_requests_are_handed_over_once_in_name_order_across_batches(
    root: Path, monkeypatch: pytest.MonkeyPatch, read_budget: int
) -> None:
    """More files than one batch holds; a tiny read budget makes every batch stop early and hand the rest back."""
    monkeypatch.setattr(ipc_batch, "MAX_BATCH_READ_BYTES", read_budget)
    count = 2 * BATCH_ENTRIES + 50
    ids = [f"req-{i:06d}" for i in range(count)]
    for request_id in reversed(ids):
        put(root, "chat_1", "tasks", f"{request_id}.json", request_json(request_id))
    put(root, "chat_1", "tasks", "req-000100x.json", b"{")  # junk in the middle of a batch
    recorder = Recorder()
    await make_watcher(root, recorder).sweep()
    assert recorder.request_ids() == ids
    assert only_reason(root).startswith("invalid JSON")
    assert left_in(root) == []


# --- quarantine reasons --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("req-000001.json", b'{"request_id": "req-000001", "task": ', "invalid JSON: EOF while parsing"),
        ("req-000001.json", b"", "invalid JSON: EOF while parsing a value at line 1 column 0"),
        ("req-000001.json", b"\xff\xfe{}", "invalid UTF-8 at byte 0"),
        ("req-000001.json", b"[1, 2]", "schema violation: (top level): Input should be an object"),
        ("req-000001.json", b'{"request_id": "req-000001"}', "schema violation: task: Field required"),
        ("req-000001.json", request_json(task=""), "schema violation: task: String should have at least 1"),
        ("req-000001.json", request_json(admin=True), "schema violation: admin: Extra inputs are not permitted"),
        ("bad id!.json", request_json("bad id!"), "schema violation: request_id: String should match pattern"),
        ("req-000001.json", request_json(version=2), "schema violation: version: Input should be 1"),
        (
            "req-000001.json",
            b'{"request_id":"req-000001","task":"x","created_at":NaN}',
            "schema violation: created_at: must be a",
        ),
        ("req-000001.json", request_json(chat_id=-100200), "unauthorised: chat_id -100200 is not the folder's"),
        ("other.json", request_json("req-000001"), "file name does not match request_id"),
        ("req-000001.json", request_json("req-000002"), "file name does not match request_id"),
    ],
)
async def test_bad_request_is_quarantined_with_its_reason(root: Path, name: str, data: bytes, reason: str) -> None:
    recorder = Recorder()
    put(root, "chat_1", "tasks", name, data)
    await make_watcher(root, recorder).sweep()
    assert recorder.calls == 0
    assert only_reason(root).startswith(reason)
    assert left_in(root) == []


async def test_a_messages_folder_is_quarantined_and_its_files_never_handed_over(root: Path) -> None:
    """messages/ is gone from the protocol: beside tasks/ it is just another unexpected entry."""
    recorder = Recorder()
    put(root, "chat_1", "messages", "req-000001.json", request_json())
    await make_watcher(root, recorder).sweep()
    assert recorder.calls == 0
    assert only_reason(root) == "unexpected directory in a chat folder"
    ((name, _),) = quarantined(root).items()
    assert name.endswith("-chat_1-messages")
    assert (root / ERRORS_DIR / name / "req-000001.json").read_bytes() == request_json()
    assert sorted(p.name for p in (root / "chat_1").iterdir()) == ["tasks"]


async def test_quarantine_file_name_and_content(root: Path) -> None:
    put(root, "chat_1", "tasks", "req-000001.json", b"{")
    await make_watcher(root, Recorder()).sweep()
    ((name, reason),) = quarantined(root).items()
    match = QUARANTINE_NAME.match(name)
    assert match is not None, name
    assert (match["folder"], match["name"]) == ("chat_1", "req-000001.json")
    assert (root / ERRORS_DIR / name).read_bytes() == b"{"
    assert reason.startswith("invalid JSON: ") and reason.count("\n") == 1


async def test_oversized_file_is_quarantined_without_being_read_whole(root: Path) -> None:
    put(root, "chat_1", "tasks", "req-000001.json", request_json(label="x" * MAX_BYTES))
    await make_watcher(root, Recorder()).sweep()
    assert re.fullmatch(r"file too large \(\d+ bytes, limit 4096\)", only_reason(root))


async def test_file_at_exactly_the_limit_is_read(root: Path) -> None:
    recorder = Recorder()
    data = request_json()
    data = data[:-1] + b" " * (MAX_BYTES - len(data)) + b"}"
    assert len(data) == MAX_BYTES
    put(root, "chat_1", "tasks", "req-000001.json", data)
    await make_watcher(root, recorder).sweep()
    assert len(recorder.requests) == 1


async def test_unknown_folder_is_unauthorised(root: Path) -> None:
    recorder = Recorder()
    ensure_chat_dirs(root, "chat_999")
    put(root, "chat_999", "tasks", "req-000001.json", request_json())
    put(root, "chat_999", "tasks", "req-000002.json", request_json("req-000002"))
    await make_watcher(root, recorder).sweep()
    assert recorder.calls == 0
    assert sorted(quarantined(root).values()) == ["unauthorised: folder is not an allowed chat\n"] * 2
    assert (root / "chat_999" / "tasks").is_dir()  # the folder stays; it may become a chat later


async def test_chat_no_longer_allowed_is_unauthorised(root: Path) -> None:
    folders = FolderMap(CHATS)
    del folders.chats["chat_1"]
    put(root, "chat_1", "tasks", "req-000001.json", request_json())
    await make_watcher(root, Recorder(), folders).sweep()
    assert only_reason(root) == "unauthorised: folder is not an allowed chat"


async def test_symlinked_file_is_quarantined_and_its_target_untouched(root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_bytes(request_json())
    (root / "chat_1" / "tasks" / "req-000001.json").symlink_to(secret)
    recorder = Recorder()
    await make_watcher(root, recorder).sweep()
    assert recorder.calls == 0
    assert only_reason(root) == "not a regular file (symlink)"
    (moved,) = quarantined(root)
    assert (root / ERRORS_DIR / moved).is_symlink()
    assert secret.read_bytes() == request_json()


async def test_symlinked_tasks_folder_is_quarantined_and_never_followed(root: Path, tmp_path: Path) -> None:
    """A container that swaps tasks/ for a symlink must not make the host read, move or delete elsewhere."""
    outside = tmp_path / "host-dir"
    outside.mkdir()
    victims = {"req-000001.json": request_json(), "junk.json": b"{", ".tmp-old.json": b"x", "plain": b"y"}
    for name, data in victims.items():
        (outside / name).write_bytes(data)
        os.utime(outside / name, (0, 0))
    tasks = root / "chat_1" / "tasks"
    tasks.rmdir()
    tasks.symlink_to(outside)
    recorder = Recorder()
    await make_watcher(root, recorder, clock=lambda: time.time() + HOUR_SECONDS).sweep()
    assert recorder.calls == 0
    assert only_reason(root) == "tasks is not a directory (symlink)"
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == victims


async def test_non_regular_entries_are_quarantined(root: Path) -> None:
    tasks = root / "chat_1" / "tasks"
    os.mkfifo(tasks / "req-000001.json")
    (tasks / "req-000002.json").mkdir()
    (tasks / "req-000002.json" / "inner").write_text("x")
    await make_watcher(root, Recorder()).sweep()
    assert sorted(quarantined(root).values()) == [
        "not a regular file (directory)\n",
        "not a regular file (fifo)\n",
    ]
    assert left_in(root) == []


async def test_entries_outside_tasks_are_quarantined(root: Path) -> None:
    (root / "stray.json").write_bytes(request_json())
    (root / "chat_1" / "notes.txt").write_text("x")
    (root / "chat_1" / "sub").mkdir()
    await make_watcher(root, Recorder()).sweep()
    entries = quarantined(root)
    assert sorted(entries.values()) == [
        "unexpected directory in a chat folder\n",
        "unexpected regular file in a chat folder\n",
        "unexpected regular file in the ipc root\n",
    ]
    assert any(name.endswith("-_root-stray.json") for name in entries)
    assert left_in(root) == []


async def test_fresh_temp_and_non_json_files_wait_stale_ones_are_cleaned(root: Path) -> None:
    tasks = root / "chat_1" / "tasks"
    (tasks / ".tmp-abc.json").write_bytes(b"{partial")
    (tasks / "req-000001.json.part").write_bytes(b"x")
    recorder = Recorder()
    await make_watcher(root, recorder).sweep()
    assert sorted(p.name for p in tasks.iterdir()) == [".tmp-abc.json", "req-000001.json.part"]
    assert quarantined(root) == {}

    await make_watcher(root, recorder, clock=lambda: time.time() + HOUR_SECONDS).sweep()
    assert list(tasks.iterdir()) == []
    assert only_reason(root) == "not a .json file"
    assert recorder.calls == 0


async def test_future_mtime_does_not_keep_a_temp_file_fresh_forever(root: Path) -> None:
    tmp = root / "chat_1" / "tasks" / ".tmp-abc.json"
    tmp.write_bytes(b"x")
    future = time.time() + 10 * HOUR_SECONDS
    os.utime(tmp, (future, future))
    await make_watcher(root, Recorder(), clock=lambda: time.time() + HOUR_SECONDS).sweep()
    assert not tmp.exists()


# --- handler outcomes ------------------------------------------------------------------------------------


async def test_handler_failure_is_retried_then_quarantined_after_n(root: Path) -> None:
    recorder = Recorder(fail_first=100)
    path = put(root, "chat_1", "tasks", "req-000001.json", request_json())
    watcher = make_watcher(root, recorder, max_handler_failures=3)
    for _ in range(2):
        await watcher.sweep()
        assert path.exists()
    assert quarantined(root) == {}
    await watcher.sweep()
    assert not path.exists()
    assert only_reason(root) == "handler failed 3 times; last error: RuntimeError: boom"
    assert recorder.calls == 3


async def test_handler_failure_then_success_hands_over_once(root: Path) -> None:
    recorder = Recorder(fail_first=2)
    path = put(root, "chat_1", "tasks", "req-000001.json", request_json())
    watcher = make_watcher(root, recorder)
    for _ in range(4):
        await watcher.sweep()
    assert recorder.calls == 3
    assert not path.exists()
    assert quarantined(root) == {}


async def test_duplicate_goes_to_errors_with_reason(root: Path) -> None:
    recorder = Recorder(dedupe=True)
    watcher = make_watcher(root, recorder)
    put(root, "chat_1", "tasks", "req-000001.json", request_json())
    await watcher.sweep()
    put(root, "chat_1", "tasks", "req-000001.json", request_json())
    await watcher.sweep()
    assert recorder.calls == 2
    assert only_reason(root) == "duplicate request id"


async def test_resolver_failure_leaves_files_for_the_next_scan(root: Path) -> None:
    folders = FolderMap(CHATS)
    folders.fail = True
    recorder = Recorder()
    path = put(root, "chat_1", "tasks", "req-000001.json", request_json())
    watcher = make_watcher(root, recorder, folders)
    await watcher.sweep()
    assert path.exists() and quarantined(root) == {}
    folders.fail = False
    await watcher.sweep()
    assert not path.exists() and recorder.calls == 1


async def test_concurrent_sweeps_hand_a_file_over_once(root: Path) -> None:
    recorder = Recorder(delay_seconds=0.05)
    for i in range(5):
        put(root, "chat_1", "tasks", f"req-00000{i}.json", request_json(f"req-00000{i}"))
    watcher = make_watcher(root, recorder)
    await asyncio.gather(*(watcher.sweep() for _ in range(4)))
    assert sorted(recorder.request_ids()) == [f"req-00000{i}" for i in range(5)]
    assert left_in(root) == []
