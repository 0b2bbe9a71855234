"""Settings an operator changed on the running bot: the value in force (it outlives a restart) and a log."""

from __future__ import annotations

import time
from dataclasses import dataclass

from core.store.db import Database


@dataclass(frozen=True, slots=True)
class SettingChange:
    name: str
    old_value: str | None
    new_value: str
    changed_by: str
    changed_at: float


class SettingOverrideStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def all(self) -> dict[str, str]:
        async with self._db.conn.execute("SELECT name, value FROM setting_overrides ORDER BY name") as cursor:
            return {str(row[0]): str(row[1]) for row in await cursor.fetchall()}

    async def set(self, change: SettingChange) -> None:
        """The value in force and the log line, in one transaction."""
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO setting_overrides (name, value, changed_by, changed_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value, changed_by = excluded.changed_by, "
                "changed_at = excluded.changed_at",
                (change.name, change.new_value, change.changed_by, change.changed_at),
            )
            await conn.execute(
                "INSERT INTO setting_changes (name, old_value, new_value, changed_by, changed_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (change.name, change.old_value, change.new_value, change.changed_by, change.changed_at),
            )

    async def changes(self, since: float = 0.0, name: str | None = None) -> list[SettingChange]:
        """The log, oldest first (`crewbot stats` uses it for the cap in force over time)."""
        query = "SELECT name, old_value, new_value, changed_by, changed_at FROM setting_changes WHERE changed_at >= ?"
        params: list[object] = [since]
        if name is not None:
            query += " AND name = ?"
            params.append(name)
        async with self._db.conn.execute(query + " ORDER BY id", params) as cursor:
            rows = await cursor.fetchall()
        return [SettingChange(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def now_change(name: str, old_value: str | None, new_value: str, changed_by: str) -> SettingChange:
    return SettingChange(name, old_value, new_value, changed_by, time.time())
