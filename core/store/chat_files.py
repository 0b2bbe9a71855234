"""Files posted in chats, kept by reference: the platform's ids, the name, type and size, and the message
that carried them. The main agent's prompt names each `f<id>`; a run that needs one has it downloaded then."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from enum import StrEnum

import aiosqlite

from core.store.db import Database

REF_PREFIX = "f"
# A photo a subagent sent is a chat file too (the main agent sees it on its next turn): its "file id" names the
# host's own copy under DATA_DIR/files/out, `sent:<run id>/<name>`, which no platform could have given.
SENT_FILE_PREFIX = "sent:"
_SENT = re.compile(r"sent:([A-Za-z0-9_-]{1,64})/([A-Za-z0-9_-]{1,64})")
_REF = re.compile(r"f([1-9][0-9]{0,17})")
MAX_NAME_CHARS = 1_000  # a file name as posted; the prompt and the inbox show a safe form of it


class FileUnavailable(Exception):
    """A chat file cannot be had (gone from the platform, too big, a download that failed): the message says why."""


class FileKind(StrEnum):
    """What a chat member posted; Telegram's message fields by the same names."""

    DOCUMENT = "document"
    PHOTO = "photo"
    AUDIO = "audio"
    VOICE = "voice"
    VIDEO = "video"
    ANIMATION = "animation"
    STICKER = "sticker"
    VIDEO_NOTE = "video_note"  # a round video message


@dataclass(frozen=True, slots=True)
class NewFile:
    """A file as a channel saw it in a message; `file_id` is what the channel downloads it by."""

    kind: FileKind
    file_id: str
    file_unique_id: str  # the same bytes have the same one in every chat: downloaded once
    name: str
    mime_type: str | None = None
    size_bytes: int | None = None  # None: the platform did not say
    duration_seconds: int | None = None  # audio and video, as the platform said


@dataclass(frozen=True, slots=True)
class ChatFile:
    id: int
    chat_id: int
    message_id: int
    kind: FileKind
    file_id: str
    file_unique_id: str
    name: str
    mime_type: str | None
    size_bytes: int | None
    created_at: float
    duration_seconds: int | None = None

    @property
    def ref(self) -> str:
        return file_ref(self.id)


def size_text(size_bytes: int | None) -> str:
    """412 KB, 3.1 MB: a size as people read it; `size unknown` when the platform did not say."""
    if size_bytes is None:
        return "size unknown"
    if size_bytes < 1024:
        return f"{size_bytes} bytes"
    if size_bytes < 1024 * 1024:
        return f"{size_bytes / 1024:.0f} KB"
    return f"{size_bytes / (1024 * 1024):.1f} MB"


def file_ref(file_row_id: int) -> str:
    """How the prompt, spawn requests and scheduled tasks name a chat file: `f3`."""
    return f"{REF_PREFIX}{file_row_id}"


def stored_refs(stored: str) -> tuple[str, ...]:
    """The refs a run or a scheduled task keeps as a JSON list (its `files` column); none if unreadable."""
    try:
        refs = json.loads(stored)
    except ValueError:
        return ()
    return tuple(str(ref) for ref in refs) if isinstance(refs, list) else ()


def sent_file_id(run_id: str, stored_name: str) -> str:
    return f"{SENT_FILE_PREFIX}{run_id}/{stored_name}"


def parse_sent_file_id(file_id: str) -> tuple[str, str] | None:
    """(run id, stored name) of a sent photo's id; None for any other id (a platform's, or a forged one)."""
    match = _SENT.fullmatch(file_id)
    return (match.group(1), match.group(2)) if match else None


def parse_ref(ref: str) -> int | None:
    match = _REF.fullmatch(ref.strip())
    return int(match.group(1)) if match else None


def chat_file(row: aiosqlite.Row, prefix: str = "") -> ChatFile:
    return ChatFile(
        id=row[f"{prefix}id"],
        chat_id=row[f"{prefix}chat_id"],
        message_id=row[f"{prefix}message_id"],
        kind=FileKind(row[f"{prefix}kind"]),
        file_id=row[f"{prefix}file_id"],
        file_unique_id=row[f"{prefix}file_unique_id"],
        name=row[f"{prefix}name"],
        mime_type=row[f"{prefix}mime_type"],
        size_bytes=row[f"{prefix}size_bytes"],
        created_at=row[f"{prefix}created_at"],
        duration_seconds=row[f"{prefix}duration_seconds"],
    )


async def insert_chat_file(conn: aiosqlite.Connection, chat_id: int, message_id: int, file: NewFile) -> int:
    """Inside the caller's transaction, with the message that carried the file."""
    cursor = await conn.execute(
        "INSERT INTO chat_files (chat_id, message_id, kind, file_id, file_unique_id, name, mime_type, size_bytes, "
        "created_at, duration_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            chat_id,
            message_id,
            file.kind.value,
            file.file_id,
            file.file_unique_id,
            file.name[:MAX_NAME_CHARS],
            file.mime_type,
            file.size_bytes,
            time.time(),
            file.duration_seconds,
        ),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


class ChatFileStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def by_refs(self, refs: list[str]) -> dict[str, ChatFile]:
        """The files these refs name, of any chat (the caller checks whose); unknown refs are left out."""
        ids = {ref: row_id for ref in refs if (row_id := parse_ref(ref)) is not None}
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        async with self._db.conn.execute(
            f"SELECT * FROM chat_files WHERE id IN ({marks})", tuple(ids.values())
        ) as cursor:
            found = {row["id"]: chat_file(row) for row in await cursor.fetchall()}
        return {ref: found[row_id] for ref, row_id in ids.items() if row_id in found}

    async def of_message(self, message_id: int) -> ChatFile | None:
        async with self._db.conn.execute("SELECT * FROM chat_files WHERE message_id = ?", (message_id,)) as cursor:
            row = await cursor.fetchone()
        return chat_file(row) if row is not None else None
