"""Recording the files of a run as the subagent side does (a chat file given to it, a file it sent), on the
real store, for the tests of what operators see of them: /subagents, `crewbot logs`, stats and retention."""

from __future__ import annotations

import secrets
from pathlib import Path

from core.store.chat_files import ChatFileStore, FileKind, NewFile
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.outbox import Outgoing, OutgoingFile, SentFileKind
from core.store.run_files import FileOutOutcome, GivenFile, RunFileStore


async def give(db: Database, run_id: str, chat_id: int, files: list[tuple[str, int, FileKind]]) -> None:
    """Each (name, size, kind) posted in the chat, then given to the run (as RunOpener records it)."""
    given: list[GivenFile] = []
    for name, size, kind in files:
        unique = secrets.token_hex(6)
        message_id = await MessageStore(db).add(
            NewMessage(
                chat_id=chat_id,
                sender_name="Alice",
                content=name,
                kind=kind.value,
                file=NewFile(kind=kind, file_id=f"id-{unique}", file_unique_id=unique, name=name, size_bytes=size),
            )
        )
        assert message_id is not None
        chat_file = await ChatFileStore(db).of_message(message_id)
        assert chat_file is not None
        given.append(GivenFile(chat_file_id=chat_file.id, name=name, size_bytes=size, kind=kind.value))
    await RunFileStore(db).set_given(run_id, chat_id, given)


async def send(
    db: Database, run_id: str, chat_id: int, name: str, size: int, kind: SentFileKind, stored: Path
) -> FileOutOutcome:
    """The run (live) sent a file the host wrote to `stored`: recorded and owed to the chat (as the desk does)."""
    outgoing = Outgoing(
        message=NewMessage(chat_id=chat_id, sender_name="Subagent", content=f"[file sent: {name}]", is_bot=True),
        text="",
        run_id=run_id,
        file=OutgoingFile(path=stored, name=name, kind=kind),
    )
    return await RunFileStore(db).add_out(
        run_id, secrets.token_hex(6), outgoing, stored=str(stored), size_bytes=size, max_files=100
    )
