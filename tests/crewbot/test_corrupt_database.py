"""A database damaged on disk: `crewbot doctor` reads it through (integrity_check) and fails, and `crewbot run`
(integrity_check up to 256 MiB, quick_check above) refuses to start in one line that says how to restore
the backup, instead of starting and then failing every message with "database disk image is malformed".
The app's real schema in a real SQLite file, corrupted by overwriting the bytes of a table's page, or by
pointing its indexes at the wrong b-trees."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from crewbot.startup import MAX_INTEGRITY_ERRORS
from tests.crewbot.test_doctor_fixes import IMAGE, assert_fixes, by_name, prints_python
from tests.crewbot.test_startup import start_failure
from tests.fakes.memory_runtime import MemoryRuntime
from tests.harness import make_settings

CHAT_ID = -1001
MESSAGES = 300  # enough rows that the messages table spans pages, its root an interior one
DAMAGE_BYTES = 64  # a page header and its first cell pointers
RESTORE_HINT = "copy your backup in its place (docs/operating.md: Backup and restore)"


async def filled_database(path: Path) -> None:
    """The app's schema (every migration) and a chat's worth of messages, all in the main file."""
    db = await Database.open(path)
    try:
        await ChatStore(db).ensure(CHAT_ID, "group", "corrupt")
        messages = MessageStore(db)
        for n in range(MESSAGES):
            await messages.add(NewMessage(chat_id=CHAT_ID, sender_name="Ann", content=f"message {n} " + "x" * 200))
        await db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        await db.close()


def damage_table_page(path: Path, table: str = "messages") -> None:
    """Overwrite the start of the table's root page, as a torn write or a bad disk would."""
    conn = sqlite3.connect(path)
    try:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    with path.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xff" * DAMAGE_BYTES)


async def corrupt_database(path: Path) -> None:
    await filled_database(path)
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # every page is in the file being damaged
    damage_table_page(path)
    conn = sqlite3.connect(path)
    try:
        # What the old checks looked at still answers: the damage is only found by reading the pages.
        assert conn.execute("PRAGMA schema_version").fetchone() is not None
        (verdict,) = conn.execute(f"PRAGMA quick_check({MAX_INTEGRITY_ERRORS})").fetchone()
        assert verdict != "ok" and "Page" in verdict, verdict
    finally:
        conn.close()
    db = await Database.open(path)  # the store opens it: this is how the bot used to start on it
    await db.close()


async def doctor_lines(tmp_path: Path) -> tuple[int, list[str]]:
    from crewbot.doctor import run_doctor

    lines: list[str] = []
    async with MemoryRuntime(images={IMAGE}, on_start=prints_python) as runtime:
        code = await run_doctor(make_settings(tmp_path / "data"), out=lines.append, runtime=runtime)
    assert_fixes(lines)
    return code, lines


async def test_doctor_reports_a_damaged_page_and_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    await corrupt_database(tmp_path / "data" / "crewbot.sqlite3")

    code, lines = await doctor_lines(tmp_path)

    assert code == 1
    line = by_name(lines)["database"]
    assert line.startswith("FAIL database ") and "is corrupt (integrity_check: " in line, line
    assert RESTORE_HINT in line
    # Only the database failed: the exit code is its doing.
    assert [n for n, text in by_name(lines).items() if text.startswith("FAIL")] == ["database"]


async def test_doctor_reports_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "crewbot.sqlite3").write_bytes(b"this is not an SQLite file" * 200)

    code, lines = await doctor_lines(tmp_path)

    assert code == 1
    line = by_name(lines)["database"]
    assert line.startswith("FAIL database ") and "is not a readable database" in line and RESTORE_HINT in line


async def test_doctor_passes_a_sound_database(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    await filled_database(tmp_path / "data" / "crewbot.sqlite3")

    code, lines = await doctor_lines(tmp_path)

    assert code == 0, lines
    assert by_name(lines)["database"].startswith("ok   database ") and "integrity_check ok" in lines[1]


async def test_run_refuses_a_damaged_database_in_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    await corrupt_database(data_dir / "crewbot.sqlite3")

    line = start_failure(tmp_path, data_dir)  # one line, non-zero exit, no traceback, no secret

    assert "crewbot.sqlite3 is corrupt (integrity_check: " in line and RESTORE_HINT in line
    assert "Traceback" not in line


def swap_index_roots(path: Path) -> None:
    """Found by review: the message indexes now point at empty b-trees of the same shape (as a lost range of
    index pages would leave them). Every page is sound and referenced once: quick_check passes; only the
    cross-check of each index against its table sees that the bot would find none of the chat's history and
    could store a redelivered update twice."""
    conn = sqlite3.connect(path)
    try:
        for spare in ("spare1", "spare2"):
            conn.execute(f"CREATE TABLE {spare} (a INTEGER, b INTEGER)")
            conn.execute(f"CREATE INDEX {spare}_index ON {spare} (a, b)")
        conn.commit()
        roots = dict(conn.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'index'").fetchall())
        conn.execute("PRAGMA writable_schema = ON")
        for index, spare in (("messages_by_chat", "spare1_index"), ("sqlite_autoindex_messages_1", "spare2_index")):
            conn.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = ?", (roots[spare], index))
            conn.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = ?", (roots[index], spare))
        conn.execute("PRAGMA writable_schema = OFF")
        conn.commit()
        (quick,) = conn.execute("PRAGMA quick_check").fetchone()
        assert quick == "ok"  # what start-up used to read
    finally:
        conn.close()


async def test_run_refuses_a_database_whose_indexes_no_longer_match_its_tables(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    await filled_database(data_dir / "crewbot.sqlite3")
    swap_index_roots(data_dir / "crewbot.sqlite3")

    line = start_failure(tmp_path, data_dir)

    assert "crewbot.sqlite3 is corrupt (integrity_check: " in line and RESTORE_HINT in line


def test_run_refuses_a_file_that_is_not_a_database_with_the_restore_hint(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "crewbot.sqlite3").write_bytes(b"this is not an SQLite file" * 200)

    line = start_failure(tmp_path, data_dir)

    assert "crewbot.sqlite3 is not a readable database" in line and RESTORE_HINT in line
