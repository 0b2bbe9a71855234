"""Retention of files: chat files' copies no run used for the period go (unless a live run was given them);
copies of files runs sent go once sent and old, their records kept; finished runs' empty folders go; nothing
outside those folders is removed and no link is followed. Real SQLite, real folders."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store.chat_files import ChatFile, ChatFileStore, FileKind
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.outbox import SentFileKind
from core.store.run_files import Direction, FileOutOutcome, RunFileStore
from core.store.runs import RunStatus, RunStore
from runner.storage.chat_file_cache import ChatFileCache
from runner.storage.paths import DataPaths
from runner.storage.prune_entries import Removed, list_entries, remove_names
from runner.storage.retention import Retention
from tests.run_files_helpers import give, send

CHAT = -710
DAYS = 7.0
DAY_SECONDS = 86_400.0
NOW = time.time()  # the injected clock; ctime cannot be set, so the real present is where it starts
OLD = NOW - 2 * DAYS * DAY_SECONDS
FRESH = NOW - 0.5 * DAY_SECONDS


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "crewbot.sqlite3")
    await ChatStore(database).ensure(CHAT, "group", "files")
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
def paths(tmp_path: Path) -> DataPaths:
    return DataPaths(tmp_path / "data")


@pytest.fixture
def retention(db: Database, paths: DataPaths) -> Retention:
    return Retention(db, paths, DAYS, clock=lambda: NOW)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host file a link or a forged record points at."""
    path = tmp_path / "host" / ".env"
    path.parent.mkdir()
    path.write_text("LLM_API_KEY=secret\n")
    return path


def untouched(host_file: Path) -> bool:
    return host_file.read_text() == "LLM_API_KEY=secret\n"


def age(path: Path, when: float) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def execute(db: Database, sql: str, *params: object) -> None:
    async with db.write() as conn:
        await conn.execute(sql, params)


async def add_run(db: Database, run_id: str) -> None:
    await RunStore(db).create(
        run_id, chat_id=CHAT, turn_id=None, task="t", label="l", include_context=False, status=RunStatus.QUEUED
    )
    await execute(db, "UPDATE subagent_runs SET status = 'running' WHERE id = ?", run_id)


async def finish(db: Database, run_id: str, when: float) -> None:
    await execute(db, "UPDATE subagent_runs SET status = 'completed', finished_at = ? WHERE id = ?", when, run_id)


# --- files in ----------------------------------------------------------------------------------------------------


async def chat_file_of(db: Database, run_id: str, name: str) -> ChatFile:
    [record] = [f for f in await RunFileStore(db).of_run(run_id) if f.name == name]
    assert record.chat_file_id is not None
    [chat_file] = (await ChatFileStore(db).by_refs([f"f{record.chat_file_id}"])).values()
    return chat_file


async def given_copy(db: Database, paths: DataPaths, run_id: str, name: str, when: float) -> Path:
    """A chat file given to the run, its copy in the cache last used at `when`."""
    await give(db, run_id, CHAT, [(name, 3, FileKind.DOCUMENT)])
    copy = ChatFileCache(paths.files_in_dir, None).path_for(await chat_file_of(db, run_id, name))
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(b"a,b")
    age(copy, when)
    return copy


async def test_copies_no_run_used_for_the_period_go_unless_a_live_run_has_them(
    db: Database, paths: DataPaths, retention: Retention, outside: Path
) -> None:
    await add_run(db, "run-done")
    await add_run(db, "run-live")
    unused = await given_copy(db, paths, "run-done", "old.csv", OLD)
    used_lately = await given_copy(db, paths, "run-done", "fresh.csv", FRESH)
    live = await given_copy(db, paths, "run-live", "live.csv", OLD)  # a long run's input stays while it runs
    await finish(db, "run-done", OLD)
    crashed = paths.files_in_dir / ".download-x1"  # a download a crash interrupted
    crashed.write_bytes(b"half")
    age(crashed, OLD)
    link = paths.files_in_dir / "planted"
    link.symlink_to(outside)
    age(link, OLD)

    report = await retention.prune()

    assert report.files_in == 3 and report.failures == 0
    assert listing(paths.files_in_dir) == sorted([used_lately.name, live.name])
    assert not unused.exists()
    assert untouched(outside)  # the link went, not what it points at


async def test_a_copy_touched_again_is_kept(db: Database, paths: DataPaths, retention: Retention) -> None:
    await add_run(db, "run-done")
    copy = await given_copy(db, paths, "run-done", "data.csv", OLD)
    await finish(db, "run-done", OLD)
    cache = ChatFileCache(paths.files_in_dir, None)
    assert (
        await cache.local_copy(await chat_file_of(db, "run-done", "data.csv"), 100)
    ).path == copy  # a later run uses it

    assert (await retention.prune()).files_in == 0
    assert copy.exists()


# --- files out ---------------------------------------------------------------------------------------------------


async def sent(db: Database, paths: DataPaths, run_id: str, name: str, *, status: str, when: float) -> Path:
    """A file the run sent, written by the host under files/out, its outbox row `status`, recorded at `when`."""
    stored = paths.run_files_out(run_id) / name
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_bytes(b"\x89PNG")
    age(stored, when)
    assert await send(db, run_id, CHAT, name, 4, SentFileKind.PHOTO, stored) is FileOutOutcome.ACCEPTED
    await execute(db, "UPDATE outbox SET status = ? WHERE file_path = ?", status, str(stored))
    await execute(db, "UPDATE run_files SET created_at = ? WHERE stored = ?", when, str(stored))
    return stored


