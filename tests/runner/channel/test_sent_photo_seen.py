"""A photo a subagent sends is kept as a chat file of the bot's message (the main agent is shown it on its next
turn, read from the host's copy: bot/senses/sent_photos.py); a document is not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.senses.sent_photos import SentOrPosted
from core.store.chat_files import FileKind, FileUnavailable, parse_sent_file_id
from core.store.messages import MessageStore
from runner.storage.chat_file_cache import ChatFileCache
from tests.runner.channel.file_desk_rig import CHAT, DeskRig, desk_rig, png


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DeskRig]:
    async with desk_rig(tmp_path, monkeypatch) as opened:
        yield opened


class NoPlatform:
    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        raise FileUnavailable("not a platform file")


async def test_a_sent_photo_is_a_chat_file_read_from_the_hosts_copy(rig: DeskRig) -> None:
    photo = png()
    assert (await rig.upload(photo, upload_id="upload-chart", name="chart.png")).status == 200
    assert (await rig.upload(b"just text", upload_id="upload-notes", name="notes.txt")).status == 200
    stored = await MessageStore(rig.db).recent(CHAT, 10)
    files = [m.file for m in stored if m.file is not None]
    assert [(f.kind, f.name, f.mime_type) for f in files] == [(FileKind.PHOTO, "chart.png", "image/png")]
    sent = parse_sent_file_id(files[0].file_id)
    assert sent is not None and sent[0] == rig.live.id
    read = await SentOrPosted(NoPlatform(), rig.out_dir.parent).download_file(files[0].file_id, 10 * 1024 * 1024)
    assert read == photo


async def test_a_later_run_can_be_given_a_sent_photo(rig: DeskRig, tmp_path: Path) -> None:
    """As crewbot/serve.py wires the runs' file source: a sent photo's copy, not a platform download."""
    photo = png()
    assert (await rig.upload(photo, upload_id="upload-chart", name="chart.png")).status == 200
    file = next(m.file for m in await MessageStore(rig.db).recent(CHAT, 10) if m.file is not None)
    cache = ChatFileCache(tmp_path / "files-in", SentOrPosted(NoPlatform(), rig.out_dir.parent))
    copy = await cache.local_copy(file, 10 * 1024 * 1024)
    assert copy.path.read_bytes() == photo
