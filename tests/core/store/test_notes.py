"""NoteStore on a real SQLite file: limits held in one transaction, notes never cross chats, an erased note's
bytes are gone from the database file and its WAL, and retention deletes the notes of chats turned off."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
import structlog

from core.store import ChatStore, Database
from core.store.notes import NewNote, NotesFull, NoteStore

CHAT, OTHER = -100123, -100456
ALICE, BOB = 11, 12


@pytest.fixture
async def notes(db: Database, chats: ChatStore) -> NoteStore:
    await chats.ensure(CHAT, "supergroup", "Team")
    await chats.ensure(OTHER, "supergroup", "Elsewhere")
    return NoteStore(db)


def raw_bytes(db: Database) -> bytes:
    """Everything SQLite keeps on disk for the database: the file and its WAL."""
    wal = Path(f"{db.path}-wal")
    return db.path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def test_chat_notes_are_newest_first_and_stay_in_their_chat(notes: NoteStore) -> None:
    await notes.add(NewNote(CHAT, "venue is the Old Mill", ALICE, "Alice", 5), limit=50)
    await notes.add(NewNote(CHAT, "budget is 400 EUR", BOB, "Bob", 9), limit=50)
    await notes.add(NewNote(OTHER, "other chat's secret", ALICE, "Alice"), limit=50)

    listed = await notes.chat_notes(CHAT, 50)

    assert [n.text for n in listed] == ["budget is 400 EUR", "venue is the Old Mill"]
    assert listed[1].message_id == 5 and listed[1].caused_by_name == "Alice"
    assert [n.text for n in await notes.chat_notes(OTHER, 50)] == ["other chat's secret"]
    other_id = (await notes.chat_notes(OTHER, 50))[0].id
    assert await notes.get(CHAT, other_id) is None  # an id of another chat names nothing here
    assert not await notes.delete(CHAT, other_id)
    assert await notes.get(OTHER, other_id) is not None


async def test_the_limit_holds_against_racing_turns(notes: NoteStore) -> None:
    async def one(n: int) -> bool:
        try:
            await notes.add(NewNote(CHAT, f"fact {n}", ALICE, "Alice"), limit=50)
        except NotesFull:
            return False
        return True

    kept = await asyncio.gather(*(one(n) for n in range(200)))

    assert sum(kept) == 50
    assert len(await notes.chat_notes(CHAT, 500)) == 50


async def test_member_notes_have_their_own_limit_per_member_and_chat(notes: NoteStore) -> None:
    for n in range(3):
        await notes.add(NewNote(CHAT, f"alice {n}", ALICE, "Alice", about_user_id=ALICE), limit=3)
    with pytest.raises(NotesFull):
        await notes.add(NewNote(CHAT, "alice 3", ALICE, "Alice", about_user_id=ALICE), limit=3)
    await notes.add(NewNote(CHAT, "bob 0", BOB, "Bob", about_user_id=BOB), limit=3)
    await notes.add(NewNote(OTHER, "alice elsewhere", ALICE, "Alice", about_user_id=ALICE), limit=3)

    mine = await notes.member_notes(CHAT, [ALICE], limit_each=2)

    assert [n.text for n in mine] == ["alice 2", "alice 1"]
    assert await notes.chat_notes(CHAT, 50) == []  # member notes are not the chat's
    both = await notes.member_notes(CHAT, [ALICE, BOB], 5)
    assert [n.text for n in both] == ["bob 0", "alice 2", "alice 1", "alice 0"]


async def test_forget_member_erases_their_notes_bytes_from_disk(db: Database, notes: NoteStore) -> None:
    await notes.add(NewNote(CHAT, "Alice-secret-zebra-4471 lives in Lyon", ALICE, "Alice", about_user_id=ALICE), 20)
    await notes.add(NewNote(CHAT, "Alice-asked-quokka-9902 picnic on Sunday", ALICE, "Alice"), 50)
    await notes.add(NewNote(CHAT, "Bob keeps the keys", BOB, "Bob"), 50)
    await notes.add(NewNote(OTHER, "Alice-other-chat-walrus", ALICE, "Alice", about_user_id=ALICE), 20)
    await db.flush_erased()  # everything in the database file first: the erase must clear it there too
    assert b"Alice-secret-zebra-4471" in raw_bytes(db)

    erased = await notes.forget_member([CHAT], ALICE)

    assert erased == 2
    on_disk = raw_bytes(db)
    assert b"zebra-4471" not in on_disk and b"quokka-9902" not in on_disk
    assert b"Alice-other-chat-walrus" in on_disk  # another chat's notes are that chat's
    assert [n.text for n in await notes.chat_notes(CHAT, 50)] == ["Bob keeps the keys"]


async def test_forget_member_with_no_notes_changes_nothing(notes: NoteStore) -> None:
    await notes.add(NewNote(CHAT, "Bob keeps the keys", BOB, "Bob"), 50)

    assert await notes.forget_member([CHAT], ALICE) == 0
    assert len(await notes.chat_notes(CHAT, 50)) == 1


async def test_off_chats_notes_are_pruned_after_the_retention(db: Database, notes: NoteStore) -> None:
    await notes.add(NewNote(CHAT, "kept while off", ALICE, "Alice"), 50)
    await notes.add(NewNote(OTHER, "on: never pruned", ALICE, "Alice"), 50)
    assert await notes.set_off(CHAT, True, "Ada")
    assert not await notes.set_off(CHAT, True, "Ada")
    assert await notes.is_off(CHAT) and not await notes.is_off(OTHER)

    assert await notes.prune_off(time.time() - 60) == 0  # turned off just now: kept, hidden
    assert await notes.prune_off(time.time() + 1) == 1

    assert await notes.chat_notes(CHAT, 50) == []
    assert len(await notes.chat_notes(OTHER, 50)) == 1
    counts = await notes.counts()
    assert (counts.chat_notes, counts.member_notes, counts.chats_off) == (1, 0, 1)


async def test_an_erase_a_reader_keeps_in_the_wal_is_logged_and_the_next_erase_clears_it(
    db: Database, notes: NoteStore
) -> None:
    await notes.add(NewNote(CHAT, "Alice-wal-pelican-5120", ALICE, "Alice", about_user_id=ALICE), 20)
    reader = sqlite3.connect(db.path)  # another process's reader (`crewbot stats`), mid-snapshot
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM notes").fetchone()
        with structlog.testing.capture_logs() as logs:
            assert await notes.forget_member([CHAT], ALICE) == 1
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["erased_notes_left_in_wal"]
    finally:
        reader.close()
    with structlog.testing.capture_logs() as logs:
        await notes.add(NewNote(CHAT, "Bob keeps the keys", BOB, "Bob"), 50)
        assert await notes.delete(CHAT, (await notes.chat_notes(CHAT, 1))[0].id)
    assert logs == [] and b"pelican-5120" not in raw_bytes(db)  # the next erase's checkpoint finished it
