"""What a transcription counts, with a real store and allowances and a fake service: the length a sender's client
declares is never the last word (a file whose length cannot be read is bounded by its size, and the longest of
what was declared, measured and reported is counted), a call that failed after the upload is counted at what it
held, and a hold is never left behind, whatever the service answers."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.senses.audio_sniff import most_seconds
from bot.senses.stt_client import MAX_REPORTED_SECONDS, SttClient
from bot.senses.transcriber import Job, Transcriber
from bot.senses.window import audio_line
from core.allowances import Allowances
from core.store.chat_files import FileKind, NewFile
from core.store.messages import NewMessage
from core.store.spend import Spend, SpendKind, SpendStore
from core.store.transcripts import Transcript, TranscriptState
from core.stores import Stores
from tests.bot.senses.media import ogg_opus, wav
from tests.bot.senses.mp4_media import mp4_audio
from tests.fakes.stt_server import FakeStt
from tests.harness import make_settings

CHAT = -501
DAILY = 1_000_000


def mp3(size_bytes: int) -> bytes:
    """An ID3-tagged file of this size: audio by its bytes, its length unknown without decoding it."""
    return b"ID3\x03\x00\x00\x00\x00\x00\x00" + b"\x00" * (size_bytes - 10)


class Files:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        return self.data


@dataclass
class Outcome:
    transcript: Transcript
    calls: int
    spend: Spend | None  # the chat's speech row today
    free_again: bool  # the whole allowance can be held again: no hold was left behind
    line: str


async def _transcribe(tmp_path: Path, stt: FakeStt, file: NewFile, data: bytes, **settings_over: Any) -> Outcome:
    settings = make_settings(tmp_path, **{"DAILY_TOKENS": DAILY, **settings_over})
    stores = await Stores.open(settings)
    try:
        await stores.chats.ensure(CHAT, "group", "t")
        row = await stores.messages.add(NewMessage(CHAT, "Alice", "", kind="file", file=file))
        stored = await stores.messages.get(row or 0)
        assert stored is not None and stored.file is not None
        spend = SpendStore(stores.db)
        allowances = Allowances(settings, spend)
        client = SttClient(stt.base_url, "whisper-1", timeout_seconds=0.5)
        transcriber = Transcriber(settings, client, stores.transcripts, Files(data), allowances)

        async def heard(chat_id: int, message_id: int, words: str) -> None:
            pass

        transcriber.accept(Job(CHAT, stored.id, stored.file), heard)
        await transcriber.idle()
        await transcriber.close()
        transcript = (await stores.transcripts.of_files([stored.file.id]))[stored.file.id]
        rows = [r for r in await spend.rows(allowances.today(), CHAT) if r.kind is SpendKind.SPEECH]
        used = (await allowances.status(CHAT)).used
        hold = await allowances.reserve(CHAT, SpendKind.SPEECH, settings.daily_tokens - used)  # refused if one was left
        await allowances.release(hold)
        line = audio_line(stored.file, transcript, True, "a.mp3")
    finally:
        await stores.db.close()
    return Outcome(transcript, len(stt.calls), rows[0].spend if rows else None, True, line)


def _voice(size_bytes: int, declared: int | None, kind: FileKind = FileKind.AUDIO) -> NewFile:
    return NewFile(kind, "a1", "u1", "a.mp3", "audio/mpeg", size_bytes, duration_seconds=declared)


async def test_an_mp3_of_more_bytes_than_the_limit_can_hold_is_refused_whatever_it_declares(tmp_path: Path) -> None:
    data = mp3(400_000)  # at 8 kbit/s, 400 s: over the 300 s limit, though its client says one second
    async with FakeStt() as stt:
        stt.answer("hello", seconds=32_400.0)
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1), data, STT_MAX_SECONDS=300)
    assert outcome.calls == 0 and outcome.spend is None
    assert outcome.transcript.state is TranscriptState.FAILED
    assert outcome.transcript.reason == (
        "its length cannot be read from the file, and its 391 KB may play 6:40, over the limit of 5:00"
    )


async def test_an_audio_document_without_a_length_is_bounded_by_its_size(tmp_path: Path) -> None:
    data = mp3(400_000)
    file = NewFile(FileKind.DOCUMENT, "d1", "u1", "talk.mp3", "audio/mpeg", len(data))  # no duration at all
    async with FakeStt() as stt:
        stt.answer("hello", seconds=3.0)
        outcome = await _transcribe(tmp_path, stt, file, data, STT_MAX_SECONDS=300)
    assert outcome.calls == 0 and outcome.transcript.state is TranscriptState.FAILED


async def test_the_longest_of_declared_measured_and_reported_is_counted(tmp_path: Path) -> None:
    data = mp3(100_000)  # may play 100 s: under the limit, sent
    async with FakeStt() as stt:
        stt.answer("hello", seconds=90.0)  # the service heard 90 s; the client said 1
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1), data)
    assert outcome.calls == 1 and outcome.transcript.audio_seconds == 90.0
    assert outcome.spend is not None and outcome.spend.audio_seconds == 90.0
    assert outcome.free_again


async def test_an_ogg_of_more_bytes_than_its_length_can_hold_is_refused(tmp_path: Path) -> None:
    data = ogg_opus(1.0)
    data = data[:-200] + b"\x00" * 2_000_000 + data[-200:]  # 2 MB "of one second": 4,000 kbit/s, no Opus
    async with FakeStt() as stt:
        stt.answer("hello", seconds=1.0)
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1, FileKind.VOICE), data)
    assert outcome.calls == 0 and outcome.transcript.state is TranscriptState.FAILED
    assert outcome.transcript.reason is not None and "more bytes than" in outcome.transcript.reason


async def test_an_ogg_whose_last_page_claims_40_seconds_is_refused_by_its_packets_length(tmp_path: Path) -> None:
    # 2-byte Opus packets of 120 ms each (TOC 0x1b, count 2): 40 pages play 20 minutes; the last granule says 40 s.
    data = ogg_opus(40.0, packet=b"\x1b\x02", packets_a_page=255, pages=40)
    async with FakeStt() as stt:
        stt.answer("hello", seconds=40.0)
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 40, FileKind.VOICE), data, STT_MAX_SECONDS=300)
    assert outcome.calls == 0 and outcome.spend is None
    assert outcome.transcript.reason == "it is at least 5:06 long, over the limit of 5:00"


async def test_a_wav_declaring_a_huge_byte_rate_is_refused_by_its_samples(tmp_path: Path) -> None:
    data = bytearray(wav(400.0))  # 400 s of 8 kHz 16-bit samples
    struct.pack_into("<I", data, data.find(b"fmt ") + 16, 0xFFFFFFFF)  # a byte rate that says "a moment"
    async with FakeStt() as stt:
        stt.answer("hello", seconds=1.0)
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1), bytes(data), STT_MAX_SECONDS=300)
    assert outcome.calls == 0 and outcome.transcript.reason == "it is 6:40 long, over the limit of 5:00"


async def test_a_webm_is_refused_with_why(tmp_path: Path) -> None:
    data = b"\x1a\x45\xdf\xa3" + b"\x00" * 5_000  # a few KB of WebM could hold hours of laced Opus frames
    async with FakeStt() as stt:
        stt.answer("hello", seconds=1.0)
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1), data)
    assert outcome.calls == 0
    assert outcome.transcript.reason == (
        "the length of WEBM audio cannot be computed from its bytes (send Ogg, WAV, MP3 or M4A)"
    )


def _video_note(size_bytes: int, declared: int) -> NewFile:
    return NewFile(FileKind.VIDEO_NOTE, "v1", "u1", "note.mp4", "video/mp4", size_bytes, duration_seconds=declared)


async def test_a_video_note_is_transcribed_and_counted_at_its_measured_length(tmp_path: Path) -> None:
    data = mp4_audio(750, 16_000)  # H.264 beside 750 AAC frames at 16 kHz: 48 s, though its client says 10
    async with FakeStt() as stt:
        stt.answer("hello")  # the service says no length: the measured one is counted
        outcome = await _transcribe(tmp_path, stt, _video_note(len(data), 10), data)
    assert outcome.calls == 1 and outcome.transcript.state is TranscriptState.DONE
    assert outcome.spend is not None and outcome.spend.audio_seconds == pytest.approx(48.0) and outcome.free_again


async def test_an_mp4_whose_header_says_10_seconds_over_100000_frames_is_refused(tmp_path: Path) -> None:
    data = mp4_audio(100_000, 48_000, declared_ticks=480_000)  # mdhd and stts: 10 s; its frames: 35:33
    async with FakeStt() as stt:
        stt.answer("hello", seconds=10.0)
        outcome = await _transcribe(tmp_path, stt, _video_note(len(data), 10), data, STT_MAX_SECONDS=300)
    assert outcome.calls == 0 and outcome.spend is None
    assert outcome.transcript.reason == "it is 35:33 long, over the limit of 5:00"


async def test_an_mp4_without_an_audio_track_is_refused_with_why(tmp_path: Path) -> None:
    data = mp4_audio(130).replace(b"soun", b"text")
    async with FakeStt() as stt:
        outcome = await _transcribe(tmp_path, stt, _video_note(len(data), 3), data)
    assert outcome.calls == 0 and outcome.transcript.reason == "its MP4 has no audio tracks, where one is transcribed"


async def test_a_call_that_times_out_after_the_upload_is_counted_at_what_it_held(tmp_path: Path) -> None:
    data = ogg_opus(3.0)
    async with FakeStt() as stt:
        stt.hang()
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 3, FileKind.VOICE), data)
    assert outcome.transcript.state is TranscriptState.FAILED
    assert outcome.spend is not None and outcome.spend.audio_seconds == 3.0 and outcome.spend.estimated_calls == 1
    assert outcome.spend.tokens > 0 and outcome.free_again


async def test_a_refused_key_counts_nothing_and_leaves_no_hold(tmp_path: Path) -> None:
    data = ogg_opus(3.0)
    async with FakeStt() as stt:
        stt.reject_key()
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 3, FileKind.VOICE), data)
    assert outcome.spend is None and outcome.free_again
    assert outcome.line == "[voice 0:03, f1] (not transcribed: the speech-to-text service answered 401 (Unauthorized))"


@pytest.mark.parametrize("duration", [b"1e400", b"90000"])
async def test_a_reported_duration_over_a_day_counts_a_day_and_keeps_no_words(tmp_path: Path, duration: bytes) -> None:
    data = ogg_opus(3.0)
    async with FakeStt() as stt:
        stt.raw(b'{"text": "hello", "duration": ' + duration + b"}")
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 3, FileKind.VOICE), data, DAILY_TOKENS=100_000_000)
    assert outcome.transcript.state is TranscriptState.FAILED
    assert outcome.transcript.reason == "the speech-to-text service said it is over 24:00:00 long"
    assert outcome.spend is not None and outcome.spend.audio_seconds == MAX_REPORTED_SECONDS and outcome.free_again


async def test_with_neither_the_file_nor_the_service_saying_the_size_bound_is_counted(tmp_path: Path) -> None:
    data = mp3(100_000)  # may play 100 s; the client says 1, the service says nothing
    async with FakeStt() as stt:
        stt.answer("hello")
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1), data)
    assert outcome.transcript.state is TranscriptState.DONE
    assert outcome.spend is not None and outcome.spend.audio_seconds == most_seconds("mp3", len(data)) == 100.0
