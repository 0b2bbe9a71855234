"""Files through the fake Bot API, both ways, driven by the real python-telegram-bot."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from PIL import Image
from telegram import Bot, Message, ReplyParameters, Update
from telegram.constants import ParseMode
from telegram.error import BadRequest, InvalidToken, NetworkError, RetryAfter

from tests.fakes.telegram_server import FakeTelegram, Fault

GROUP = -1_001_555_000_222  # a supergroup id
FORUM = -1_001_555_000_333
TOPIC = 7
DOCUMENT = b"name,score\nalice,3\n" * 500


def bot_for(tg: FakeTelegram) -> Bot:
    return Bot(tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url)


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 60)).save(out, "PNG")
    return out.getvalue()


def posted_document(tg: FakeTelegram) -> str:
    """A member posts DOCUMENT to GROUP; its file_id."""
    return str(tg.push_media_message(GROUP, "document", DOCUMENT, file_name="a.csv")["message"]["document"]["file_id"])


def message_of(update: dict[str, object], bot: Bot) -> Message:
    parsed = Update.de_json(update, bot)
    assert parsed is not None and parsed.message is not None
    return parsed.message


async def test_a_posted_document_downloads_byte_identical(tmp_path: Path) -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        update = tg.push_media_message(
            GROUP, "document", DOCUMENT, file_name="scores.csv", mime_type="text/csv", caption="for @crew_test_bot"
        )
        raw = update["message"]["document"]
        assert set(raw) == {"file_id", "file_unique_id", "file_name", "mime_type", "file_size"}
        message = message_of(update, bot)
        assert message.document is not None and message.caption == "for @crew_test_bot"
        assert (message.document.file_name, message.document.mime_type) == ("scores.csv", "text/csv")
        assert message.document.file_size == len(DOCUMENT)
        assert [(e.type, e.offset, e.length) for e in message.caption_entities] == [("mention", 4, 14)]

        assert tg.base_file_url == tg.base_url.replace("/bot", "/file/bot")  # how crewbot derives it
        assert bot.base_file_url == f"{tg.base_file_url}{tg.token}"
        file = await bot.get_file(message.document.file_id)

        assert file.file_size == len(DOCUMENT) and file.file_unique_id == message.document.file_unique_id
        assert file.file_path == f"{tg.base_file_url}{tg.token}/documents/file_1.csv"
        assert await file.download_as_bytearray() == DOCUMENT
        assert (await file.download_to_drive(tmp_path / "scores.csv")).read_bytes() == DOCUMENT
        assert [(d.file_id, d.fault) for d in tg.downloads()] == [(message.document.file_id, None)] * 2

        again = tg.push_media_message(GROUP, "document", DOCUMENT, file_name="copy.csv")["message"]["document"]
        assert again["file_unique_id"] == raw["file_unique_id"] and again["file_id"] != raw["file_id"]
        other = tg.push_media_message(GROUP, "document", b"other", file_name="o.bin")["message"]["document"]
        assert other["file_unique_id"] != raw["file_unique_id"]
        assert other["mime_type"] == "application/octet-stream"


async def test_a_posted_photo_comes_in_sizes() -> None:
    photo = png(1000, 500)
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        update = tg.push_media_message(GROUP, "photo", photo, caption="look")
        message = message_of(update, bot)

        assert [(p.width, p.height) for p in message.photo] == [(90, 45), (320, 160), (800, 400), (1000, 500)]
        assert set(update["message"]["photo"][0]) == {"file_id", "file_unique_id", "file_size", "width", "height"}
        assert message.caption == "look"
        largest = await bot.get_file(message.photo[-1])
        assert largest.file_path is not None and largest.file_path.endswith(".png")
        assert await largest.download_as_bytearray() == photo
        smallest = await (await bot.get_file(message.photo[0])).download_as_bytearray()
        with Image.open(io.BytesIO(smallest)) as thumbnail:
            assert (thumbnail.format, thumbnail.size) == ("JPEG", (90, 45))
        assert message.photo[0].file_size == len(smallest)
        with pytest.raises(ValueError, match="IMAGE_PROCESS_FAILED"):
            tg.push_media_message(GROUP, "photo", b"not an image")


async def test_audio_voice_video_and_animation_are_shaped_as_the_bot_api_does() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        audio = tg.push_media_message(
            GROUP, "audio", b"ID3 song", file_name="song.mp3", details={"duration": 180, "title": "Song"}
        )
        voice = tg.push_media_message(GROUP, "voice", b"OggS voice", details={"duration": 4})
        video = tg.push_media_message(GROUP, "video", b"mp4 video", file_name="clip.mp4", caption="clip")
        animation = tg.push_media_message(GROUP, "animation", b"mp4 gif", file_name="cat.gif.mp4")

        assert set(voice["message"]["voice"]) == {"file_id", "file_unique_id", "duration", "mime_type", "file_size"}
        parsed = [message_of(u, bot) for u in (audio, voice, video, animation)]
        assert audio["message"]["audio"]["duration"] == 180  # raw: PTB's duration type is changing
        assert parsed[0].audio is not None and (parsed[0].audio.title, parsed[0].audio.mime_type) == (
            "Song",
            "audio/mpeg",
        )
        assert parsed[1].voice is not None and parsed[1].voice.mime_type == "audio/ogg"
        assert parsed[2].video is not None and (parsed[2].video.width, parsed[2].video.height) == (640, 360)
        assert parsed[2].caption == "clip"
        assert parsed[3].animation is not None and parsed[3].document is not None
        assert parsed[3].document.file_id == parsed[3].animation.file_id
        voice_file = await bot.get_file(parsed[1].voice.file_id)
        assert voice_file.file_path is not None and voice_file.file_path.endswith(".oga")
        assert await voice_file.download_as_bytearray() == b"OggS voice"
        with pytest.raises(ValueError, match="no file name"):
            tg.push_media_message(GROUP, "voice", b"x", file_name="v.ogg")


async def test_forgotten_and_unknown_file_ids_are_invalid() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        file_id = posted_document(tg)
        file = await bot.get_file(file_id)
        tg.forget_file(file_id)

        with pytest.raises(BadRequest, match="Invalid file_id"):
            await bot.get_file(file_id)
        with pytest.raises(BadRequest, match="Invalid file_id"):
            await bot.get_file("AgADnothing")
        with pytest.raises(InvalidToken, match="Not Found"):  # PTB's reading of a 404
            await file.download_as_bytearray()  # the link it had is gone too
        with pytest.raises(BadRequest, match="Wrong file identifier"):
            await bot.send_document(GROUP, file_id)
        assert tg.file_bytes(file_id) == DOCUMENT


async def test_a_download_failing_midway_raises_in_ptb() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        file_id = posted_document(tg)
        file = await bot.get_file(file_id)
        tg.fail_next_download(file_id, Fault.truncate(100))

        with pytest.raises(NetworkError, match=r"received 100 bytes, expected 9500"):
            await file.download_as_bytearray()
        assert await file.download_as_bytearray() == DOCUMENT  # the next one is whole
        tg.fail_next_download(file_id, Fault.server_error())
        with pytest.raises(NetworkError):
            await file.download_as_bytearray()
        assert [d.fault for d in tg.downloads(file_id)] == ["truncate", None, "error"]
        with pytest.raises(ValueError, match="no file"):
            tg.fail_next_download("AgADnothing", Fault.truncate())


async def test_send_document_is_recorded_with_caption_reply_and_topic() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        tg.add_chat(FORUM)
        tg.update_chat(FORUM, is_forum=True)
        asked = tg.push_message(FORUM, "the report please", thread_id=TOPIC)["message"]["message_id"]

        sent = await bot.send_document(
            FORUM,
            DOCUMENT,
            filename="report.csv",
            caption="<b>Report</b> for you",
            parse_mode=ParseMode.HTML,
            reply_parameters=ReplyParameters(message_id=asked),
            message_thread_id=TOPIC,
        )

        assert sent.document is not None and sent.document.file_name == "report.csv"
        assert (sent.caption, sent.caption_entities[0].type) == ("Report for you", "bold")
        assert sent.reply_to_message is not None and sent.reply_to_message.message_id == asked
        assert sent.message_thread_id == TOPIC
        [record] = await tg.wait_for_files(FORUM, 1)
        assert (record.method, record.data, record.file_name, record.mime_type) == (
            "sendDocument",
            DOCUMENT,
            "report.csv",
            "text/csv",
        )
        assert (record.caption, record.plain_caption, record.parse_mode) == (
            "<b>Report</b> for you",
            "Report for you",
            "HTML",
        )
        assert (record.reply_to_message_id, record.thread_id, record.message_id) == (asked, TOPIC, sent.message_id)
        assert tg.sent_messages() == []  # files are kept apart from sendMessage's records
        assert await (await bot.get_file(sent.document)).download_as_bytearray() == DOCUMENT
        again = await bot.send_document(GROUP, sent.document.file_id)  # a known file_id sent again
        assert again.document is not None and again.document.file_unique_id == sent.document.file_unique_id
        assert tg.sent_files(GROUP)[0].data == DOCUMENT


async def test_send_photo_takes_images_only() -> None:
    photo = png(400, 300)
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        sent = await bot.send_photo(GROUP, photo, caption="chart")

        assert [(p.width, p.height) for p in sent.photo] == [(90, 68), (320, 240), (400, 300)]
        assert sent.caption == "chart"
        [record] = tg.sent_files(GROUP)
        assert (record.method, record.data, record.file_id) == ("sendPhoto", photo, sent.photo[-1].file_id)
        with pytest.raises(BadRequest, match=r"(?i)image_process_failed"):
            await bot.send_photo(GROUP, b"%PDF-1.7 not an image", filename="chart.png")
        with pytest.raises(BadRequest, match=r"(?i)photo_invalid_dimensions"):
            await bot.send_photo(GROUP, png(2000, 50))
        with pytest.raises(BadRequest, match="Type of file mismatch"):
            await bot.send_document(GROUP, sent.photo[-1].file_id)
        with pytest.raises(BadRequest, match="File must be non-empty"):
            await bot.send_document(GROUP, b"", filename="empty.txt")
        assert len(tg.sent_files()) == 1  # refusals are not recorded
        fallback = await bot.send_document(GROUP, b"%PDF-1.7 not an image", filename="chart.pdf")
        assert fallback.document is not None and fallback.document.mime_type == "application/pdf"


async def test_faults_and_holds_apply_to_file_methods() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        tg.fail_next("sendDocument", Fault.retry_after(2))
        with pytest.raises(RetryAfter):
            await bot.send_document(GROUP, DOCUMENT, filename="a.csv")
        tg.fail_next("getFile", Fault.disconnect())
        with pytest.raises(NetworkError):
            await bot.get_file("whatever")
        tg.fail_next("sendDocument", Fault.truncate())
        with pytest.raises(NetworkError):
            await bot.send_document(GROUP, DOCUMENT, filename="a.csv")
        assert len(tg.sent_files(GROUP)) == 1  # Telegram sent it; only the answer was lost
        big = bytes(range(256)) * 12_289  # over 3 MiB: aiohttp's default body limit is 1 MiB
        assert (await bot.send_document(GROUP, big, filename="big.bin")).document is not None
        assert tg.sent_files(GROUP)[-1].data == big

        tg.holds.hold("sendPhoto", GROUP)
        held = asyncio.create_task(bot.send_photo(GROUP, png(10, 10)))
        await tg.wait_until(lambda: True if tg.holds.waiting("sendPhoto", GROUP) else None)
        assert not held.done()
        tg.holds.release("sendPhoto", GROUP)
        assert (await held).photo
        assert [f.method for f in tg.sent_files(GROUP)] == ["sendDocument", "sendDocument", "sendPhoto"]
