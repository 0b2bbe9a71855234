"""The bot's memory in `crewbot stats` and the metrics: notes kept (the chats' and the members'), chats with
notes off, and the history index's size against the messages it indexes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from core.settings import Settings
from core.store.chat_files import size_text
from core.store.db import Database
from core.store.history import HistoryIndex
from core.store.messages import MessageStore
from core.store.notes import NoteStore

# The index's size walks its pages (dbstat): about a second for millions of messages, so a scrape reuses it.
INDEX_SIZE_REFRESH_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class MemoryUse:
    chat_notes: int = 0
    member_notes: int = 0
    chats_off: int = 0
    messages: int = 0
    messages_bytes: int = 0  # all chats': the index is one for all
    index_bytes: int = 0


async def measure(db: Database, chat_id: int | None = None) -> MemoryUse:
    counts = await NoteStore(db).counts(chat_id)
    history = HistoryIndex(db)
    return MemoryUse(
        chat_notes=counts.chat_notes,
        member_notes=counts.member_notes,
        chats_off=counts.chats_off,
        messages=await MessageStore(db).count(chat_id),
        messages_bytes=await history.messages_bytes(),
        index_bytes=await history.size_bytes(),
    )


async def gather_memory(settings: Settings, chat_id: int | None) -> MemoryUse:
    db = await Database.open(settings.db_path)
    try:
        return await measure(db, chat_id)
    finally:
        await db.close()


def render_memory(use: MemoryUse) -> list[str]:
    off = f"; notes off in {use.chats_off} chat(s)" if use.chats_off else ""
    share = f" ({use.index_bytes / use.messages_bytes:.1f}x the messages' {size_text(use.messages_bytes)})"
    return [
        f"memory: {use.chat_notes} chat notes, {use.member_notes} member notes{off}",
        f"history index: {size_text(use.index_bytes)} for {use.messages:,} messages"
        + (share if use.messages_bytes else ""),
    ]


def memory_json(use: MemoryUse) -> dict[str, Any]:
    return asdict(use)


class MemoryGauges:
    """Read from the store before each scrape (crewbot/metrics_server.py); the index's size at most every
    INDEX_SIZE_REFRESH_SECONDS."""

    def __init__(self, registry: CollectorRegistry, db: Database, clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._clock = clock
        self._sized_at: float | None = None
        self.notes = Gauge(
            "crewbot_memory_notes", "Notes kept, all chats: chat notes and member notes", ["kind"], registry=registry
        )
        self.chats_off = Gauge("crewbot_memory_chats_off", "Chats whose notes an admin turned off", registry=registry)
        self.index_bytes = Gauge(
            "crewbot_history_index_bytes", "On-disk size of the full-text index of every message", registry=registry
        )

    async def refresh(self) -> None:
        counts = await NoteStore(self._db).counts()
        self.notes.labels(kind="chat").set(counts.chat_notes)
        self.notes.labels(kind="member").set(counts.member_notes)
        self.chats_off.set(counts.chats_off)
        now = self._clock()
        if self._sized_at is None or now - self._sized_at >= INDEX_SIZE_REFRESH_SECONDS:
            self.index_bytes.set(await HistoryIndex(self._db).size_bytes())
            self._sized_at = now
