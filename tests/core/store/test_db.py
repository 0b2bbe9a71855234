"""Database: migrations at start-up, each in one transaction; a database newer than the code, or no migrations
at all, refused; WAL and foreign keys on."""

from __future__ import annotations

import re
import shutil
import sqlite3
from importlib.resources import as_file
from pathlib import Path

import pytest

from core.store.db import MIGRATIONS_DIR, Database, MigrationError, discover_migrations

SHIPPED = max(int(entry.name[:4]) for entry in MIGRATIONS_DIR.iterdir() if entry.name.endswith(".sql"))


def table_names(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def user_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    """A private copy of the shipped migrations that a test may add files to."""
    directory = tmp_path / "migrations"
    with as_file(MIGRATIONS_DIR) as shipped:
        shutil.copytree(shipped, directory)
    return directory


async def test_fresh_database_gets_every_migration(tmp_path: Path) -> None:
    path = tmp_path / "db" / "crewbot.sqlite3"  # the parent directory is created too

    db = await Database.open(path)
    try:
        assert SHIPPED >= 2
        assert await db.schema_version() == SHIPPED
    finally:
        await db.close()

    assert {"chats", "messages", "turns", "subagent_runs", "chat_sessions", "ipc_messages"} <= table_names(path)
    assert user_version(path) == SHIPPED


async def test_reopening_applies_nothing_and_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "crewbot.sqlite3"
    db = await Database.open(path)
    async with db.write() as conn:
        await conn.execute("INSERT INTO chats (id, kind, title, folder, created_at) VALUES (1, 'group', 't', 'f', 0)")
    await db.close()

    db = await Database.open(path)
    try:
        assert await db.migrate() == []
        assert await db.schema_version() == SHIPPED
        async with db.conn.execute("SELECT COUNT(*) FROM chats") as cursor:
            row = await cursor.fetchone()
        assert row is not None and row[0] == 1
    finally:
        await db.close()


async def test_new_migration_is_applied_on_next_open(tmp_path: Path, migrations: Path) -> None:
    path = tmp_path / "crewbot.sqlite3"
    await (await Database.open(path, migrations)).close()
    (migrations / f"{SHIPPED + 1:04d}_scratch.sql").write_text("CREATE TABLE scratch (id INTEGER PRIMARY KEY);\n")

    db = await Database.open(path, migrations)
    await db.close()

    assert user_version(path) == SHIPPED + 1
    assert "scratch" in table_names(path)


async def test_failing_migration_leaves_version_and_schema_unchanged(tmp_path: Path, migrations: Path) -> None:
    path = tmp_path / "crewbot.sqlite3"
    await (await Database.open(path, migrations)).close()
    before = table_names(path)
    broken = migrations / f"{SHIPPED + 1:04d}_broken.sql"
    broken.write_text(
        "CREATE TABLE partial (x INTEGER);\nINSERT INTO partial VALUES (1);\nCREATE TABLE oops (;\n", encoding="utf-8"
    )

    with pytest.raises(MigrationError, match=re.escape(f"{broken.name} (schema version {SHIPPED} to {SHIPPED + 1})")):
        await Database.open(path, migrations)

    assert user_version(path) == SHIPPED
    assert table_names(path) == before
    assert "partial" not in table_names(path)


async def test_failing_first_migration_on_fresh_database_leaves_it_empty(tmp_path: Path) -> None:
    directory = tmp_path / "migrations"
    directory.mkdir()
    (directory / "0001_ok.sql").write_text("CREATE TABLE a (x INTEGER);\n")
    (directory / "0002_bad.sql").write_text("CREATE TABLE b (x INTEGER);\nSELECT * FROM no_such_table;\n")
    path = tmp_path / "crewbot.sqlite3"

    with pytest.raises(MigrationError, match=re.escape("0002_bad.sql")):
        await Database.open(path, directory)

    assert user_version(path) == 1
    assert table_names(path) == {"a"}


@pytest.mark.parametrize("name", ["3_short.sql", "0003-dash.sql", "0003_Upper.sql", "migration.sql"])
async def test_misnamed_migration_is_rejected(tmp_path: Path, migrations: Path, name: str) -> None:
    (migrations / name).write_text("CREATE TABLE never (x INTEGER);\n")

    with pytest.raises(MigrationError, match=re.escape("not named NNNN_name.sql")):
        await Database.open(tmp_path / "crewbot.sqlite3", migrations)


async def test_a_database_newer_than_the_code_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "crewbot.sqlite3"
    await (await Database.open(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SHIPPED + 1}")  # as a later crewbot's migration leaves it

    with pytest.raises(MigrationError, match=f"schema version {SHIPPED + 1}, newer than this crewbot's latest") as exc:
        await Database.open(path)

    assert exc.value.fix is not None and "restore a backup" in exc.value.fix
    assert user_version(path) == SHIPPED + 1


async def test_no_migrations_at_all_is_an_error_not_an_empty_schema(tmp_path: Path) -> None:
    """A package that lost its migrations (the wheel once did) must not start on schema version 0."""
    (tmp_path / "migrations").mkdir()

    for directory in (tmp_path / "migrations", tmp_path / "missing"):
        with pytest.raises(MigrationError, match="no migrations found") as exc:
            await Database.open(tmp_path / "crewbot.sqlite3", directory)
        assert exc.value.fix is not None and "reinstall crewbot" in exc.value.fix
    assert user_version(tmp_path / "crewbot.sqlite3") == 0


def test_the_shipped_migrations_are_package_data_in_order() -> None:
    numbers = [number for number, _ in discover_migrations()]

    assert numbers == list(range(1, SHIPPED + 1))
    assert Path(str(MIGRATIONS_DIR)).parts[-3:] == ("core", "store", "migrations")


def test_gap_in_numbering_is_rejected(migrations: Path) -> None:
    (migrations / f"{SHIPPED + 2:04d}_skipped.sql").write_text("SELECT 1;\n")

    with pytest.raises(MigrationError, match="without gaps"):
        discover_migrations(migrations)


async def test_wal_and_foreign_keys_are_on(db: Database) -> None:
    async with db.conn.execute("PRAGMA journal_mode") as cursor:
        journal = await cursor.fetchone()
    async with db.conn.execute("PRAGMA foreign_keys") as cursor:
        foreign_keys = await cursor.fetchone()

    assert journal is not None and str(journal[0]).lower() == "wal"
    assert foreign_keys is not None and foreign_keys[0] == 1
    with pytest.raises(sqlite3.IntegrityError):
        async with db.write() as conn:
            await conn.execute(
                "INSERT INTO messages (chat_id, sender_name, content, timestamp) VALUES (999, 'x', 'y', 0)"
            )


async def test_transaction_rolls_back_on_error(db: Database) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with db.transaction() as conn:
            await conn.execute(
                "INSERT INTO chats (id, kind, title, folder, created_at) VALUES (5, 'group', 't', 'f5', 0)"
            )
            raise RuntimeError("boom")

    async with db.conn.execute("SELECT COUNT(*) FROM chats") as cursor:
        row = await cursor.fetchone()
    assert row is not None and row[0] == 0
    assert not db.conn.in_transaction
