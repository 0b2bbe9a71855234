"""Retention: what is old goes; what is fresh, live or a chat's current session stays; nothing is followed."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from core.store.chats import ChatStore, folder_for_chat
from core.store.db import Database
from core.store.messages import NewMessage
from core.store.notes import NewNote, NoteStore
from core.store.outbox import OutboxStore, Outgoing
from core.store.runs import RunStatus, RunStore
from core.store.streamed_answers import StreamedAnswer, StreamedAnswerStore
from runner.ipc.requests import REASON_SUFFIX, errors_dir
from runner.storage.paths import DataPaths
from runner.storage.retention import PRUNED_TASK, PruneReport, Retention

CHAT = -700
OTHER_CHAT = -701
DAYS = 7.0
DAY_SECONDS = 86_400.0
NOW = time.time()  # the injected clock; ctime cannot be set, so the real present is where it starts
OLD = NOW - 2 * DAYS * DAY_SECONDS
FRESH = NOW - 0.5 * DAY_SECONDS


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "crewbot.sqlite3")
    await ChatStore(database).ensure(CHAT, "group", "retention")
    await ChatStore(database).ensure(OTHER_CHAT, "group", "other")
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
    """A host file a planted symlink points at."""
    path = tmp_path / "host" / ".env"
    path.parent.mkdir()
    path.write_text("LLM_API_KEY=secret\n")
    return path


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def untouched(host_file: Path) -> bool:
    return host_file.read_text() == "LLM_API_KEY=secret\n"


def age(path: Path, when: float) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


async def execute(db: Database, sql: str, *params: object) -> None:
    async with db.write() as conn:
        await conn.execute(sql, params)


async def add_run(db: Database, run_id: str, status: str, finished_at: float | None, chat_id: int = CHAT) -> None:
    await RunStore(db).create(
        run_id, chat_id=chat_id, turn_id=None, task=f"task of {run_id}", label="label", include_context=False,
        status=RunStatus.QUEUED,
    )  # fmt: skip
    await execute(
        db,
        "UPDATE subagent_runs SET status = ?, finished_at = ?, result = ?, error = ?, input_tokens = 42 WHERE id = ?",
        status,
        finished_at,
        f"result of {run_id}",
        "some error" if status == "failed" else None,
        run_id,
    )


def make_run_dir(paths: DataPaths, run_id: str, when: float) -> Path:
    run_dir = paths.run_dir(run_id)
    (run_dir / "nested").mkdir(parents=True)
    (run_dir / "task.json").write_text("{}")
    (run_dir / "nested" / "container.log").write_text("log")
    age(run_dir, when)
    return run_dir


# --- run dirs ------------------------------------------------------------------------------------------------


async def test_run_dirs_of_old_runs_and_old_leftovers_go(
    db: Database, paths: DataPaths, retention: Retention, outside: Path
) -> None:
    await add_run(db, "old-done", "completed", OLD)
    await add_run(db, "fresh-done", "completed", FRESH)
    await add_run(db, "old-running", "running", None)
    await add_run(db, "old-queued", "queued", None)
    for run_id in ("old-done", "fresh-done", "old-running", "old-queued"):
        make_run_dir(paths, run_id, OLD)
    (paths.run_dir("old-done") / "env").symlink_to(outside)
    (paths.run_dir("old-done") / "nested" / "hostdir").symlink_to(outside.parent, target_is_directory=True)
    make_run_dir(paths, "orphan-old", OLD)
    make_run_dir(paths, "orphan-fresh", FRESH)

    report = await retention.prune()

    assert report.run_dirs == 2
    assert listing(paths.runs_dir) == ["fresh-done", "old-queued", "old-running", "orphan-fresh"]
    assert listing(paths.run_dir("old-running") / "nested") == ["container.log"]
    assert untouched(outside)


async def test_a_leftover_with_a_forged_future_mtime_still_ages(db: Database, paths: DataPaths) -> None:
    run_dir = make_run_dir(paths, "orphan-future", time.time())
    age(run_dir, time.time() + 1000 * DAY_SECONDS)  # a container setting utime() far ahead
    later = Retention(db, paths, DAYS, clock=lambda: time.time() + 2 * DAYS * DAY_SECONDS)
    assert (await later.prune()).run_dirs == 1
    assert not run_dir.exists()


# --- quarantined IPC files -------------------------------------------------------------------------------------


def quarantined(paths: DataPaths, name: str, reason_at: float | None) -> Path:
    errors = errors_dir(paths.ipc_root)
    errors.mkdir(parents=True, exist_ok=True)
    if reason_at is not None:
        reason = errors / f"{name}{REASON_SUFFIX}"
        reason.write_text("not a regular file\n")
        age(reason, reason_at)
    return errors / name


async def test_old_quarantined_entries_go_with_their_reasons(paths: DataPaths, retention: Retention) -> None:
    old = quarantined(paths, "old-file", OLD)
    old.write_text("{}")
    age(old, FRESH)  # the reason file's time counts: the host wrote it when it quarantined the entry
    tree = quarantined(paths, "old-tree", OLD)
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    fifo = quarantined(paths, "old-fifo", OLD)
    os.mkfifo(fifo)
    fresh = quarantined(paths, "fresh-file", FRESH)
    fresh.write_text("{}")
    age(fresh, OLD)
    quarantined(paths, "orphan-reason", OLD)
    no_reason = quarantined(paths, "no-reason", None)
    no_reason.write_text("{}")
    age(no_reason, OLD)

    report = await asyncio.wait_for(retention.prune(), 30)

    assert report.ipc_error_files == 8
    assert listing(errors_dir(paths.ipc_root)) == ["fresh-file", f"fresh-file{REASON_SUFFIX}"]


async def test_a_planted_symlink_in_errors_is_removed_as_a_link(
    paths: DataPaths, retention: Retention, outside: Path
) -> None:
    link = quarantined(paths, "planted", OLD)
    link.symlink_to(outside)
    dir_link = quarantined(paths, "planted-dir", OLD)
    dir_link.symlink_to(outside.parent, target_is_directory=True)

    assert (await retention.prune()).ipc_error_files == 4

    assert listing(errors_dir(paths.ipc_root)) == []
    assert untouched(outside)


# --- sessions ---------------------------------------------------------------------------------------------------


def session(paths: DataPaths, chat_id: int, session_id: str, when: float) -> Path:
    path = paths.session_file(folder_for_chat(chat_id), session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[]")
    age(path, when)
    return path


async def test_old_sessions_go_except_current_and_in_use(db: Database, paths: DataPaths, retention: Retention) -> None:
    runs = RunStore(db)
    current = session(paths, CHAT, "run-current", OLD)
    await runs.set_session(CHAT, "run-current")
    in_use = session(paths, CHAT, "run-in-use", OLD)
    await add_run(db, "run-live", "running", None)
    await execute(db, "UPDATE subagent_runs SET session_in = 'run-in-use' WHERE id = 'run-live'")
    old = session(paths, CHAT, "run-old", OLD)
    fresh = session(paths, CHAT, "run-fresh", FRESH)
    # The current session of one chat protects nothing of another.
    other_old = session(paths, OTHER_CHAT, "run-current", OLD)

    report = await retention.prune()

    assert report.session_files == 2
    assert current.exists() and in_use.exists() and fresh.exists()
    assert not old.exists() and not other_old.exists()
    assert other_old.parent.is_dir()  # folders stay


# --- database ----------------------------------------------------------------------------------------------------


async def test_old_run_text_is_dropped_and_the_row_kept(db: Database, retention: Retention) -> None:
    await add_run(db, "old-failed", "failed", OLD)
    await add_run(db, "fresh-done", "completed", FRESH)
    await add_run(db, "old-running", "running", None)
    runs = RunStore(db)

    assert (await retention.prune()).run_texts == 1

    pruned = await runs.get("old-failed")
    assert pruned is not None
    assert (pruned.task, pruned.result, pruned.error) == (PRUNED_TASK, None, None)
    assert (pruned.status, pruned.label, pruned.input_tokens, pruned.finished_at) == ("failed", "label", 42, OLD)
    for run_id in ("fresh-done", "old-running"):
        kept = await runs.get(run_id)
        assert kept is not None and kept.task == f"task of {run_id}" and kept.result == f"result of {run_id}"
    assert (await retention.prune()).run_texts == 0  # a pruned run is not pruned again


async def test_many_old_runs_are_pruned_in_batches(db: Database, retention: Retention) -> None:
    for n in range(1234):
        await add_run(db, f"bulk-{n:05d}", "completed", OLD)
    assert (await retention.prune()).run_texts == 1234
    async with db.conn.execute("SELECT COUNT(*) FROM subagent_runs WHERE task = ?", (PRUNED_TASK,)) as cursor:
        row = await cursor.fetchone()
    assert row is not None and row[0] == 1234


async def test_old_ipc_message_ids_go(db: Database, retention: Retention) -> None:
    for message_id, when in (("old-1", OLD), ("old-2", OLD), ("fresh", FRESH)):
        await execute(
            db, "INSERT INTO ipc_messages (id, chat_id, received_at) VALUES (?, ?, ?)", message_id, CHAT, when
        )

    assert (await retention.prune()).ipc_messages == 2

    async with db.conn.execute("SELECT id FROM ipc_messages") as cursor:
        assert [row[0] for row in await cursor.fetchall()] == ["fresh"]


async def test_outbox_rows_sent_or_failed_long_ago_go(db: Database, retention: Retention) -> None:
    outbox = OutboxStore(db)
    rows: dict[str, int] = {}
    for name in ("sent-old", "sent-fresh", "failed-old", "failed-fresh", "pending-old"):
        message = NewMessage(chat_id=CHAT, sender_name="Crew", content=name, is_bot=True)
        rows[name] = await outbox.add(Outgoing(message=message, text=name))
    for name, status, sent_at, attempt_at in (
        ("sent-old", "sent", OLD, OLD),
        ("sent-fresh", "sent", FRESH, OLD),
        ("failed-old", "failed", None, OLD),
        ("failed-fresh", "failed", None, FRESH),
        ("pending-old", "pending", None, OLD),
    ):
        await execute(
            db,
            "UPDATE outbox SET status = ?, sent_at = ?, next_attempt_at = ?, created_at = ? WHERE id = ?",
            status,
            sent_at,
            attempt_at,
            OLD,
            rows[name],
        )

    assert (await retention.prune()).outbox_rows == 2

    async with db.conn.execute("SELECT text FROM outbox ORDER BY id") as cursor:
        assert [row[0] for row in await cursor.fetchall()] == ["sent-fresh", "failed-fresh", "pending-old"]
    async with db.conn.execute("SELECT COUNT(*) FROM messages") as cursor:
        row = await cursor.fetchone()
    assert row is not None and row[0] == 5  # the chat's history is not retention's business


async def test_streamed_answers_settled_long_ago_go(db: Database, retention: Retention) -> None:
    answers = StreamedAnswerStore(db)
    for settled_at in (OLD, OLD, FRESH):
        await answers.add(StreamedAnswer(CHAT, settled_at, first_text_seconds=0.5, writing_seconds=4.0, edits=3))

    assert (await retention.prune()).streamed_answers == 2

    assert [a.settled_at for a in await answers.since(0.0)] == [FRESH]  # what crewbot stats reads now


async def test_notes_go_only_once_turned_off_longer_than_the_limit(db: Database, retention: Retention) -> None:
    notes = NoteStore(db)
    for chat in (CHAT, OTHER_CHAT):
        await notes.add(NewNote(chat, "kept", 1, "Ann", created_at=OLD), limit=50)
    await notes.add(NewNote(CHAT, "kept too", 1, "Ann", about_user_id=1, created_at=OLD), limit=50)
    await notes.set_off(CHAT, True, "Ada")
    await execute(db, "UPDATE memory_off SET off_at = ? WHERE chat_id = ?", OLD, CHAT)
    await notes.set_off(OTHER_CHAT, True, "Ada")  # off since just now: kept, hidden, for /memory on

    assert (await retention.prune()).notes == 2

    assert (await notes.counts(CHAT)).chat_notes == 0 and (await notes.counts(CHAT)).member_notes == 0
    assert (await notes.counts(OTHER_CHAT)).chat_notes == 1  # old notes, but off only since now: kept


# --- the pass as a whole -----------------------------------------------------------------------------------------


async def test_an_empty_data_dir_prunes_nothing_and_logs_one_line(retention: Retention) -> None:
    with structlog.testing.capture_logs() as logs:
        report = await retention.prune()
    assert report == PruneReport()
    lines = [entry for entry in logs if entry["event"] == "retention_pruned"]
    assert len(lines) == 1
    assert lines[0]["run_dirs"] == 0 and lines[0]["outbox_rows"] == 0 and lines[0]["failures"] == 0


def test_retention_must_be_positive(db: Database, paths: DataPaths) -> None:
    with pytest.raises(ValueError, match="retention_days"):
        Retention(db, paths, 0)


async def test_run_forever_prunes_at_start_and_on_each_interval_and_survives_errors(
    db: Database, paths: DataPaths
) -> None:
    calls: list[float] = []
    two_passes = asyncio.Event()

    def clock() -> float:
        calls.append(NOW)
        if len(calls) == 1:
            raise RuntimeError("clock failure")  # the first pass fails; the loop goes on
        if len(calls) >= 3:
            two_passes.set()
        return NOW

    retention = Retention(db, paths, DAYS, clock=clock)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(retention.run_forever(0.01))
        await asyncio.wait_for(two_passes.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    events = [entry["event"] for entry in logs]
    assert events[0] == "retention_failed"
    assert events.count("retention_pruned") >= 1
