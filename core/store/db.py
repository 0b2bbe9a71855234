"""The SQLite connection (WAL, foreign keys, busy timeout) and the migration runner."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import aiosqlite

# Package data (core/store/migrations/), so a wheel install finds them as a source checkout does.
MIGRATIONS_DIR: Traversable = files("core.store.migrations")
BUSY_TIMEOUT_MS = 5000
# SQLite's page cache per connection, in KiB (its default is 2,000). Every query is an index walk over a
# few pages and the OS caches the file, so 512 KiB serves as well and keeps ~1.5 MiB off the heap.
PAGE_CACHE_KIB = 512
_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class MigrationError(Exception):
    """A migration file is misnamed, numbered out of order, or failed to apply; none were found; or the
    database is newer than the code. `fix` is what to do, when it is not the usual (restore or move aside)."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


def discover_migrations(directory: Traversable = MIGRATIONS_DIR) -> list[tuple[int, Traversable]]:
    """The migrations in order; none at all is an install without its package data, never an empty schema."""
    found: list[tuple[int, Traversable]] = []
    scripts = [entry for entry in directory.iterdir() if entry.name.endswith(".sql")] if directory.is_dir() else []
    for entry in sorted(scripts, key=lambda entry: entry.name):
        match = _MIGRATION_NAME.match(entry.name)
        if not match:
            raise MigrationError(f"migration file {entry.name} is not named NNNN_name.sql")
        found.append((int(match.group(1)), entry))
    if not found:
        raise MigrationError(
            f"no migrations found in {directory}", "reinstall crewbot: its package lacks core/store/migrations/*.sql"
        )
    numbers = [n for n, _ in found]
    if numbers != list(range(1, len(numbers) + 1)):
        raise MigrationError(f"migrations must be numbered 0001, 0002, ... without gaps; found {numbers}")
    return found


class Database:
    """One aiosqlite connection shared by the process; writes that span statements use `transaction()`."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()
        self.path = path

    @classmethod
    async def open(cls, path: Path, migrations_dir: Traversable = MIGRATIONS_DIR) -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(path, isolation_level=None)
        conn.row_factory = aiosqlite.Row
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA foreign_keys=ON")
        await conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")  # negative: KiB, not pages
        # A deleted row's bytes are overwritten, not left in a free page: /forgetme and /memory forget really erase
        # (core/store/notes.py); flush_erased then checkpoints the WAL that held the page before.
        await conn.execute("PRAGMA secure_delete=ON")
        db = cls(conn, path)
        try:
            await db.migrate(migrations_dir)
        except BaseException:
            await conn.close()
            raise
        return db

    @property
    def conn(self) -> aiosqlite.Connection:
        return self._conn

    async def close(self) -> None:
        await self._conn.close()

    async def schema_version(self) -> int:
        async with self._conn.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def migrate(self, migrations_dir: Traversable = MIGRATIONS_DIR) -> list[int]:
        """Apply the migrations newer than `PRAGMA user_version`, each in its own transaction. A database
        newer than the newest migration was written by a later crewbot: refused, this code cannot read it."""
        applied: list[int] = []
        current = await self.schema_version()
        migrations = discover_migrations(migrations_dir)
        latest, newest = migrations[-1]
        if current > latest:
            raise MigrationError(
                f"it is at schema version {current}, newer than this crewbot's latest ({latest}, {newest.name})",
                "run the crewbot version that last used it (or a newer one), or restore a backup made before",
            )
        for number, path in migrations:
            if number <= current:
                continue
            script = path.read_text(encoding="utf-8")
            async with self._lock:
                try:
                    await self._conn.executescript(
                        f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version={number};\nCOMMIT;"
                    )
                except Exception as exc:
                    if self._conn.in_transaction:
                        await self._conn.execute("ROLLBACK")
                    raise MigrationError(
                        f"migration {path.name} (schema version {number - 1} to {number}) failed: {exc}"
                    ) from exc
            applied.append(number)
        return applied

    async def flush_erased(self) -> bool:
        """After an erase: copy the WAL into the database and truncate it, so the erased bytes (secure_delete
        zeroed them in the database's pages) leave the WAL too. False: a reader mid-snapshot (another process:
        `crewbot stats`) kept it busy, and a later checkpoint finishes it."""
        async with self._lock, self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)") as cursor:
            row = await cursor.fetchone()
        return row is None or not row[0]

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """Serialise multi-statement writes: commit on success, roll back on any error."""
        async with self._lock:
            await self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                await self._conn.execute("ROLLBACK")
                raise
            await self._conn.execute("COMMIT")

    @asynccontextmanager
    async def write(self) -> AsyncIterator[aiosqlite.Connection]:
        """A single-statement write: waits for any open transaction so it is not swallowed by it."""
        async with self._lock:
            yield self._conn
