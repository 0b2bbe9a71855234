"""Questions the bot asks a chat for a run, and their one decision each: stored before anything is posted or
decided, so a restart keeps them (a re-attached run still gets its answer, an old button still works or says
why not) and /subagents and `crewbot logs` show who decided what, when.

A question is closed once: answered (the first answer counts: `answer` writes only while it is open), expired
(no answer in time) or ended (its run ended, or the question could not be posted). The chat's own web
allowlist (SUBAGENT_EGRESS=ask's "Allow in this chat") lives here too.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import aiosqlite

from core.store.db import Database


class QuestionKind(StrEnum):
    ASK = "ask"  # a subagent's ask_chat
    EGRESS = "egress"  # a run wants a host not on any list (SUBAGENT_EGRESS=ask)
    APPROVAL = "approval"  # a run waits for an admin's OK before it starts (SUBAGENT_APPROVAL=admins)
    TOPUP = "topup"  # the allowance notice's button: a day's top-up


class Audience(StrEnum):
    ASKERS = "askers"  # who asked for the run, the chat's admins and ADMIN_USER_IDS
    ADMINS = "admins"  # the chat's admins and ADMIN_USER_IDS only


class QuestionStatus(StrEnum):
    OPEN = "open"
    ANSWERED = "answered"
    EXPIRED = "expired"  # nobody answered in time: a no
    ENDED = "ended"  # its run ended (cancel, merge, time limit), or it could not be shown


@dataclass(frozen=True, slots=True)
class NewQuestion:
    chat_id: int
    run_id: str | None
    kind: QuestionKind
    text: str
    options: tuple[str, ...]
    audience: Audience
    expires_at: float
    ask_id: str | None = None


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    chat_id: int
    run_id: str | None
    kind: QuestionKind
    ask_id: str | None
    text: str
    options: tuple[str, ...]
    audience: Audience
    status: QuestionStatus
    created_at: float
    expires_at: float
    message_id: int | None
    answer: str | None
    option: int | None
    answered_by: int | None
    answered_by_name: str | None
    answered_at: float | None
    detail: str | None

    @property
    def is_open(self) -> bool:
        return self.status is QuestionStatus.OPEN


@dataclass(frozen=True, slots=True)
class ChatAllowEntry:
    entry: str
    added_by: int
    added_by_name: str
    added_at: float


def _question(row: aiosqlite.Row) -> Question:
    return Question(
        id=row["id"],
        chat_id=row["chat_id"],
        run_id=row["run_id"],
        kind=QuestionKind(row["kind"]),
        ask_id=row["ask_id"],
        text=row["text"],
        options=tuple(json.loads(row["options"])),
        audience=Audience(row["audience"]),
        status=QuestionStatus(row["status"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        message_id=row["message_id"],
        answer=row["answer"],
        option=row["option"],
        answered_by=row["answered_by"],
        answered_by_name=row["answered_by_name"],
        answered_at=row["answered_at"],
        detail=row["detail"],
    )


class QuestionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, question_id: str, new: NewQuestion) -> Question:
        """Store it open; a question with the same (run, ask id) is the one returned instead (a retry)."""
        try:
            async with self._db.write() as conn:
                await conn.execute(
                    "INSERT INTO questions (id, chat_id, run_id, kind, ask_id, text, options, audience, status, "
                    "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        question_id,
                        new.chat_id,
                        new.run_id,
                        new.kind,
                        new.ask_id,
                        new.text,
                        json.dumps(list(new.options)),
                        new.audience,
                        QuestionStatus.OPEN,
                        time.time(),
                        new.expires_at,
                    ),
                )
        except sqlite3.IntegrityError:
            if new.ask_id is None or new.run_id is None:
                raise
            existing = await self.by_ask_id(new.run_id, new.ask_id)
            if existing is None:
                raise
            return existing
        created = await self.get(question_id)
        assert created is not None
        return created

    async def get(self, question_id: str) -> Question | None:
        async with self._db.conn.execute("SELECT * FROM questions WHERE id = ?", (question_id,)) as cursor:
            row = await cursor.fetchone()
        return None if row is None else _question(row)

    async def by_ask_id(self, run_id: str, ask_id: str) -> Question | None:
        async with self._db.conn.execute(
            "SELECT * FROM questions WHERE run_id = ? AND ask_id = ?", (run_id, ask_id)
        ) as cursor:
            row = await cursor.fetchone()
        return None if row is None else _question(row)

    async def by_message(self, chat_id: int, message_id: int) -> Question | None:
        """The question a chat message shows (a reply to it may answer it)."""
        async with self._db.conn.execute(
            "SELECT * FROM questions WHERE chat_id = ? AND message_id = ? ORDER BY created_at DESC LIMIT 1",
            (chat_id, message_id),
        ) as cursor:
            row = await cursor.fetchone()
        return None if row is None else _question(row)

    async def for_run(self, run_id: str, kind: QuestionKind | None = None) -> list[Question]:
        query, args = "SELECT * FROM questions WHERE run_id = ?", [run_id]
        if kind is not None:
            query, args = query + " AND kind = ?", [*args, kind]
        async with self._db.conn.execute(query + " ORDER BY created_at, rowid", args) as cursor:
            return [_question(row) for row in await cursor.fetchall()]

    async def open_of(self, kind: QuestionKind) -> list[Question]:
        async with self._db.conn.execute(
            "SELECT * FROM questions WHERE status = ? AND kind = ? ORDER BY created_at, rowid",
            (QuestionStatus.OPEN, kind),
        ) as cursor:
            return [_question(row) for row in await cursor.fetchall()]

    async def waiting_runs(self, run_ids: Sequence[str]) -> set[str]:
        """Of these runs, those with an open question of a subagent (ask_chat or a web host)."""
        if not run_ids:
            return set()
        marks = ",".join("?" * len(run_ids))
        async with self._db.conn.execute(
            f"SELECT DISTINCT run_id FROM questions WHERE status = ? AND kind IN (?, ?) AND run_id IN ({marks})",
            (QuestionStatus.OPEN, QuestionKind.ASK, QuestionKind.EGRESS, *run_ids),
        ) as cursor:
            return {row[0] for row in await cursor.fetchall()}

    async def set_message(self, question_id: str, message_id: int | None) -> None:
        async with self._db.write() as conn:
            await conn.execute("UPDATE questions SET message_id = ? WHERE id = ?", (message_id, question_id))

    async def answer(
        self, question_id: str, answer: str, option: int | None, by: int, by_name: str, at: float | None = None
    ) -> bool:
        """Record the answer if the question is still open: True for the first answer, False for any later one."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE questions SET status = ?, answer = ?, option = ?, answered_by = ?, answered_by_name = ?, "
                "answered_at = ? WHERE id = ? AND status = ?",
                (
                    QuestionStatus.ANSWERED,
                    answer,
                    option,
                    by,
                    by_name,
                    time.time() if at is None else at,
                    question_id,
                    QuestionStatus.OPEN,
                ),
            )
            return cursor.rowcount == 1

    async def close(self, question_id: str, status: QuestionStatus, detail: str) -> bool:
        """Close an open question without an answer (expired, ended): False if it was closed already."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE questions SET status = ?, detail = ?, answered_at = ? WHERE id = ? AND status = ?",
                (status, detail, time.time(), question_id, QuestionStatus.OPEN),
            )
            return cursor.rowcount == 1

    # -- the chat's own web allowlist ------------------------------------------------------------

    async def allow_in_chat(self, chat_id: int, entry: str, by: int, by_name: str, *, limit: int) -> bool:
        """Keep the entry (once); False when the chat's list has `limit` entries already (counted in the write)."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "INSERT OR IGNORE INTO chat_egress_allow (chat_id, entry, added_by, added_by_name, added_at) "
                "SELECT ?, ?, ?, ?, ? WHERE (SELECT COUNT(*) FROM chat_egress_allow WHERE chat_id = ?) < ?",
                (chat_id, entry, by, by_name, time.time(), chat_id, limit),
            )
            return cursor.rowcount == 1

    async def chat_allowlist(self, chat_id: int) -> list[ChatAllowEntry]:
        async with self._db.conn.execute(
            "SELECT entry, added_by, added_by_name, added_at FROM chat_egress_allow WHERE chat_id = ? "
            "ORDER BY added_at",
            (chat_id,),
        ) as cursor:
            return [
                ChatAllowEntry(row["entry"], row["added_by"], row["added_by_name"], row["added_at"])
                for row in await cursor.fetchall()
            ]

    async def remove_from_chat(self, chat_id: int, entry: str) -> bool:
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "DELETE FROM chat_egress_allow WHERE chat_id = ? AND entry = ?", (chat_id, entry)
            )
            return cursor.rowcount == 1
