"""Subagent runs: every run recorded, statuses only move forward, one outcome recorded once."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from enum import StrEnum

from core.store.db import Database
from core.store.messages import insert_message
from core.store.outbox import Outgoing, stage
from core.store.run_record import FINAL_STATUSES, LIVE_STATUSES, RunRecord, RunStatus, run_from_row

# The record and its statuses live in core.store.run_record; they are imported from here by most users.
__all__ = [
    "FINAL_STATUSES",
    "LIVE_STATUSES",
    "DuplicateRun",
    "FollowUp",
    "ProgressOutcome",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "run_from_row",
]


class FollowUp(StrEnum):
    """What became of a follow-up the main agent sent a run (`subagents` tool, `send`)."""

    SENT = "sent"  # its next LLM request (and every later one) carries it
    NOT_RUNNING = "not_running"  # no such live run in this chat (ended, waiting in the queue, or another chat's)
    FULL = "full"  # the run has had its MAX_FOLLOWUPS


class ProgressOutcome(StrEnum):
    """What became of a progress message a run sent."""

    ACCEPTED = "accepted"  # stored and owed to the chat
    DUPLICATE = "duplicate"  # the same message id was accepted before (a retry)
    OVER_BUDGET = "over_budget"  # the run has sent its SUBAGENT_MAX_MESSAGES
    NOT_LIVE = "not_live"  # the run has an outcome already


class DuplicateRun(Exception):
    """A run with this request id exists already: the request was processed before."""


class RunStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._watchers: list[Callable[[str], None]] = []

    def watch(self, on_change: Callable[[str], None]) -> None:
        """Call `on_change(run_id)` after a run's state changed (created, started, ended): the status card."""
        self._watchers.append(on_change)

    def changed(self, run_id: str) -> None:
        """Tell the watchers a run changed (its egress totals, written by others)."""
        for watcher in self._watchers:
            watcher(run_id)

    async def create(
        self,
        run_id: str,
        *,
        chat_id: int,
        turn_id: str | None,
        task: str,
        label: str,
        include_context: bool,
        status: RunStatus,
        error: str | None = None,
        files: Sequence[str] = (),
        needs_approval: bool = False,
    ) -> None:
        """Record a run; `needs_approval` marks it, in the same write, as one that starts only once approved."""
        now = time.time()
        finished = now if status in FINAL_STATUSES else None
        notified = 0 if status == RunStatus.REJECTED else 1
        try:
            async with self._db.write() as conn:
                await conn.execute(
                    "INSERT INTO subagent_runs (id, chat_id, turn_id, task, label, include_context, status, "
                    "created_at, finished_at, error, notified, files, needs_approval) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        chat_id,
                        turn_id,
                        task,
                        label,
                        int(include_context),
                        status,
                        now,
                        finished,
                        error,
                        notified,
                        json.dumps(list(files)),
                        int(needs_approval),
                    ),
                )
        except sqlite3.IntegrityError as exc:
            if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
                raise DuplicateRun(run_id) from exc
            raise
        self.changed(run_id)

    async def exists(self, run_id: str) -> bool:
        async with self._db.conn.execute("SELECT 1 FROM subagent_runs WHERE id = ?", (run_id,)) as cursor:
            return await cursor.fetchone() is not None

    async def asked_by(self, run_id: str) -> int | None:
        """The platform message the run's turn answered: the run's result replies to it."""
        async with self._db.conn.execute(
            "SELECT m.platform_message_id FROM subagent_runs AS r JOIN turns AS t ON t.id = r.turn_id "
            "JOIN messages AS m ON m.id = t.trigger_message_id WHERE r.id = ?",
            (run_id,),
        ) as cursor:
            row = await cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    async def get(self, run_id: str) -> RunRecord | None:
        async with self._db.conn.execute("SELECT * FROM subagent_runs WHERE id = ?", (run_id,)) as cursor:
            row = await cursor.fetchone()
        return run_from_row(row) if row else None

    async def for_chat(self, chat_id: int, limit: int) -> list[RunRecord]:
        async with self._db.conn.execute(
            "SELECT * FROM subagent_runs WHERE chat_id = ? ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (chat_id, limit),
        ) as cursor:
            rows = await cursor.fetchall()
        return [run_from_row(row) for row in rows]

    async def for_turn(self, turn_id: str) -> list[RunRecord]:
        async with self._db.conn.execute(
            "SELECT * FROM subagent_runs WHERE turn_id = ? ORDER BY created_at, rowid", (turn_id,)
        ) as cursor:
            rows = await cursor.fetchall()
        return [run_from_row(row) for row in rows]

    async def created_since(self, since: float, chat_id: int | None = None) -> list[RunRecord]:
        """Runs requested at or after `since` (unix seconds), oldest first; one chat's, or all."""
        query, params = "SELECT * FROM subagent_runs WHERE created_at >= ?", [since]
        if chat_id is not None:
            query, params = query + " AND chat_id = ?", [since, chat_id]
        async with self._db.conn.execute(query + " ORDER BY created_at, rowid", params) as cursor:
            rows = await cursor.fetchall()
        return [run_from_row(row) for row in rows]

    async def with_status(self, *statuses: str) -> list[RunRecord]:
        marks = ", ".join("?" for _ in statuses)
        async with self._db.conn.execute(
            f"SELECT * FROM subagent_runs WHERE status IN ({marks}) ORDER BY created_at, rowid", statuses
        ) as cursor:
            rows = await cursor.fetchall()
        return [run_from_row(row) for row in rows]

    async def mark_running(self, run_id: str, session_in: str | None) -> bool:
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE subagent_runs SET status = 'running', started_at = ?, session_in = ? "
                "WHERE id = ? AND status = 'queued'",
                (time.time(), session_in, run_id),
            )
        if cursor.rowcount == 1:
            self.changed(run_id)
        return cursor.rowcount == 1

    async def set_container(self, run_id: str, container_id: str, started_at: float | None = None) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE subagent_runs SET container_id = ?, container_started_at = COALESCE(?, container_started_at) "
                "WHERE id = ?",
                (container_id, started_at, run_id),
            )

    async def record_resources(
        self, run_id: str, *, memory_peak_bytes: int | None, cpu_seconds: float | None, samples: int
    ) -> None:
        """What its container used, as of its last sample (a re-attached run adds to what was known)."""
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE subagent_runs SET "
                "memory_peak_bytes = CASE WHEN ?1 IS NULL THEN memory_peak_bytes "
                "ELSE MAX(COALESCE(memory_peak_bytes, 0), ?1) END, "
                "cpu_seconds = CASE WHEN ?2 IS NULL THEN cpu_seconds ELSE MAX(COALESCE(cpu_seconds, 0), ?2) END, "
                "resource_samples = resource_samples + ?3 WHERE id = ?4",
                (memory_peak_bytes, cpu_seconds, samples, run_id),
            )

    async def record_usage(self, run_id: str, input_tokens: int, output_tokens: int, requests: int) -> None:
        """The LLM proxy's usage sink: add one call's tokens to the run."""
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE subagent_runs SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?, "
                "llm_requests = llm_requests + ? WHERE id = ?",
                (input_tokens, output_tokens, requests, run_id),
            )

    async def finish(
        self,
        run_id: str,
        status: str,
        *,
        result: str | None = None,
        error: str | None = None,
        session_out: str | None = None,
        outgoing: Outgoing | None = None,
        deliver: bool = True,
    ) -> bool:
        """Move a live run to `status` and, in the same transaction, store its message and owe it to the chat.

        Returns False (and stores nothing) when the run had already reached a final status: whichever
        outcome is recorded first (say, a cancel racing a completion) is the only one.
        """
        if status not in FINAL_STATUSES:
            raise ValueError(f"{status} is not a final status")
        async with self._db.transaction() as conn:
            cursor = await conn.execute(
                "UPDATE subagent_runs SET status = ?, finished_at = ?, result = COALESCE(?, result), "
                "error = COALESCE(?, error), session_out = COALESCE(?, session_out) "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (status, time.time(), result, error, session_out, run_id),
            )
            if cursor.rowcount != 1:
                return False
            if outgoing is not None and deliver:
                await stage(conn, outgoing)
            elif outgoing is not None:  # stored for the next prompt only (SUBAGENT_RESULT_MODE=announce)
                await insert_message(conn, outgoing.message)
        self.changed(run_id)
        return True

    # --- sessions -------------------------------------------------------------------------------

    async def current_session(self, chat_id: int) -> str | None:
        async with self._db.conn.execute(
            "SELECT session_id FROM chat_sessions WHERE chat_id = ?", (chat_id,)
        ) as cursor:
            row = await cursor.fetchone()
        return str(row[0]) if row else None

    async def continued_run(self, turn_id: str | None) -> RunRecord | None:
        """The run a turn continues: the message the turn answers replied to that run's [Subagent] result.
        Derived from what is stored, so it holds for a request picked up after a restart."""
        if turn_id is None:
            return None
        async with self._db.conn.execute(
            "SELECT o.run_id FROM turns t JOIN messages q ON q.id = t.trigger_message_id "
            "JOIN messages r ON r.chat_id = q.chat_id AND r.platform_message_id = q.reply_to AND r.kind = 'subagent' "
            "JOIN outbox o ON o.message_id = r.id AND o.run_id IS NOT NULL WHERE t.id = ?",
            (turn_id,),
        ) as cursor:
            row = await cursor.fetchone()
        return await self.get(str(row[0])) if row else None

    async def session_for(self, chat_id: int, turn_id: str | None) -> str | None:
        """A new run's starting session: the session of the run its turn continues, else the chat's latest."""
        previous = await self.continued_run(turn_id)
        if previous is not None and previous.session_out:
            return previous.session_out
        return await self.current_session(chat_id)

    async def set_session(self, chat_id: int, session_id: str) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO chat_sessions (chat_id, session_id, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT(chat_id) DO UPDATE SET session_id = excluded.session_id, updated_at = excluded.updated_at",
                (chat_id, session_id, time.time()),
            )

    # --- progress messages ----------------------------------------------------------------------

    async def add_progress(
        self, run_id: str, message_id: str, outgoing: Outgoing, max_messages: int
    ) -> ProgressOutcome:
        """In one transaction: check the run is live and under its message budget, count the message,
        remember its id (a retry is a duplicate) and owe it to the chat."""
        async with self._db.transaction() as conn:
            async with conn.execute(
                "SELECT status, messages_sent FROM subagent_runs WHERE id = ?", (run_id,)
            ) as cursor:
                row = await cursor.fetchone()
            if row is None or row["status"] not in LIVE_STATUSES:
                return ProgressOutcome.NOT_LIVE
            key = f"{run_id}:{message_id}"
            async with conn.execute("SELECT 1 FROM ipc_messages WHERE id = ?", (key,)) as cursor:
                if await cursor.fetchone() is not None:
                    return ProgressOutcome.DUPLICATE  # a retry of a message that went out
            if row["messages_sent"] >= max_messages:
                return ProgressOutcome.OVER_BUDGET  # nothing recorded: a retry is refused the same way
            await conn.execute(
                "INSERT INTO ipc_messages (id, chat_id, received_at, run_id) VALUES (?, ?, ?, ?)",
                (key, outgoing.message.chat_id, time.time(), run_id),
            )
            await conn.execute("UPDATE subagent_runs SET messages_sent = messages_sent + 1 WHERE id = ?", (run_id,))
            await stage(conn, outgoing)
        return ProgressOutcome.ACCEPTED

    async def latest_progress(self, run_id: str) -> str | None:
        """The last progress message the run sent to the chat (as sent), if any."""
        async with self._db.conn.execute(
            "SELECT o.text FROM outbox o JOIN messages m ON m.id = o.message_id "
            "WHERE o.run_id = ? AND m.kind = 'progress' ORDER BY o.id DESC LIMIT 1",
            (run_id,),
        ) as cursor:
            row = await cursor.fetchone()
        return str(row[0]) if row else None

    # --- refusals -------------------------------------------------------------------------------

    async def unnotified_rejections(self) -> list[tuple[int, int]]:
        """(chat id, count) of refusals whose chat was not told yet (a crash between refusal and notice)."""
        async with self._db.conn.execute(
            "SELECT chat_id, COUNT(*) FROM subagent_runs WHERE status = 'rejected' AND notified = 0 GROUP BY chat_id"
        ) as cursor:
            return [(int(row[0]), int(row[1])) for row in await cursor.fetchall()]

    async def mark_rejections_notified(self, chat_id: int, outgoing: Outgoing) -> None:
        """The notice and the fact that the chat was told, in one transaction."""
        async with self._db.transaction() as conn:
            await conn.execute(
                "UPDATE subagent_runs SET notified = 1 WHERE chat_id = ? AND status = 'rejected' AND notified = 0",
                (chat_id,),
            )
            await stage(conn, outgoing)

    async def remember_ipc_message(self, message_id: str, chat_id: int) -> bool:
        """True the first time a progress message id is seen; False for a repeat."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "INSERT INTO ipc_messages (id, chat_id, received_at) VALUES (?, ?, ?) ON CONFLICT(id) DO NOTHING",
                (message_id, chat_id, time.time()),
            )
        return cursor.rowcount == 1
