"""Scheduled tasks and their fires. A due time runs only once its fire row is inserted (UNIQUE per task and
due time) in the same transaction that moves the task on: across restarts and processes, one claim wins."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum

import aiosqlite

from core.store.chat_files import stored_refs
from core.store.db import Database

TASK_ID_BYTES = 4  # 8 hex characters: short enough to type in /tasks cancel <id>
FIRES_KEPT_PER_TASK = 100  # a task's history keeps its latest ended due times; older ones are pruned


class TaskStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"  # a one-off that ran, or a schedule with no due time left
    CANCELLED = "cancelled"


class TaskMode(StrEnum):
    SUBAGENT = "subagent"
    MESSAGE = "message"


class FireStatus(StrEnum):
    """A due time's way: claimed, maybe waiting for a free slot, starting, running; then one outcome."""

    CLAIMED = "claimed"
    WAITING = "waiting"  # the subagent caps were full: it waits its turn
    STARTING = "starting"  # taken by one process to start; found so after a crash it counts as interrupted
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"


OPEN_TASK_STATUSES = (TaskStatus.ACTIVE, TaskStatus.PAUSED)
PENDING_FIRES = (FireStatus.CLAIMED, FireStatus.WAITING)


@dataclass(frozen=True, slots=True)
class NewTask:
    chat_id: int
    creator_id: int | None
    label: str
    prompt: str
    schedule: str
    timezone: str
    mode: TaskMode
    next_due_at: float
    created_at: float
    files: tuple[str, ...] = ()  # chat files (`f3`) each of its runs is given


@dataclass(frozen=True, slots=True)
class TaskRecord:
    id: str
    chat_id: int
    creator_id: int | None
    label: str
    prompt: str
    schedule: str
    timezone: str
    mode: TaskMode
    status: TaskStatus
    status_reason: str | None
    next_due_at: float | None
    failures: int
    backoff_until: float | None
    created_at: float
    last_outcome: str | None = None  # the latest fire's status and detail, for /tasks
    files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Fire:
    id: int
    task_id: str
    due_at: float
    status: FireStatus
    run_id: str | None
    detail: str | None


class TaskLimitReached(Exception):
    """The chat has as many open tasks as it may."""


def _task(row: aiosqlite.Row) -> TaskRecord:
    keys = row.keys()
    outcome = row["last_outcome"] if "last_outcome" in keys else None
    return TaskRecord(
        id=row["id"],
        chat_id=row["chat_id"],
        creator_id=row["creator_id"],
        label=row["label"],
        prompt=row["prompt"],
        schedule=row["schedule"],
        timezone=row["timezone"],
        mode=TaskMode(row["mode"]),
        status=TaskStatus(row["status"]),
        status_reason=row["status_reason"],
        next_due_at=row["next_due_at"],
        failures=row["failures"],
        backoff_until=row["backoff_until"],
        created_at=row["created_at"],
        last_outcome=outcome,
        files=stored_refs(row["files"]),
    )


def _fire(row: aiosqlite.Row) -> Fire:
    return Fire(
        id=row["id"],
        task_id=row["task_id"],
        due_at=row["due_at"],
        status=FireStatus(row["status"]),
        run_id=row["run_id"],
        detail=row["detail"],
    )


_LAST_OUTCOME = (
    "(SELECT f.status || COALESCE(': ' || f.detail, '') FROM task_fires f WHERE f.task_id = t.id "
    "ORDER BY f.due_at DESC, f.id DESC LIMIT 1) AS last_outcome"
)


class ScheduleStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, task: NewTask, max_open: int) -> TaskRecord:
        """Record a task unless the chat already has `max_open` active or paused ones: a forum's topics
        share one count (each topic is a conversation, but the limit is the chat's)."""
        task_id = secrets.token_hex(TASK_ID_BYTES)
        marks = ",".join("?" * len(OPEN_TASK_STATUSES))
        async with self._db.transaction() as conn:
            async with conn.execute(
                "SELECT COUNT(*) FROM scheduled_tasks WHERE chat_id IN (SELECT id FROM chats WHERE "
                "COALESCE(platform_chat_id, id) = (SELECT COALESCE(platform_chat_id, id) FROM chats WHERE id = ?) "
                f"UNION SELECT ?) AND status IN ({marks})",
                (task.chat_id, task.chat_id, *OPEN_TASK_STATUSES),
            ) as cursor:
                row = await cursor.fetchone()
            if row is not None and row[0] >= max_open:
                raise TaskLimitReached(f"this chat has {row[0]} scheduled tasks, the most it may have ({max_open})")
            await conn.execute(
                "INSERT INTO scheduled_tasks (id, chat_id, creator_id, label, prompt, schedule, timezone, mode, "
                "status, next_due_at, created_at, updated_at, files) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, ?)",
                (
                    task_id,
                    task.chat_id,
                    task.creator_id,
                    task.label,
                    task.prompt,
                    task.schedule,
                    task.timezone,
                    task.mode,
                    task.next_due_at,
                    task.created_at,
                    task.created_at,
                    json.dumps(list(task.files)),
                ),
            )
        record = await self.get(task_id)
        assert record is not None
        return record

    async def get(self, task_id: str) -> TaskRecord | None:
        async with self._db.conn.execute(
            f"SELECT t.*, {_LAST_OUTCOME} FROM scheduled_tasks t WHERE t.id = ?", (task_id,)
        ) as cursor:
            row = await cursor.fetchone()
        return _task(row) if row else None

    async def for_chat(self, chat_id: int, *, include_ended: bool = False) -> list[TaskRecord]:
        statuses = list(TaskStatus) if include_ended else list(OPEN_TASK_STATUSES)
        marks = ",".join("?" * len(statuses))
        async with self._db.conn.execute(
            f"SELECT t.*, {_LAST_OUTCOME} FROM scheduled_tasks t WHERE t.chat_id = ? AND t.status IN ({marks}) "
            "ORDER BY t.created_at, t.id",
            (chat_id, *statuses),
        ) as cursor:
            return [_task(row) for row in await cursor.fetchall()]

    async def active(self) -> list[TaskRecord]:
        async with self._db.conn.execute(
            "SELECT * FROM scheduled_tasks WHERE status = 'active' ORDER BY next_due_at"
        ) as cursor:
            return [_task(row) for row in await cursor.fetchall()]

    async def set_status(
        self,
        task_id: str,
        status: TaskStatus,
        reason: str | None,
        *,
        only_from: tuple[TaskStatus, ...] = OPEN_TASK_STATUSES,
        next_due_at: float | None = None,
    ) -> bool:
        """Move a task from one of `only_from`; resuming also sets the next due time and clears failures."""
        marks = ",".join("?" * len(only_from))
        reset = ", failures = 0, backoff_until = NULL, next_due_at = ?" if status is TaskStatus.ACTIVE else ""
        extra: tuple[float | None, ...] = (next_due_at,) if status is TaskStatus.ACTIVE else ()
        async with self._db.write() as conn:
            cursor = await conn.execute(
                f"UPDATE scheduled_tasks SET status = ?, status_reason = ?, updated_at = ?{reset} "
                f"WHERE id = ? AND status IN ({marks})",
                (status, reason, time.time(), *extra, task_id, *only_from),
            )
            return cursor.rowcount == 1

    async def move_due_earlier(self, task_id: str, from_due: float, to_due: float) -> bool:
        """Move an active task's next due time from `from_due` back to `to_due`, which no fire has reached;
        False when the task moved on meanwhile (a fire, another process)."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE scheduled_tasks SET next_due_at = ?, updated_at = ? "
                "WHERE id = ? AND status = 'active' AND next_due_at = ? AND ? < next_due_at "
                "AND NOT EXISTS (SELECT 1 FROM task_fires WHERE task_id = ? AND due_at >= ?)",
                (to_due, time.time(), task_id, from_due, to_due, task_id, to_due),
            )
            return cursor.rowcount == 1

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        """Every open task of the chat ends (its data was deleted, or the bot left it)."""
        marks = ",".join("?" * len(OPEN_TASK_STATUSES))
        async with self._db.write() as conn:
            cursor = await conn.execute(
                f"UPDATE scheduled_tasks SET status = 'cancelled', status_reason = ?, updated_at = ? "
                f"WHERE chat_id = ? AND status IN ({marks})",
                (reason, time.time(), chat_id, *OPEN_TASK_STATUSES),
            )
            return cursor.rowcount

    async def claim(
        self, task_id: str, due_at: float, next_due_at: float | None, *, skip: str | None = None
    ) -> Fire | None:
        """Take the due time `due_at` of an active task and move the task on to `next_due_at` (None: it is done).

        None when the task is not active or another claim of this due time won. With `skip` the fire is
        recorded as skipped for that reason instead of pending."""
        now = time.time()
        status = FireStatus.SKIPPED if skip else FireStatus.CLAIMED
        async with self._db.transaction() as conn:
            async with conn.execute("SELECT status FROM scheduled_tasks WHERE id = ?", (task_id,)) as cursor:
                row = await cursor.fetchone()
            if row is None or row["status"] != TaskStatus.ACTIVE:
                return None
            cursor = await conn.execute(
                "INSERT OR IGNORE INTO task_fires (task_id, due_at, status, detail, claimed_at, finished_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (task_id, due_at, status, skip, now, now if skip else None),
            )
            if cursor.rowcount != 1:
                return None
            fire_id = cursor.lastrowid
            ended = next_due_at is None
            await conn.execute(
                "UPDATE scheduled_tasks SET next_due_at = ?, updated_at = ?, status = ?, status_reason = ? "
                "WHERE id = ?",
                (
                    next_due_at,
                    now,
                    TaskStatus.COMPLETED if ended else TaskStatus.ACTIVE,
                    "no due time left" if ended else None,
                    task_id,
                ),
            )
        assert fire_id is not None
        return Fire(fire_id, task_id, due_at, status, None, skip)

    async def move_fire(
        self,
        fire_id: int,
        to: FireStatus,
        *,
        only_from: tuple[FireStatus, ...],
        run_id: str | None = None,
        detail: str | None = None,
    ) -> bool:
        """Move a fire on if it is still in one of `only_from`: a conditional write, so one process wins."""
        marks = ",".join("?" * len(only_from))
        final = to in (FireStatus.DONE, FireStatus.FAILED, FireStatus.SKIPPED, FireStatus.INTERRUPTED)
        async with self._db.write() as conn:
            cursor = await conn.execute(
                f"UPDATE task_fires SET status = ?, run_id = COALESCE(?, run_id), detail = COALESCE(?, detail), "
                f"finished_at = ? WHERE id = ? AND status IN ({marks})",
                (to, run_id, detail, time.time() if final else None, fire_id, *only_from),
            )
            return cursor.rowcount == 1

    async def fires(self, *statuses: FireStatus) -> list[Fire]:
        marks = ",".join("?" * len(statuses))
        async with self._db.conn.execute(
            f"SELECT * FROM task_fires WHERE status IN ({marks}) ORDER BY due_at, id", statuses
        ) as cursor:
            return [_fire(row) for row in await cursor.fetchall()]

    async def prune_fires(self, keep_per_task: int = FIRES_KEPT_PER_TASK) -> int:
        """Drop ended fires beyond each task's latest `keep_per_task` (a 5-minute task makes 100k a year)."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "DELETE FROM task_fires WHERE status IN ('done', 'failed', 'skipped', 'interrupted') AND id IN "
                "(SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY due_at DESC) AS n "
                "FROM task_fires) WHERE n > ?)",
                (keep_per_task,),
            )
            return cursor.rowcount

    async def history(self, task_id: str, limit: int = 20) -> list[Fire]:
        async with self._db.conn.execute(
            "SELECT * FROM task_fires WHERE task_id = ? ORDER BY due_at DESC, id DESC LIMIT ?", (task_id, limit)
        ) as cursor:
            return [_fire(row) for row in await cursor.fetchall()]

    async def finished_runs(self) -> list[tuple[Fire, str, str | None]]:
        """Running fires whose subagent run has ended: (fire, the run's status, its error)."""
        async with self._db.conn.execute(
            "SELECT f.*, r.status AS run_status, r.error AS run_error FROM task_fires f "
            "JOIN subagent_runs r ON r.id = f.run_id "
            "WHERE f.status = 'running' AND r.status NOT IN ('queued', 'running') ORDER BY f.due_at"
        ) as cursor:
            return [(_fire(row), row["run_status"], row["run_error"]) for row in await cursor.fetchall()]

    async def record_outcome(self, task_id: str, failed: bool) -> int:
        """Count a finished run: a success clears the failures in a row, a failure adds one. The new count."""
        async with self._db.transaction() as conn:
            if failed:
                await conn.execute("UPDATE scheduled_tasks SET failures = failures + 1 WHERE id = ?", (task_id,))
            else:
                await conn.execute(
                    "UPDATE scheduled_tasks SET failures = 0, backoff_until = NULL WHERE id = ?", (task_id,)
                )
            async with conn.execute("SELECT failures FROM scheduled_tasks WHERE id = ?", (task_id,)) as cursor:
                row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def set_backoff(self, task_id: str, until: float) -> None:
        async with self._db.write() as conn:
            await conn.execute("UPDATE scheduled_tasks SET backoff_until = ? WHERE id = ?", (until, task_id))

    async def chat_kind(self, chat_id: int) -> str | None:
        async with self._db.conn.execute("SELECT kind FROM chats WHERE id = ?", (chat_id,)) as cursor:
            row = await cursor.fetchone()
        return row[0] if row else None

    async def chat_timezone(self, chat_id: int) -> str | None:
        async with self._db.conn.execute("SELECT timezone FROM chats WHERE id = ?", (chat_id,)) as cursor:
            row = await cursor.fetchone()
        return row[0] if row else None

    async def set_chat_timezone(self, chat_id: int, name: str | None) -> None:
        async with self._db.write() as conn:
            await conn.execute("UPDATE chats SET timezone = ? WHERE id = ?", (name, chat_id))
