"""Property test: whatever is left in the IPC folders, the watcher never crashes, and every entry is handed
over exactly once, quarantined exactly once (on its own, or inside a directory that does not belong, such as
the `messages/` of an older deployment), or (a temp file) removed; nothing stays behind."""

from __future__ import annotations

import asyncio
import json
import os
import string
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import structlog.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from container.protocol import SpawnRequest
from runner.ipc.batch import RequestOutcome
from runner.ipc.requests import ERRORS_DIR, REASON_SUFFIX, TEMP_PREFIX, ensure_chat_dirs
from runner.ipc.watcher import IpcWatcher
from tests.runner.ipc.ipc_helpers import left_in, until

KNOWN = {"chat_1": 1, "chat_m5": -5}
UNKNOWN = "chat_999"
MAX_BYTES = 2048
MAX_FAILURES = 2
FAILING_PREFIX = "FAIL"  # ids the handler always raises for
DUPLICATE_PREFIX = "DUP"  # ids the handler reports as seen before
HOUR_SECONDS = 3600.0
KIND_DIRS = [f"{folder}/tasks" for folder in (*KNOWN, UNKNOWN)]
LEGACY = "messages"  # what containers wrote progress messages into before the run channel
LEGACY_DIRS = [f"{folder}/{LEGACY}" for folder in (*KNOWN, UNKNOWN)]
RESERVED_NAMES = {ERRORS_DIR, "tasks", LEGACY, *KNOWN, UNKNOWN}


class Expect(Enum):
    HANDLED = "handled"
    QUARANTINED = "quarantined"
    REMOVED = "removed"
    EITHER = "handled or quarantined"
    NESTED = "quarantined with the directory it is in"


class Kind(Enum):
    FILE = "file"
    SYMLINK = "symlink"
    DIRECTORY = "directory"
    FIFO = "fifo"


@dataclass(frozen=True)
class Entry:
    where: str  # "" for the ipc root, "chat_1" for a chat folder, "chat_1/tasks", ...
    name: str
    kind: Kind
    data: bytes = b""
    valid_for: tuple[str, int | None] | None = None  # (request_id, chat_id) of a well-formed request


# --- strategies ------------------------------------------------------------------------------------------

# `[A-Za-z0-9_-]{n,m}` as text of that alphabet: the same strings, drawn without the regex strategy's cost.
ID_CHARS = string.ascii_letters + string.digits + "_-"
ids = st.one_of(
    st.text(ID_CHARS, min_size=6, max_size=24),
    st.text(ID_CHARS, min_size=2, max_size=20).map(lambda s: FAILING_PREFIX + s),
    st.text(ID_CHARS, min_size=3, max_size=20).map(lambda s: DUPLICATE_PREFIX + s),
)
chat_ids = st.one_of(st.none(), st.sampled_from([1, -5, 2]), st.integers())
text_names = st.text(st.characters(exclude_characters="/\x00", exclude_categories=["Cs"]), min_size=1, max_size=40)
byte_names = st.binary(min_size=1, max_size=40).map(lambda b: os.fsdecode(b.replace(b"/", b"_").replace(b"\x00", b"_")))
names = st.one_of(
    text_names,
    byte_names,
    text_names.map(lambda n: n + ".json"),
    byte_names.map(lambda n: n + ".json"),
    text_names.map(lambda n: TEMP_PREFIX + n),
    st.sampled_from([".json", "..json", ".tmp-", "...", " .json", "-.json", "\n.json"]),
).filter(lambda n: n not in (".", "..") and len(os.fsencode(n)) <= 200)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=6,
)


@st.composite
def valid_models(draw: st.DrawFn) -> Entry:
    where = draw(st.sampled_from([*KIND_DIRS, *KIND_DIRS, *LEGACY_DIRS]))
    item_id = draw(ids)
    chat_id = draw(chat_ids)
    model = SpawnRequest(request_id=item_id, task="t", chat_id=chat_id)
    name = draw(st.sampled_from([f"{item_id}.json", f"{item_id}.json", f"{item_id}x.json", item_id]))
    data = model.model_dump_json().encode()
    return Entry(where, name, Kind.FILE, data, valid_for=(item_id, chat_id))


@st.composite
def json_ish(draw: st.DrawFn) -> Entry:
    body = draw(
        st.dictionaries(st.sampled_from(["request_id", "task", "message_id", "text", "chat_id", "x"]), json_values)
    )
    where = draw(st.sampled_from([*KIND_DIRS, *LEGACY_DIRS]))
    return Entry(where, draw(names), Kind.FILE, json.dumps(body).encode())


