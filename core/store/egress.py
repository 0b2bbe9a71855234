"""The connections runs made through the egress door: recorded in batches with each run's totals, and read
back for /subagents, logs and stats."""

from __future__ import annotations

from dataclasses import dataclass

import aiosqlite

from core.store.db import Database


@dataclass(frozen=True, slots=True)
class EgressRecord:
    """One connection as a run asked for it: allowed (with its bytes) or refused (with why)."""

    run_id: str
    chat_id: int
    host: str
    port: int
    address: str | None
    allowed: bool
    reason: str
    bytes_up: int
    bytes_down: int
    started_at: float
    ended_at: float
    lookups: int = 0  # names the host looked up for it (0 or 1): counted in the run's totals only

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


@dataclass(frozen=True, slots=True)
class EgressTotals:
    connections: int = 0
    refused: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    lookups: int = 0  # DNS lookups the host made for the runs


def _record(row: aiosqlite.Row) -> EgressRecord:
    return EgressRecord(
        run_id=row["run_id"],
        chat_id=row["chat_id"],
        host=row["host"],
        port=row["port"],
        address=row["address"],
        allowed=bool(row["allowed"]),
        reason=row["reason"],
        bytes_up=row["bytes_up"],
        bytes_down=row["bytes_down"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
    )


class EgressStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, run_id: str, kept: list[EgressRecord], counted: list[EgressRecord]) -> None:
        """In one transaction: keep the `kept` records, and add all `counted` ones to the run's totals (a run
        past its recording cap is still counted in full)."""
        async with self._db.transaction() as conn:
            await conn.executemany(
                "INSERT INTO egress_connections (run_id, chat_id, host, port, address, allowed, reason, bytes_up, "
                "bytes_down, started_at, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        r.run_id,
                        r.chat_id,
                        r.host[:300],
                        r.port,
                        r.address,
                        int(r.allowed),
                        r.reason[:500],
                        r.bytes_up,
                        r.bytes_down,
                        r.started_at,
                        r.ended_at,
                    )
                    for r in kept
                ],
            )
            if counted:
                await conn.execute(
                    "UPDATE subagent_runs SET egress_bytes_up = egress_bytes_up + ?, "
                    "egress_bytes_down = egress_bytes_down + ?, egress_connections = egress_connections + ?, "
                    "egress_refused = egress_refused + ?, egress_lookups = egress_lookups + ? WHERE id = ?",
                    (
                        sum(r.bytes_up for r in counted),
                        sum(r.bytes_down for r in counted),
                        len(counted),
                        sum(1 for r in counted if not r.allowed),
                        sum(r.lookups for r in counted),
                        run_id,
                    ),
                )

    async def of_run(self, run_id: str, limit: int) -> list[EgressRecord]:
        """The run's latest recorded connections, oldest first."""
        async with self._db.conn.execute(
            "SELECT * FROM egress_connections WHERE run_id = ? ORDER BY id DESC LIMIT ?", (run_id, limit)
        ) as cursor:
            rows = await cursor.fetchall()
        return [_record(row) for row in reversed(list(rows))]

    async def run_totals(self, run_id: str) -> EgressTotals:
        """Every connection of the run counted, also those past its recording cap."""
        return await self._sum("WHERE id = ?", (run_id,))

    async def totals(self, since: float = 0.0, chat_id: int | None = None) -> EgressTotals:
        """Every run's connections and bytes since a time (by the run's creation), of one chat or all."""
        if chat_id is None:
            return await self._sum("WHERE created_at >= ?", (since,))
        return await self._sum("WHERE created_at >= ? AND chat_id = ?", (since, chat_id))

    async def _sum(self, where: str, params: tuple[object, ...]) -> EgressTotals:
        async with self._db.conn.execute(
            "SELECT COALESCE(SUM(egress_connections), 0), COALESCE(SUM(egress_refused), 0), "
            "COALESCE(SUM(egress_bytes_up), 0), COALESCE(SUM(egress_bytes_down), 0), "
            f"COALESCE(SUM(egress_lookups), 0) FROM subagent_runs {where}",
            params,
        ) as cursor:
            row = await cursor.fetchone()
        if row is None:
            return EgressTotals()
        return EgressTotals(int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]))
