"""Retention of what the senses keep: prepared images no turn used for the period go from DATA_DIR/files/seen
(each use touches their time), and transcripts' words older than the period are dropped, their rows kept so
they are never transcribed again."""

from __future__ import annotations

import time
from pathlib import Path

from core.store.chat_files import FileKind, NewFile
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.transcripts import TranscriptState, TranscriptStore
from runner.storage.paths import DataPaths
from runner.storage.retention import PRUNED_TRANSCRIPT, Retention

CHAT = -702
DAYS = 7.0
DAY_SECONDS = 86_400.0


async def test_unused_prepared_images_and_old_transcripts_go(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    seen = paths.files_seen_dir
    seen.mkdir(parents=True)
    (seen / ("a" * 40 + ".jpg")).write_bytes(b"\xff\xd8\xff old")
    (seen / ("b" * 40 + ".refused")).write_bytes(b"it declares more pixels")
    db = await Database.open(tmp_path / "crewbot.sqlite3")
    try:
        await ChatStore(db).ensure(CHAT, "group", "senses")
        row = await MessageStore(db).add(
            NewMessage(CHAT, "Alice", "", kind="file", file=NewFile(FileKind.VOICE, "v", "u", "voice.ogg"))
        )
        file = (await MessageStore(db).get(row or 0)).file  # type: ignore[union-attr]
        assert file is not None
        transcripts = TranscriptStore(db)
        await transcripts.begin(file.id, CHAT)
        await transcripts.done(file.id, "the words", 3.0)

        now = Retention(db, paths, DAYS, clock=time.time)
        kept = await now.prune()
        later = Retention(db, paths, DAYS, clock=lambda: time.time() + 2 * DAYS * DAY_SECONDS)
        pruned = await later.prune()
        found = (await transcripts.of_files([file.id]))[file.id]
        again = await transcripts.begin(file.id, CHAT)
    finally:
        await db.close()
    assert (kept.images_seen, kept.transcripts) == (0, 0)
    assert (pruned.images_seen, pruned.transcripts) == (2, 1)
    assert list(seen.iterdir()) == []
    assert (found.state, found.text, found.reason) == (TranscriptState.FAILED, "", PRUNED_TRANSCRIPT)
    assert not again
