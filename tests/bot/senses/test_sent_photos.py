"""A photo a subagent sent is seen by the main agent on its next turn like a posted one: read from the host's own
copy (never downloaded, never a path the id could point elsewhere with)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.senses.seen_images import SeenImages
from bot.senses.sent_photos import SentOrPosted
from bot.senses.window import WindowSenses
from core.store.chat_files import FileKind, FileUnavailable, NewFile, parse_sent_file_id, sent_file_id
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.transcripts import TranscriptStore
from tests.bot.senses.media import png

CHAT = -1401


class NoChannel:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        self.asked.append(file_id)
        raise FileUnavailable("not on the platform")


@pytest.mark.parametrize(
    "file_id", ["sent:../x/y", "sent:run/../../etc/passwd", "sent:run/a/b", "AgACAgIAAxkBAAI", "sent:/abs/path"]
)
def test_only_a_run_and_a_plain_name_make_a_sent_id(file_id: str) -> None:
    assert parse_sent_file_id(file_id) is None
    assert parse_sent_file_id(sent_file_id("run-abc123", "001-deadbeef")) == ("run-abc123", "001-deadbeef")


async def test_a_subagents_photo_is_shown_from_the_hosts_copy(tmp_path: Path) -> None:
    out_dir = tmp_path / "files" / "out"
    (out_dir / "run-abc123").mkdir(parents=True)
    (out_dir / "run-abc123" / "001-deadbeef").write_bytes(png(900, 600))
    (out_dir / "run-abc123" / "002-link").symlink_to(tmp_path / "elsewhere.png")
    (tmp_path / "elsewhere.png").write_bytes(png(10, 10))
    channel = NoChannel()
    db = await Database.open(tmp_path / "crewbot.sqlite3")
    try:
        await ChatStore(db).ensure(CHAT, "group", "main")
        for stored in ("001-deadbeef", "002-link"):
            photo = NewFile(
                FileKind.PHOTO, sent_file_id("run-abc123", stored), f"sent:{stored}", "chart.png", "image/png"
            )
            await MessageStore(db).add(
                NewMessage(CHAT, "[Subagent]", "[file sent: chart.png]", is_bot=True, file=photo)
            )
        window = await MessageStore(db).recent(CHAT, 10)
        senses = WindowSenses(
            TranscriptStore(db),
            SeenImages(tmp_path / "files" / "seen", SentOrPosted(channel, out_dir)),
            max_images=lambda: 3,
            stt_on=False,
            safe_name=str,
        )
        notes = await senses.look(window, with_images=True)
    finally:
        await db.close()
    assert channel.asked == []
    assert [(image.width, image.height) for _, image in notes.shown] == [(900, 600)]
    first, second = (m.file for m in window)
    assert first is not None and second is not None
    assert notes.image[first.id] == "(shown to you as image 1, 900×600)"
    assert notes.image[second.id].startswith("(image not shown to you: it could not be downloaded: its copy is no")
