"""Every repository on one database connection, opened once by the composition root and passed in."""

from __future__ import annotations

from dataclasses import dataclass

from core.settings import Settings
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.history import HistoryIndex
from core.store.live_messages import LiveMessageStore
from core.store.messages import MessageStore
from core.store.notes import NoteStore
from core.store.outbox import OutboxStore
from core.store.transcripts import TranscriptStore
from core.store.turns import TurnStore


@dataclass(slots=True)
class Stores:
    db: Database
    chats: ChatStore
    messages: MessageStore
    turns: TurnStore
    outbox: OutboxStore
    live: LiveMessageStore  # growing answers on screen (crash recovery of a streamed answer)
    transcripts: TranscriptStore  # voice notes' words (bot/senses/)
    notes: NoteStore  # the chats' and members' notes
    history: HistoryIndex  # full-text search through every chat's messages

    @classmethod
    async def open(cls, settings: Settings) -> Stores:
        db = await Database.open(settings.db_path)
        return cls(
            db=db,
            chats=ChatStore(db),
            messages=MessageStore(db),
            turns=TurnStore(db),
            outbox=OutboxStore(db),
            live=LiveMessageStore(db),
            transcripts=TranscriptStore(db),
            notes=NoteStore(db),
            history=HistoryIndex(db),
        )
