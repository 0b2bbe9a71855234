"""Migration 0017 (senses) over a database with files, runs given them and spend: chat_files and llm_spend are
made anew with their rows and ids (run_files still refers to them, foreign keys hold), stickers and video notes
can be stored, and speech is a kind of spend."""

from __future__ import annotations

import shutil
from importlib.resources import as_file
from pathlib import Path

from core.store.chat_files import FileKind, NewFile
from core.store.db import MIGRATIONS_DIR, Database
from core.store.messages import MessageStore, NewMessage
from core.store.spend import SpendKind, SpendStore

CHAT = -1701


async def test_files_runs_and_spend_survive_the_senses_migration(tmp_path: Path) -> None:
    before = tmp_path / "before"
    with as_file(MIGRATIONS_DIR) as shipped:
        shutil.copytree(shipped, before)
    for late in sorted(before.glob("*.sql")):
        if int(late.name[:4]) >= 17:
            late.unlink()
    path = tmp_path / "crewbot.sqlite3"
    db = await Database.open(path, before)
    try:
        await db.conn.execute(
            "INSERT INTO chats (id, kind, title, folder, created_at) VALUES (?, 'group', 't', 'f', 0)", (CHAT,)
        )
        # As the code of schema 16 wrote them (the store's code is the new schema's).
        await db.conn.execute(
            "INSERT INTO messages (id, chat_id, sender_name, content, timestamp, kind) "
            "VALUES (1, ?, 'Alice', 'data', 0, 'file')",
            (CHAT,),
        )
        await db.conn.execute(
            "INSERT INTO chat_files (id, chat_id, message_id, kind, file_id, file_unique_id, name, created_at) "
            "VALUES (1, ?, 1, 'document', 'id1', 'u1', 'a.csv', 0)",
            (CHAT,),
        )
        await db.conn.execute(
            "INSERT INTO subagent_runs (id, chat_id, task, label, status, created_at) "
            "VALUES ('run-1', ?, 't', 'l', 'completed', 0)",
            (CHAT,),
        )
        await db.conn.execute(
            "INSERT INTO run_files (run_id, chat_id, direction, name, size_bytes, kind, chat_file_id, created_at) "
            "VALUES ('run-1', ?, 'in', 'a.csv', 3, 'document', 1, 0)",
            (CHAT,),
        )
        await db.conn.execute(
            "INSERT INTO llm_spend (day, chat_id, kind, input_tokens, output_tokens, calls) "
            "VALUES ('2026-01-01', ?, 'main', 10, 5, 1)",
            (CHAT,),
        )
        assert await db.schema_version() == 16
    finally:
        await db.close()

    db = await Database.open(path)
    try:
        assert await db.schema_version() >= 17
        stored = await MessageStore(db).get(1)
        assert stored is not None and stored.file is not None and stored.file.id == 1
        assert stored.file.duration_seconds is None
        async with db.conn.execute("PRAGMA foreign_key_check") as cursor:
            assert await cursor.fetchall() == []
        async with db.conn.execute("SELECT chat_file_id FROM run_files") as cursor:
            assert [r[0] for r in await cursor.fetchall()] == [1]
        note = NewFile(FileKind.VIDEO_NOTE, "id2", "u2", "video_note_2.mp4", "video/mp4", 100, duration_seconds=7)
        sticker = NewFile(FileKind.STICKER, "id3", "u3", "sticker_3.webp", "image/webp", 50)
        for new in (note, sticker):
            added = await MessageStore(db).add(NewMessage(CHAT, "Bob", "", kind="file", file=new))
            again = await MessageStore(db).get(added or 0)
            assert again is not None and again.file is not None and again.file.kind is new.kind
        spend = SpendStore(db)
        await spend.add("2026-01-01", CHAT, SpendKind.SPEECH, 100, 0, estimated=False, audio_seconds=7.5)
        rows = {r.kind: r.spend for r in await spend.rows("2026-01-01", CHAT)}
    finally:
        await db.close()
    assert (rows[SpendKind.MAIN].input_tokens, rows[SpendKind.MAIN].audio_seconds) == (10, 0.0)
    assert (rows[SpendKind.SPEECH].calls, rows[SpendKind.SPEECH].audio_seconds) == (1, 7.5)