@st.composite
def raw(draw: st.DrawFn) -> Entry:
    where = draw(st.sampled_from(["", *KNOWN, UNKNOWN, *KIND_DIRS, *KIND_DIRS, *LEGACY_DIRS]))
    kind = draw(st.sampled_from(list(Kind)))
    if where == "" and kind is Kind.DIRECTORY:
        kind = Kind.FILE  # a directory in the root is a chat folder (unknown here), not a stray entry
    size = draw(st.sampled_from([0, 10, 300, MAX_BYTES, MAX_BYTES + 1, MAX_BYTES * 3]))
    data = draw(st.binary(min_size=min(size, 100), max_size=min(size, 100)))
    data = data + b"\x00" * (size - len(data))
    return Entry(where, draw(names), kind, data)


entries = st.one_of(valid_models(), valid_models(), json_ish(), raw())


# --- running it ------------------------------------------------------------------------------------------


class Handler:
    def __init__(self) -> None:
        self.calls: Counter[tuple[int, str]] = Counter()
        self.accepted: Counter[tuple[int, str]] = Counter()

    async def on_request(self, chat_id: int, request: SpawnRequest) -> RequestOutcome:
        request_id = request.request_id
        self.calls[(chat_id, request_id)] += 1
        await asyncio.sleep(0)  # let a concurrent sweep run into the in-flight entry
        if request_id.startswith(FAILING_PREFIX):
            raise RuntimeError("handler failed")
        if request_id.startswith(DUPLICATE_PREFIX):
            return RequestOutcome.DUPLICATE
        self.accepted[(chat_id, request_id)] += 1
        return RequestOutcome.ACCEPTED


async def resolve(folder: str) -> int | None:
    return KNOWN.get(folder)


def expected(entry: Entry) -> Expect:
    parts = entry.where.split("/") if entry.where else []
    if parts[1:] == [LEGACY]:
        return Expect.NESTED
    regular = entry.kind is Kind.FILE
    if regular and entry.name.startswith(TEMP_PREFIX):
        return Expect.REMOVED
    if len(parts) < 2 or parts[0] == UNKNOWN or not regular or not entry.name.endswith(".json"):
        return Expect.QUARANTINED
    if len(entry.data) > MAX_BYTES:
        return Expect.QUARANTINED
    if entry.valid_for is None:
        return Expect.EITHER  # random content: practically never valid, but not ours to decide here
    item_id, chat_id = entry.valid_for
    ok = (
        entry.name == f"{item_id}.json"
        and chat_id in (None, KNOWN[parts[0]])
        and not item_id.startswith((FAILING_PREFIX, DUPLICATE_PREFIX))
    )
    return Expect.HANDLED if ok else Expect.QUARANTINED


def write(parent: Path, entry: Entry, secret: Path) -> int:
    """Create the entry in `parent`; returns its inode (kept by a rename into errors/)."""
    path = os.path.join(parent, entry.name)
    if entry.kind is Kind.FILE:
        with open(path, "wb") as handle:
            handle.write(entry.data)
    elif entry.kind is Kind.SYMLINK:
        os.symlink(secret, path)
    elif entry.kind is Kind.DIRECTORY:
        os.mkdir(path)
        with open(os.path.join(path, "inner.json"), "wb") as handle:
            handle.write(entry.data)
    else:
        os.mkfifo(path)
    return os.lstat(path).st_ino


def unique(batch: list[Entry]) -> list[Entry]:
    """One entry per path, and none that would collide with the folders themselves."""
    seen: dict[tuple[str, bytes], Entry] = {}
    for entry in batch:
        if entry.where.count("/") < 1 and entry.name in RESERVED_NAMES:
            continue
        seen[(entry.where, os.fsencode(entry.name))] = entry
    return list(seen.values())