async def stored_of(db: Database, run_id: str) -> dict[str, str | None]:
    return {f.name: f.stored for f in await RunFileStore(db).of_run(run_id) if f.direction is Direction.OUT}


async def test_sent_copies_go_once_old_and_their_records_stay(
    db: Database, paths: DataPaths, retention: Retention
) -> None:
    await add_run(db, "run-a")
    old_sent = await sent(db, paths, "run-a", "001-1", status="sent", when=OLD)
    old_failed = await sent(db, paths, "run-a", "002-2", status="failed", when=OLD)
    owed = await sent(db, paths, "run-a", "003-3", status="pending", when=OLD)  # still to be sent: kept
    fresh = await sent(db, paths, "run-a", "004-4", status="sent", when=FRESH)
    await finish(db, "run-a", OLD)

    report = await retention.prune()

    assert (report.files_out, report.out_folders, report.failures) == (2, 0, 0)
    assert not old_sent.exists() and not old_failed.exists() and owed.exists() and fresh.exists()
    assert await stored_of(db, "run-a") == {"001-1": None, "002-2": None, "003-3": str(owed), "004-4": str(fresh)}
    assert (await RunFileStore(db).totals()).files_out == 4  # stats still count them


async def test_a_finished_runs_emptied_folder_goes_and_a_live_runs_stays(
    db: Database, paths: DataPaths, retention: Retention
) -> None:
    await add_run(db, "run-done")
    await add_run(db, "run-live")
    await sent(db, paths, "run-done", "001-1", status="sent", when=OLD)
    await sent(db, paths, "run-live", "001-1", status="sent", when=OLD)
    await finish(db, "run-done", OLD)
    empty_leftover = paths.run_files_out("no-such-run")
    empty_leftover.mkdir()
    age(empty_leftover, OLD)

    report = await retention.prune()

    assert (report.files_out, report.out_folders) == (2, 2)
    assert listing(paths.files_out_dir) == ["run-live"]  # it may send another file any moment
    assert listing(paths.run_files_out("run-live")) == []


async def test_files_no_record_names_go_by_age_in_a_finished_runs_folder(
    db: Database, paths: DataPaths, retention: Retention
) -> None:
    await add_run(db, "run-done")
    folder = paths.run_files_out("run-done")
    folder.mkdir(parents=True)
    for name, when in (("001-1", OLD), ("002-2", FRESH)):  # written, then the host stopped before recording
        (folder / name).write_bytes(b"x")
        age(folder / name, when)
    await finish(db, "run-done", OLD)

    report = await retention.prune()

    assert (report.files_out, report.out_folders) == (1, 0)
    assert listing(folder) == ["002-2"]


async def test_nothing_outside_the_run_folders_is_removed_and_no_link_followed(
    db: Database, paths: DataPaths, retention: Retention, outside: Path
) -> None:
    await add_run(db, "run-a")
    link = paths.run_files_out("run-a") / "001-1"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    age(link, OLD)
    assert await send(db, "run-a", CHAT, "a.png", 4, SentFileKind.PHOTO, link) is FileOutOutcome.ACCEPTED
    for forged in (outside, paths.files_out_dir / "run-a" / ".." / ".." / "crewbot.keep"):
        assert await send(db, "run-a", CHAT, "b.png", 4, SentFileKind.PHOTO, forged) is FileOutOutcome.ACCEPTED
    await execute(db, "UPDATE outbox SET status = 'sent'")
    await execute(db, "UPDATE run_files SET created_at = ?", OLD)
    await finish(db, "run-a", OLD)

    report = await retention.prune()

    assert (report.files_out, report.out_folders) == (1, 1)
    assert untouched(outside)
    assert set((await stored_of(db, "run-a")).values()) == {None}  # forgotten: not retention's to remove


async def test_a_stored_path_under_a_relative_data_dir_is_found(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    await add_run(db, "run-live")  # live: its folder is not tidied, only the record's path finds the copy
    stored = await sent(db, DataPaths(Path("data")), "run-live", "001-1", status="sent", when=OLD)
    absolute = DataPaths(tmp_path / "data")  # the same DATA_DIR, given as an absolute path this time

    report = await Retention(db, absolute, DAYS, clock=lambda: NOW).prune()

    assert (report.files_out, report.out_folders) == (1, 0)
    assert not (tmp_path / stored).exists()
    assert await stored_of(db, "run-live") == {"001-1": None}


def test_a_copy_used_between_the_listing_and_its_removal_is_kept(paths: DataPaths) -> None:
    paths.files_in_dir.mkdir(parents=True)
    copy = paths.files_in_dir / "abc"
    copy.write_bytes(b"x")
    age(copy, OLD)
    [listed] = [e for e in list_entries(paths.files_in_dir) if e.changed_at < NOW]
    os.utime(copy)  # a run's local_copy touches it now

    assert remove_names(paths.files_in_dir, [listed.name], older_than=NOW) == Removed(0, 0)
    assert copy.exists()
