"""The files a run was given and the files it sent: for /subagents, logs, stats and retention, and the
one place a file out is counted against its run's limit and owed to the chat, in one transaction."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

import aiosqlite

from core.store.db import Database
from core.store.outbox import Outgoing, stage
from core.store.run_record import LIVE_STATUSES


class Direction(StrEnum):
    IN = "in"
    OUT = "out"


class FileOutOutcome(StrEnum):
    """What became of a file a run sent."""

    ACCEPTED = "accepted"  # recorded and owed to the chat
    DUPLICATE = "duplicate"  # the same upload id was accepted before (a retry)
    OVER_LIMIT = "over_limit"  # the run has sent its SUBAGENT_MAX_FILES
    NOT_LIVE = "not_live"  # the run has an outcome already


@dataclass(frozen=True, slots=True)
class RunFile:
    id: int
    run_id: str
    chat_id: int
    direction: Direction
    name: str
    size_bytes: int
    kind: str  # in: the chat file's kind; out: photo or document
    chat_file_id: int | None
    stored: str | None  # out: the host-side copy's absolute path (the outbox row sends it from there)
    created_at: float


@dataclass(frozen=True, slots=True)
class GivenFile:
    """A chat file as a run was given it: the name it has in the run's inbox."""

    chat_file_id: int
    name: str
    size_bytes: int
    kind: str


@dataclass(frozen=True, slots=True)
class FileTotals:
    files_in: int = 0
    bytes_in: int = 0
    files_out: int = 0
    bytes_out: int = 0


def _run_file(row: aiosqlite.Row) -> RunFile:
    return RunFile(
        id=row["id"],
        run_id=row["run_id"],
        chat_id=row["chat_id"],
        direction=Direction(row["direction"]),
        name=row["name"],
        size_bytes=row["size_bytes"],
        kind=row["kind"],
        chat_file_id=row["chat_file_id"],
        stored=row["stored"],
        created_at=row["created_at"],
    )


class RunFileStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def set_given(self, run_id: str, chat_id: int, files: list[GivenFile]) -> None:
        """The files the run is given (a re-attached run is offered them again: recorded once)."""
        now = time.time()
        async with self._db.transaction() as conn:
            await conn.execute("DELETE FROM run_files WHERE run_id = ? AND direction = 'in'", (run_id,))
            await conn.executemany(
                "INSERT INTO run_files (run_id, chat_id, direction, name, size_bytes, kind, chat_file_id, "
                "created_at) VALUES (?, ?, 'in', ?, ?, ?, ?, ?)",
                [(run_id, chat_id, f.name, f.size_bytes, f.kind, f.chat_file_id, now) for f in files],
            )

    async def add_out(
        self,
        run_id: str,
        upload_id: str,
        outgoing: Outgoing,
        *,
        stored: str,
        size_bytes: int,
        max_files: int,
    ) -> FileOutOutcome:
        """In one transaction: check the run is live and under its file limit, record the file (its upload
        id makes a retry a duplicate) and owe it to the chat."""
        file = outgoing.file
        assert file is not None, "a file out carries its file"
        async with self._db.transaction() as conn:
            async with conn.execute("SELECT status FROM subagent_runs WHERE id = ?", (run_id,)) as cursor:
                row = await cursor.fetchone()
            if row is None or row["status"] not in LIVE_STATUSES:
                return FileOutOutcome.NOT_LIVE
            async with conn.execute(
                "SELECT 1 FROM run_files WHERE run_id = ? AND upload_id = ?", (run_id, upload_id)
            ) as cursor:
                if await cursor.fetchone() is not None:
                    return FileOutOutcome.DUPLICATE
            async with conn.execute(
                "SELECT COUNT(*) FROM run_files WHERE run_id = ? AND direction = 'out'", (run_id,)
            ) as cursor:
                count_row = await cursor.fetchone()
            if count_row is not None and int(count_row[0]) >= max_files:
                return FileOutOutcome.OVER_LIMIT
            await conn.execute(
                "INSERT INTO run_files (run_id, chat_id, direction, name, size_bytes, kind, upload_id, stored, "
                "created_at) VALUES (?, ?, 'out', ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    outgoing.message.chat_id,
                    file.name,
                    size_bytes,
                    file.kind.value,
                    upload_id,
                    stored,
                    time.time(),
                ),
            )
            await stage(conn, outgoing)
        return FileOutOutcome.ACCEPTED

    async def of_run(self, run_id: str) -> list[RunFile]:
        async with self._db.conn.execute("SELECT * FROM run_files WHERE run_id = ? ORDER BY id", (run_id,)) as cursor:
            return [_run_file(row) for row in await cursor.fetchall()]

    async def totals(self, since: float = 0.0, chat_id: int | None = None) -> FileTotals:
        """Files and bytes in and out since a time, of one chat or all."""
        query = "SELECT direction, COUNT(*), COALESCE(SUM(size_bytes), 0) FROM run_files WHERE created_at >= ?"
        params: tuple[object, ...] = (since,)
        if chat_id is not None:
            query, params = f"{query} AND chat_id = ?", (since, chat_id)
        async with self._db.conn.execute(f"{query} GROUP BY direction", params) as cursor:
            rows = {str(row[0]): (int(row[1]), int(row[2])) for row in await cursor.fetchall()}
        files_in, bytes_in = rows.get(Direction.IN, (0, 0))
        files_out, bytes_out = rows.get(Direction.OUT, (0, 0))
        return FileTotals(files_in, bytes_in, files_out, bytes_out)

    async def stored_out(self, before: float) -> list[tuple[int, str]]:
        """(id, stored path) of files out recorded before a time whose sending is over (sent or given up)."""
        async with self._db.conn.execute(
            "SELECT f.id, f.stored FROM run_files AS f WHERE f.direction = 'out' AND f.stored IS NOT NULL "
            "AND f.created_at < ? AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.file_path = f.stored "
            "AND o.status = 'pending')",
            (before,),
        ) as cursor:
            return [(int(row[0]), str(row[1])) for row in await cursor.fetchall()]

    async def forget_stored(self, ids: list[int]) -> None:
        """The files were pruned: their records stay (stats, /subagents) without a stored copy."""
        async with self._db.write() as conn:
            await conn.executemany("UPDATE run_files SET stored = NULL WHERE id = ?", [(i,) for i in ids])