def nested_in_errors(root: Path) -> set[int]:
    """Inodes of everything inside the directories quarantined whole."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root / ERRORS_DIR):
        if Path(dirpath) != root / ERRORS_DIR:
            found |= {os.lstat(os.path.join(dirpath, name)).st_ino for name in [*dirnames, *filenames]}
    return found


def errors_by_inode(root: Path) -> dict[int, str]:
    errors = root / ERRORS_DIR
    found = {}
    for name in os.listdir(errors):
        if name.endswith(REASON_SUFFIX):
            continue
        reason = (errors / (name + REASON_SUFFIX)).read_text(encoding="utf-8")
        assert reason.endswith("\n") and reason.count("\n") == 1, (name, reason)
        found[os.lstat(errors / name).st_ino] = reason
    assert len(os.listdir(errors)) == 2 * len(found)  # every entry has its reason file, nothing else
    return found


def check(root: Path, written: list[tuple[Entry, int]], handler: Handler, secret: Path, secret_data: bytes) -> None:
    assert left_in(root) == [], "nothing stays behind"
    quarantined = errors_by_inode(root)
    nested = nested_in_errors(root)
    written_inodes = {inode for _, inode in written}
    assert set(quarantined) <= written_inodes, "only what was written is in errors/"
    handed: Counter[tuple[int, str]] = Counter()
    for entry, inode in written:
        expect = expected(entry)
        if expect is Expect.NESTED:
            assert inode in nested, entry
            continue
        if inode in quarantined:
            assert expect in (Expect.QUARANTINED, Expect.EITHER), (entry, quarantined[inode])
            continue
        assert expect is not Expect.QUARANTINED, entry
        if expect is Expect.REMOVED:
            continue
        assert entry.valid_for is not None, entry
        item_id, _ = entry.valid_for
        handed[(KNOWN[entry.where.split("/")[0]], item_id)] += 1
    assert handed == handler.accepted, "each handed-over file accepted exactly once"
    for key, calls in handler.calls.items():
        assert calls == (MAX_FAILURES if key[1].startswith(FAILING_PREFIX) else 1), (key, calls)
    assert secret.read_bytes() == secret_data


async def sweep_until_settled(watcher: IpcWatcher) -> None:
    # Two sweeps at once race for the same entries; then enough more to exhaust the failing handlers.
    await asyncio.gather(watcher.sweep(), watcher.sweep())
    for _ in range(MAX_FAILURES):
        await watcher.sweep()


def make_watcher(root: Path, handler: Handler, rescan_interval_seconds: float) -> IpcWatcher:
    return IpcWatcher(
        root,
        resolve,
        handler.on_request,
        rescan_interval_seconds=rescan_interval_seconds,
        force_polling=False,
        max_file_bytes=MAX_BYTES,
        max_handler_failures=MAX_FAILURES,
        # An hour ahead: temp and non-.json files count as abandoned, so the outcome is decided now.
        clock=lambda: time.time() + HOUR_SECONDS,
    )


def prepare(base: Path, batch: list[Entry]) -> tuple[Path, list[tuple[Entry, int]], Path, bytes]:
    root = base / "ipc"
    for folder in (*KNOWN, UNKNOWN):
        ensure_chat_dirs(root, folder)
    secret = base / "secret.json"
    secret_data = SpawnRequest(request_id="secret-1", task="host file").model_dump_json().encode()
    secret.write_bytes(secret_data)
    written = []
    legacy: dict[str, list[Entry]] = {}
    for entry in unique(batch):
        if entry.where in LEGACY_DIRS:
            legacy.setdefault(entry.where, []).append(entry)
        else:
            written.append((entry, write(root / entry.where, entry, secret)))
    for where, contents in legacy.items():
        # Built aside and renamed in whole, so a running watcher cannot quarantine it half-written.
        staging = base / "staging" / where
        staging.mkdir(parents=True)
        written += [(entry, write(staging, entry, secret)) for entry in contents]
        folder = where.split("/")[0]
        os.rename(staging, root / where)
        written.append((Entry(folder, LEGACY, Kind.DIRECTORY), os.lstat(root / where).st_ino))
    return root, written, secret, secret_data


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(batch=st.lists(entries, min_size=40, max_size=120))
def test_sweeps_handle_or_quarantine_everything_exactly_once(batch: list[Entry]) -> None:
    with tempfile.TemporaryDirectory() as base:
        root, written, secret, secret_data = prepare(Path(base), batch)
        handler = Handler()
        watcher = make_watcher(root, handler, rescan_interval_seconds=HOUR_SECONDS)
        # Every failing handler call logs its traceback; captured, not rendered (structlog's default renderer
        # draws each with rich, a tenth of a second apiece: about 18 s of this test's 41).
        with structlog.testing.capture_logs():
            asyncio.run(sweep_until_settled(watcher))
            check(root, written, handler, secret, secret_data)
            calls_before = handler.calls.copy()
            asyncio.run(watcher.sweep())
        assert handler.calls == calls_before, "a later sweep hands nothing over again"


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(batch=st.lists(entries, min_size=50, max_size=150))
def test_running_watcher_handles_or_quarantines_everything_exactly_once(batch: list[Entry]) -> None:
    """The same, written while the watcher runs: inotify and 20 ms rescans race for every file."""

    async def scenario(base: Path) -> tuple[Path, list[tuple[Entry, int]], Path, bytes, Handler]:
        root = base / "ipc"
        for folder in (*KNOWN, UNKNOWN):
            ensure_chat_dirs(root, folder)
        handler = Handler()
        watcher = make_watcher(root, handler, rescan_interval_seconds=0.02)
        task = asyncio.create_task(watcher.run())
        try:
            await asyncio.wait_for(watcher.ready.wait(), 5)
            prepared = prepare(base, batch)
            await until(lambda: not left_in(root), within_seconds=10)
        finally:
            await watcher.close()
            await task
        return (*prepared, handler)

    with tempfile.TemporaryDirectory() as base, structlog.testing.capture_logs():  # as in the test above
        root, written, secret, secret_data, handler = asyncio.run(scenario(Path(base)))
        check(root, written, handler, secret, secret_data)
