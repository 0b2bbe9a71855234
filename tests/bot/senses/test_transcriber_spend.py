"""What a transcription counts, with a real store and allowances and a fake service: the length a sender's client
declares is never the last word (a file whose length cannot be read is bounded by its size, and the longest of
what was declared, measured and reported is counted), a call that failed after the upload is counted at what it
held, and a hold is never left behind, whatever the service answers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.senses.audio_sniff import most_seconds
from bot.senses.stt_client import SttClient
from bot.senses.transcriber import Job, Transcriber
from bot.senses.window import audio_line
from core.allowances import Allowances
from core.store.chat_files import FileKind, NewFile
from core.store.messages import NewMessage
from core.store.spend import Spend, SpendKind, SpendStore
from core.store.transcripts import Transcript, TranscriptState
from core.stores import Stores
from tests.bot.senses.media import ogg_opus
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
    settings = make_settings(tmp_path, DAILY_TOKENS=DAILY, **settings_over)
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
        hold = await allowances.reserve(CHAT, SpendKind.SPEECH, DAILY - used)  # refused if a hold was left
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


async def test_an_ogg_whose_last_page_claims_too_little_for_its_size_is_bounded_by_its_size(tmp_path: Path) -> None:
    data = ogg_opus(1.0)
    data = data[:-200] + b"\x00" * 2_000_000 + data[-200:]  # 2 MB "of one second": 4,000 kbit/s, no Opus
    assert most_seconds("ogg", len(data)) > 300
    async with FakeStt() as stt:
        stt.answer("hello", seconds=1.0)
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1, FileKind.VOICE), data)
    assert outcome.calls == 0 and outcome.transcript.state is TranscriptState.FAILED


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


async def test_an_infinite_duration_counts_what_was_measured_and_breaks_nothing(tmp_path: Path) -> None:
    data = ogg_opus(3.0)
    async with FakeStt() as stt:
        stt.raw(b'{"text": "hello", "duration": 1e400}')
        outcome = await _transcribe(
            tmp_path,
            stt,
            _voice(len(data), 3, FileKind.VOICE),
            data,
            STT_PRICE_PER_MINUTE=0.006,
            LLM_PRICE_INPUT_PER_MTOK=2.5,
        )
    assert outcome.transcript.state is TranscriptState.DONE and outcome.transcript.audio_seconds == 3.0
    assert outcome.spend is not None and outcome.spend.audio_seconds == 3.0 and outcome.free_again
    assert outcome.line == '[voice 0:03, f1] "hello"'


async def test_with_neither_the_file_nor_the_service_saying_the_size_bound_is_counted(tmp_path: Path) -> None:
    data = mp3(100_000)  # may play 100 s; the client says 1, the service says nothing
    async with FakeStt() as stt:
        stt.answer("hello")
        outcome = await _transcribe(tmp_path, stt, _voice(len(data), 1), data)
    assert outcome.transcript.state is TranscriptState.DONE
    assert outcome.spend is not None and outcome.spend.audio_seconds == most_seconds("mp3", len(data)) == 100.0
