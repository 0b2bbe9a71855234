"""Files on Telegram through real PTB and the fake Bot API: posted files kept by reference and shown to the
main agent, downloaded when a run needs them, and files owed to a chat sent as photos or documents."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from bot.channels.telegram import TelegramChannel, file_url_for
from core.store.chat_files import FileKind, FileUnavailable
from core.store.messages import MessageStore, NewMessage
from core.store.outbox import Outgoing, OutgoingFile, SentFileKind
from tests.bot.channels.test_telegram_e2e import RecordingModel
from tests.fakes.faults import Fault
from tests.fakes.telegram_files import MediaKind
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

CSV = b"month,total\njan,3\nfeb,5\n"


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (20, 120, 200)).save(out, "PNG")
    return out.getvalue()


def test_the_file_url_follows_the_api_base_url() -> None:
    assert file_url_for("https://api.telegram.org/bot") == "https://api.telegram.org/file/bot"
    assert file_url_for("http://127.0.0.1:8081/bot") == "http://127.0.0.1:8081/file/bot"
    assert file_url_for("http://127.0.0.1:8081/bot/") == "http://127.0.0.1:8081/file/bot"


@pytest.mark.parametrize(
    ("kind", "data", "name", "expected_name", "expected_mime"),
    [
        ("document", CSV, "sales.csv", "sales.csv", "text/csv"),
        ("photo", png(40, 30), None, "photo_{id}.jpg", "image/jpeg"),
        ("audio", b"ID3 fake mp3", "song.mp3", "song.mp3", "audio/mpeg"),
        ("voice", b"OggS voice", None, "voice_{id}.ogg", "audio/ogg"),
        ("video", b"\x00\x00\x00\x18ftypmp42", "clip.mp4", "clip.mp4", "video/mp4"),
        ("animation", b"\x00\x00\x00\x18ftypmp42", "funny.mp4", "funny.mp4", "video/mp4"),
    ],
)
async def test_a_posted_file_is_kept_by_reference_and_shown_to_the_main_agent(
    tmp_path: Path, kind: MediaKind, data: bytes, name: str | None, expected_name: str, expected_mime: str
) -> None:
    recorder = RecordingModel("seen")
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg), model=recorder.model()) as app:
        update = tg.push_media_message(
            GROUP_ID,
            kind,
            data,
            file_name=name,
            caption=f"@{tg.bot_username} what is in it?",
        )
        await tg.wait_for_messages(GROUP_ID, 1)
        stored = (await MessageStore(app.stores.db).recent(GROUP_ID, 5))[0]
    message = update["message"]
    file = stored.file
    assert file is not None and stored.kind == "file" and stored.is_trigger  # the caption's mention triggers
    shown_name = expected_name.format(id=message["message_id"])
    assert (file.kind, file.name, file.mime_type) == (FileKind(kind), shown_name, expected_mime)
    media = message[kind][-1] if kind == "photo" else message[kind]  # a photo by its largest size
    assert (file.file_id, file.file_unique_id, file.size_bytes) == (
        media["file_id"],
        media["file_unique_id"],
        media["file_size"],
    )
    assert stored.content == f"@{tg.bot_username} what is in it?"
    assert f"[file {file.ref}: {shown_name}, {expected_mime}," in recorder.prompts[0]


async def test_a_trigger_replying_to_a_file_shows_that_file_even_outside_the_window(tmp_path: Path) -> None:
    recorder = RecordingModel("on it")
    async with (
        FakeTelegram() as tg,
        telegram_app(make_settings(tmp_path, tg, HISTORY_WINDOW_MESSAGES=2), model=recorder.model()) as app,
    ):
        posted = tg.push_media_message(GROUP_ID, "document", CSV, file_name="../../sales\n.csv")
        for n in range(3):
            tg.push_message(GROUP_ID, f"chatter {n}")
        tg.push_message(GROUP_ID, f"@{tg.bot_username} plot this", reply_to_message_id=posted["message"]["message_id"])
        await tg.wait_for_messages(GROUP_ID, 1)
        ref = await MessageStore(app.stores.db).by_platform_id(GROUP_ID, posted["message"]["message_id"])
    assert ref is not None and ref.file is not None
    prompt = recorder.prompts[0]
    assert "sales_.csv" not in prompt.split("(It replies")[0]  # the file's message is outside the window
    # The name as a safe file name: no path, no newline in the prompt.
    assert f"(It replies to a message with [file {ref.file.ref}: sales_.csv, text/csv, 24 bytes])" in prompt


async def test_the_same_file_posted_twice_is_two_refs_to_one_platform_file(tmp_path: Path) -> None:
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg)) as app:
        tg.push_media_message(GROUP_ID, "document", CSV, file_name="a.csv")
        tg.push_media_message(GROUP_ID, "document", CSV, file_name="a.csv", caption=f"@{tg.bot_username} again")
        await tg.wait_for_messages(GROUP_ID, 1)
        files = [m.file for m in await MessageStore(app.stores.db).recent(GROUP_ID, 5) if m.file is not None]
    assert len(files) == 2 and files[0].id != files[1].id
    assert files[0].file_unique_id == files[1].file_unique_id  # one download serves both (chat_file_cache)


async def test_downloads_through_the_file_url_and_clear_failures(tmp_path: Path) -> None:
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg)) as app:
        channel = app.channel
        assert isinstance(channel, TelegramChannel)
        file_id = tg.push_media_message(GROUP_ID, "document", CSV, file_name="a.csv")["message"]["document"]["file_id"]
        assert await channel.download_file(file_id, 1024) == CSV
        with pytest.raises(FileUnavailable, match="over the limit of 10"):
            await channel.download_file(file_id, 10)  # refused by its declared size, unread
        tg.fail_next_download(file_id, Fault.truncate())
        with pytest.raises(FileUnavailable, match="download failed"):
            await channel.download_file(file_id, 1024)
        tg.forget_file(file_id)
        with pytest.raises(FileUnavailable, match="no longer has it"):
            await channel.download_file(file_id, 1024)
    assert [d.fault for d in tg.downloads(file_id)][:2] == [None, "truncate"]


def owe_file(path: Path, kind: SentFileKind, reply_to: int | None) -> Outgoing:
    message = NewMessage(chat_id=GROUP_ID, sender_name="[Subagent]", content="[file sent]", is_bot=True, kind="file")
    return Outgoing(
        message=message, text="the chart", reply_to=reply_to, file=OutgoingFile(path=path, name="chart.png", kind=kind)
    )


@pytest.mark.parametrize(
    ("kind", "data", "method"),
    [
        (SentFileKind.PHOTO, png(64, 48), "sendPhoto"),
        (SentFileKind.DOCUMENT, png(64, 48), "sendDocument"),
        # Said to be a photo, refused by Telegram as one: sent again as a document, not lost.
        (SentFileKind.PHOTO, b"\x89PNG\r\n\x1a\nnot really an image", "sendDocument"),
    ],
)
async def test_a_file_owed_to_the_chat_is_sent_once_as_a_reply(
    tmp_path: Path, kind: SentFileKind, data: bytes, method: str
) -> None:
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg)) as app:
        asked = tg.push_message(GROUP_ID, "make a chart")["message"]["message_id"]
        await app.stores.chats.ensure(GROUP_ID, "supergroup", "g")  # as the router does for the message
        path = tmp_path / "out.bin"
        path.write_bytes(data)
        await app.stores.outbox.add(owe_file(path, kind, asked))
        assert await app.delivery.flush(GROUP_ID)
        assert await app.delivery.flush(GROUP_ID)  # nothing left: sent exactly once
        sent = tg.sent_files(GROUP_ID)
    assert len(sent) == 1
    assert (sent[0].method, sent[0].data, sent[0].file_name, sent[0].caption) == (
        method,
        data,
        "chart.png",
        "the chart",
    )
    assert sent[0].reply_to_message_id == asked


async def test_a_file_whose_kept_copy_is_gone_is_given_up_and_the_chat_goes_on(tmp_path: Path) -> None:
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg)) as app:
        tg.add_chat(GROUP_ID)
        await app.stores.chats.ensure(GROUP_ID, "supergroup", "g")
        await app.stores.outbox.add(owe_file(tmp_path / "pruned.png", SentFileKind.PHOTO, None))
        await app.delivery.post(GROUP_ID, "later news", wait=False)
        await tg.wait_for_messages(GROUP_ID, 1)
        errors = await app.stores.outbox.errors()
    assert tg.sent_files(GROUP_ID) == []
    assert [m.plain_text for m in tg.sent_messages(GROUP_ID)] == ["Crew: later news"]
    assert any("the file chart.png is no longer kept" in error for error in errors)
