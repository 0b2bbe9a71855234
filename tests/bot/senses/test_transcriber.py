"""The transcriber with a real store and a fake service: a service that hangs ends the call at its time limit
with a reason stored, the turn is told either way, a message is transcribed once, and a restart marks what was
cut short as failed instead of retrying it."""

from __future__ import annotations

from pathlib import Path

from bot.senses.stt_client import SttClient
from bot.senses.transcriber import BUSY_REASON, MAX_CONCURRENT_TRANSCRIPTIONS, MAX_PENDING_PER_CHAT, Job, Transcriber
from core.allowances import Allowances
from core.store.chat_files import FileKind, NewFile
from core.store.messages import NewMessage
from core.store.spend import SpendStore
from core.store.transcripts import INTERRUPTED_REASON, TranscriptState
from core.stores import Stores
from tests.bot.senses.media import ogg_opus
from tests.fakes.stt_server import FakeStt
from tests.harness import make_settings

CHAT = -501


class Files:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.downloads = 0

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        self.downloads += 1
        return self.data


async def test_a_hanging_service_fails_at_the_limit_and_the_turn_is_told(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    stores = await Stores.open(settings)
    told: list[tuple[int, int, str]] = []

    async def heard(chat_id: int, message_id: int, words: str) -> None:
        told.append((chat_id, message_id, words))

    try:
        await stores.chats.ensure(CHAT, "group", "t")
        voice = NewFile(FileKind.VOICE, "v1", "u1", "voice.ogg", "audio/ogg", 100, duration_seconds=3)
        row = await stores.messages.add(NewMessage(CHAT, "Alice", "", kind="file", file=voice))
        assert row is not None
        stored = await stores.messages.get(row)
        assert stored is not None and stored.file is not None
        files = Files(ogg_opus(3.0))
        async with FakeStt() as stt:
            stt.hang()
            client = SttClient(stt.base_url, "whisper-1", timeout_seconds=0.5)
            transcriber = Transcriber(
                settings, client, stores.transcripts, files, Allowances(settings, SpendStore(stores.db))
            )
            transcriber.accept(Job(CHAT, row, stored.file), heard)
            transcriber.accept(Job(CHAT, row, stored.file), heard)  # a redelivery: not transcribed twice
            await transcriber.idle()
            await transcriber.close()
        found = (await stores.transcripts.of_files([stored.file.id]))[stored.file.id]
    finally:
        await stores.db.close()
    assert (found.state, found.reason) == (
        TranscriptState.FAILED,
        "the speech-to-text service did not answer within 0.5 s",
    )
    assert told == [(CHAT, row, "")] and files.downloads == 1


async def test_a_restart_marks_a_cut_short_transcription_failed(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    stores = await Stores.open(settings)
    try:
        await stores.chats.ensure(CHAT, "group", "t")
        voice = NewFile(FileKind.VOICE, "v1", "u1", "voice.ogg", "audio/ogg", 100, duration_seconds=3)
        row = await stores.messages.add(NewMessage(CHAT, "Alice", "", kind="file", file=voice))
        stored = await stores.messages.get(row or 0)
        assert stored is not None and stored.file is not None
        assert await stores.transcripts.begin(stored.file.id, CHAT)
        assert await stores.transcripts.close_interrupted() == 1
        found = (await stores.transcripts.of_files([stored.file.id]))[stored.file.id]
        assert not await stores.transcripts.begin(stored.file.id, CHAT)  # never tried again
    finally:
        await stores.db.close()
    assert (found.state, found.reason) == (TranscriptState.FAILED, INTERRUPTED_REASON)


async def test_a_flood_of_voice_notes_is_transcribed_two_at_a_time(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    stores = await Stores.open(settings)
    told: list[int] = []

    async def heard(chat_id: int, message_id: int, words: str) -> None:
        told.append(message_id)

    try:
        await stores.chats.ensure(CHAT, "group", "t")
        async with FakeStt() as stt:
            stt.answer("hi", seconds=1.0, delay_seconds=0.1)
            transcriber = Transcriber(
                settings, SttClient(stt.base_url, "whisper-1"), stores.transcripts, Files(ogg_opus(1.0)), None
            )
            for n in range(8):
                voice = NewFile(FileKind.VOICE, f"v{n}", f"u{n}", "voice.ogg", "audio/ogg", 100, duration_seconds=1)
                row = await stores.messages.add(NewMessage(CHAT, "Alice", "", kind="file", file=voice))
                stored = await stores.messages.get(row or 0)
                assert stored is not None and stored.file is not None
                transcriber.accept(Job(CHAT, stored.id, stored.file), heard)
            await transcriber.idle()
            await transcriber.close()
            most = stt.most_active
    finally:
        await stores.db.close()
    assert len(told) == 8 and most == MAX_CONCURRENT_TRANSCRIPTIONS


async def test_past_its_bound_a_chats_flood_is_refused_with_a_reason_and_another_chat_is_not(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    stores = await Stores.open(settings)
    other = CHAT - 1
    told: list[tuple[int, int]] = []

    async def heard(chat_id: int, message_id: int, words: str) -> None:
        told.append((chat_id, message_id))

    try:
        await stores.chats.ensure(CHAT, "group", "t")
        await stores.chats.ensure(other, "group", "u")
        async with FakeStt() as stt:
            stt.answer("hi", seconds=1.0)
            transcriber = Transcriber(
                settings, SttClient(stt.base_url, "whisper-1"), stores.transcripts, Files(ogg_opus(1.0)), None
            )
            jobs = []
            for n, chat in enumerate([CHAT] * (MAX_PENDING_PER_CHAT + 2) + [other]):
                voice = NewFile(FileKind.VOICE, f"v{n}", f"u{n}", "voice.ogg", "audio/ogg", 100, duration_seconds=1)
                row = await stores.messages.add(NewMessage(chat, "Alice", "", kind="file", file=voice))
                stored = await stores.messages.get(row or 0)
                assert stored is not None and stored.file is not None
                jobs.append(Job(chat, stored.id, stored.file))
            for job in jobs:  # all at once, as a flood arrives: nothing has ended yet
                transcriber.accept(job, heard)
            await transcriber.idle()
            await transcriber.close()
            calls = len(stt.calls)
        files = [job.file for job in jobs]
        found = await stores.transcripts.of_files(f.id for f in files)
    finally:
        await stores.db.close()
    states = [(found[f.id].state, found[f.id].reason) for f in files]
    assert states[:MAX_PENDING_PER_CHAT] == [(TranscriptState.DONE, None)] * MAX_PENDING_PER_CHAT
    assert states[MAX_PENDING_PER_CHAT:-1] == [(TranscriptState.FAILED, BUSY_REASON)] * 2
    assert states[-1] == (TranscriptState.DONE, None)  # the other chat's note is transcribed
    assert calls == MAX_PENDING_PER_CHAT + 1 and len(told) == len(files)  # every turn is told


async def test_a_flood_spread_over_a_forums_topics_is_one_chats_flood(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    stores = await Stores.open(settings)

    async def heard(chat_id: int, message_id: int, words: str) -> None:
        pass

    try:
        await stores.chats.ensure(CHAT, "supergroup", "forum")
        jobs = []
        for n in range(MAX_PENDING_PER_CHAT + 2):  # one note in each of 12 topics of one group
            topic = await stores.chats.resolve(CHAT, 100 + n, "supergroup", f"topic {n}")
            voice = NewFile(FileKind.VOICE, f"v{n}", f"u{n}", "voice.ogg", "audio/ogg", 100, duration_seconds=1)
            row = await stores.messages.add(NewMessage(topic, "Alice", "", kind="file", file=voice))
            stored = await stores.messages.get(row or 0)
            assert stored is not None and stored.file is not None and topic != CHAT
            jobs.append(Job(topic, stored.id, stored.file, platform_chat_id=CHAT))
        async with FakeStt() as stt:
            stt.answer("hi", seconds=1.0)
            transcriber = Transcriber(
                settings, SttClient(stt.base_url, "whisper-1"), stores.transcripts, Files(ogg_opus(1.0)), None
            )
            for job in jobs:
                transcriber.accept(job, heard)
            await transcriber.idle()
            await transcriber.close()
        found = await stores.transcripts.of_files(job.file.id for job in jobs)
    finally:
        await stores.db.close()
    refused = [job for job in jobs if found[job.file.id].reason == BUSY_REASON]
    assert len(refused) == 2
