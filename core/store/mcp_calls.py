"""MCP tool calls as `crewbot stats` reads them: one row per call (core/store/migrations/0021_mcp_calls.sql)."""

from __future__ import annotations

from dataclasses import dataclass

from core.store.db import Database


@dataclass(frozen=True, slots=True)
class McpCallRow:
    chat_id: int
    at: float  # unix seconds
    server: str
    tool: str
    outcome: str  # core.mcp_client.CallStatus's value
    seconds: float
    result_chars: int
    run_id: str | None = None  # the subagent run it was made for; None: the main agent's


class McpCallStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, row: McpCallRow) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO mcp_calls (chat_id, at, server, tool, outcome, seconds, result_chars, run_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (row.chat_id, row.at, row.server, row.tool, row.outcome, row.seconds, row.result_chars, row.run_id),
            )

    async def since(self, since: float, chat_id: int | None = None) -> list[McpCallRow]:
        """The calls that ended at or after `since` (unix seconds), of one chat or all, oldest first."""
        where, params = "at >= ?", [since]
        if chat_id is not None:
            where, params = "at >= ? AND chat_id = ?", [since, chat_id]
        async with self._db.conn.execute(
            f"SELECT chat_id, at, server, tool, outcome, seconds, result_chars, run_id FROM mcp_calls WHERE {where} "
            "ORDER BY at, id",
            params,
        ) as cursor:
            rows = await cursor.fetchall()
        return [
            McpCallRow(int(r[0]), float(r[1]), str(r[2]), str(r[3]), str(r[4]), float(r[5]), int(r[6]), r[7])
            for r in rows
        ]
