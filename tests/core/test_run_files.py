"""The store of a run's files (core/store/run_files.py) and of chat files (core/store/chat_files.py), on real
SQLite: a file out is counted against its run's limit, made a duplicate by its upload id, refused once the run
has an outcome, and owed to the chat in the same transaction as its record, or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from core.store import run_files
from core.store.chat_files import ChatFileStore, FileKind, NewFile, file_ref, parse_ref
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.outbox import OutboxStore, Outgoing, OutgoingFile, SentFileKind
from core.store.run_files import Direction, FileOutOutcome, GivenFile, RunFileStore
from core.store.runs import RunStatus, RunStore

CHAT = -1001
OTHER = -1002
RUN = "run-000001"


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "crewbot.sqlite3")
    try:
        await ChatStore(database).ensure(CHAT, "group", "main")
        await ChatStore(database).ensure(OTHER, "group", "other")
        await RunStore(database).create(
            RUN, chat_id=CHAT, turn_id=None, task="t", label="l", include_context=False, status=RunStatus.RUNNING
        )
        yield database
    finally:
        await database.close()


def outgoing(name: str = "a.csv", stored: str = "/data/files/out/run-000001/001-x") -> Outgoing:
    return Outgoing(
        message=NewMessage(chat_id=CHAT, sender_name="Subagent", content=f"[file sent: {name}]", is_bot=True),
        text="caption",
        run_id=RUN,
        file=OutgoingFile(path=Path(stored), name=name, kind=SentFileKind.DOCUMENT),
    )


async def add_out(db: Database, upload_id: str, max_files: int = 3, run_id: str = RUN) -> FileOutOutcome:
    stored = f"/data/files/out/{run_id}/{upload_id}"
    return await RunFileStore(db).add_out(
        run_id, upload_id, outgoing(stored=stored), stored=stored, size_bytes=10, max_files=max_files
    )


async def counts(db: Database) -> tuple[int, int]:
    """(files out recorded, outbox rows owed)."""
    recorded = [f for f in await RunFileStore(db).of_run(RUN) if f.direction is Direction.OUT]
    return len(recorded), len(await OutboxStore(db).pending(CHAT))


async def test_a_file_out_is_recorded_and_owed_together(db: Database) -> None:
    assert await add_out(db, "upload-01") is FileOutOutcome.ACCEPTED
    [recorded] = await RunFileStore(db).of_run(RUN)
    [row] = await OutboxStore(db).pending(CHAT)
    assert (recorded.name, recorded.kind, recorded.size_bytes) == ("a.csv", "document", 10)
    assert row.file is not None and str(row.file.path) == recorded.stored and row.text == "caption"


async def test_the_same_upload_id_is_a_duplicate(db: Database) -> None:
    # Guard: the upload id's check (and the unique index behind it).
    assert await add_out(db, "upload-01") is FileOutOutcome.ACCEPTED
    assert await add_out(db, "upload-01") is FileOutOutcome.DUPLICATE
    assert await counts(db) == (1, 1)


async def test_files_beyond_the_limit_are_refused(db: Database) -> None:
    # Guard: the count of the run's files out, in the transaction.
    outcomes = [await add_out(db, f"upload-{n:02d}", max_files=2) for n in range(3)]
    assert outcomes == [FileOutOutcome.ACCEPTED, FileOutOutcome.ACCEPTED, FileOutOutcome.OVER_LIMIT]
    assert await add_out(db, "upload-00", max_files=2) is FileOutOutcome.DUPLICATE  # a retry: not over
    assert await counts(db) == (2, 2)


async def test_many_files_at_once_never_pass_the_limit(db: Database) -> None:
    # Guard: the check and the insert are one transaction: no two can both see room for one more.
    outcomes = await asyncio.gather(*(add_out(db, f"upload-{n:02d}") for n in range(12)))
    assert outcomes.count(FileOutOutcome.ACCEPTED) == 3
    assert outcomes.count(FileOutOutcome.OVER_LIMIT) == 9
    assert await counts(db) == (3, 3)


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED])
async def test_a_run_with_an_outcome_sends_no_more_files(db: Database, status: RunStatus) -> None:
    # Guard: the run's status, read in the transaction.
    assert await RunStore(db).finish(RUN, status)
    assert await add_out(db, "upload-late") is FileOutOutcome.NOT_LIVE
    assert await counts(db) == (0, 0)


async def test_an_unknown_run_sends_nothing(db: Database) -> None:
    assert await add_out(db, "upload-01", run_id="run-unknown") is FileOutOutcome.NOT_LIVE
    assert await OutboxStore(db).pending(CHAT) == []


async def test_a_failure_to_owe_the_file_leaves_no_record(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # Guard: one transaction: the record is rolled back with the outbox row it could not stage.
    async def broken(conn: aiosqlite.Connection, owed: Outgoing) -> int:
        raise aiosqlite.OperationalError("disk I/O error")

    monkeypatch.setattr(run_files, "stage", broken)
    with pytest.raises(aiosqlite.OperationalError):
        await add_out(db, "upload-01")
    assert await counts(db) == (0, 0)


async def test_files_given_are_recorded_once_when_a_run_is_opened_again(db: Database) -> None:
    file_id = await post(db, CHAT, "data.csv")
    given = [GivenFile(chat_file_id=file_id, name="data.csv", size_bytes=5, kind="document")]
    store = RunFileStore(db)
    await store.set_given(RUN, CHAT, given)
    await store.set_given(RUN, CHAT, given)  # re-attached after a restart
    assert [(f.direction, f.name, f.chat_file_id) for f in await store.of_run(RUN)] == [
        (Direction.IN, "data.csv", file_id)
    ]


async def test_totals_and_what_retention_may_remove(db: Database) -> None:
    store = RunFileStore(db)
    file_id = await post(db, CHAT, "in.csv")
    await store.set_given(RUN, CHAT, [GivenFile(chat_file_id=file_id, name="in.csv", size_bytes=7, kind="document")])
    assert await add_out(db, "upload-01") is FileOutOutcome.ACCEPTED
    totals = await store.totals()
    assert (totals.files_in, totals.bytes_in, totals.files_out, totals.bytes_out) == (1, 7, 1, 10)
    assert (await store.totals(chat_id=OTHER)).files_out == 0
    assert await store.stored_out(before=float("inf")) == []  # still owed: its copy stays
    [row] = await OutboxStore(db).pending(CHAT)
    await OutboxStore(db).part_sent(row.id, 1, done=True)
    [(record_id, stored)] = await store.stored_out(before=float("inf"))
    await store.forget_stored([record_id])
    assert [f.stored for f in await store.of_run(RUN) if f.direction is Direction.OUT] == [None]
    assert stored.endswith("upload-01")


# --- chat files -----------------------------------------------------------------------------------------


async def post(db: Database, chat_id: int, name: str, **file: Any) -> int:
    new = NewFile(FileKind.DOCUMENT, f"id-{name}-{chat_id}", f"u-{name}", name, **file)
    message_id = await MessageStore(db).add(
        NewMessage(chat_id=chat_id, sender_name="Alice", content=name, kind="document", file=new)
    )
    assert message_id is not None
    found = await ChatFileStore(db).of_message(message_id)
    assert found is not None
    return found.id


async def test_refs_name_files_of_any_chat_and_unknown_or_malformed_ones_are_left_out(db: Database) -> None:
    here, there = await post(db, CHAT, "a.csv"), await post(db, OTHER, "b.csv")
    refs = [file_ref(here), file_ref(there), "f999999", "f0", "f01", "x1", "f", "", "f1; DROP TABLE chat_files"]
    found = await ChatFileStore(db).by_refs(refs)
    assert {ref: f.chat_id for ref, f in found.items()} == {file_ref(here): CHAT, file_ref(there): OTHER}


@pytest.mark.parametrize(
    ("ref", "parsed"), [("f3", 3), (" f3 ", 3), ("f0", None), ("f03", None), ("F3", None), ("f" + "9" * 19, None)]
)
def test_parse_ref(ref: str, parsed: int | None) -> None:
    assert parse_ref(ref) == parsed


async def test_a_posted_name_is_stored_bounded(db: Database) -> None:
    file_id = await post(db, CHAT, "n" * 5_000)
    [found] = (await ChatFileStore(db).by_refs([file_ref(file_id)])).values()
    assert len(found.name) == 1_000
