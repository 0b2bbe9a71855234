"""Voice notes, audio files and video notes turned to text once, when they arrive, in the background: the
message is stored first (the inbound path never waits on the service), then the file is checked (its length
against STT_MAX_SECONDS, that it is audio at all), its spend held in the allowances, sent to the service
(bot/senses/stt_client.py) and the words stored with the message (core/store/transcripts.py). A failure
leaves the reason in their place; nothing is retried, not even after a restart. When it is done, `heard` is
told (the router then starts the turn a voice reply to the bot or a "Crew, …" asks for).

Spend: the audio's seconds (the longest of declared, measured and reported; a report over a day as a day, its
words then not kept) are counted as kind `speech`, with
what they cost (STT_PRICE_PER_MINUTE) as the main model's input tokens that money buys (LLM_PRICE_INPUT_PER_MTOK);
with no prices set, as the transcript's own size, a token a byte, as the LLM calls count text they cannot measure.
A call that failed after the upload may be billed: it is counted at what it held.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.senses.audio_sniff import audio_format, measure_audio, most_seconds
from bot.senses.ogg_length import LengthRefused
from bot.senses.seen_images import FileDownloader
from bot.senses.stt_client import SttClient, SttError
from bot.senses.take_turns import TakeTurns
from bot.senses.window import clock
from core.allowances import Allowances, AllowanceSpent, Reservation
from core.logging import get_logger
from core.settings import Settings
from core.store.chat_files import ChatFile, FileUnavailable, size_text
from core.store.spend import SpendKind
from core.store.transcripts import TranscriptStore

log = get_logger(__name__)

# A file's bytes are read up to this: OpenAI's upload limit, and ~4 h of a 12 kbit/s voice note.
MAX_AUDIO_BYTES = 25 * 1024 * 1024
BYTES_PER_SPOKEN_SECOND = 40  # transcript bytes a second of speech may need (fast speech, 2-byte scripts)
SECONDS_PER_MINUTE = 60.0
TOKENS_PER_MTOK = 1_000_000
HEAD_BYTES = 64
# Transcriptions at once, all chats together: each holds its file's bytes (up to MAX_AUDIO_BYTES) and a call;
# a flood of voice notes waits its turn instead of holding gigabytes. Chats take the slots in turn
# (bot/senses/take_turns.py): one chat's flood delays its own notes, not another chat's.
MAX_CONCURRENT_TRANSCRIPTIONS = 2
# Transcriptions of one chat waiting or running at once: past it a note is not transcribed, and its line says why.
MAX_PENDING_PER_CHAT = 10
BUSY_REASON = f"{MAX_PENDING_PER_CHAT} voice notes of this chat were already waiting to be transcribed"

Heard = Callable[[int, int, str], Awaitable[None]]  # (chat id, message row id, the words; "" when none)


@dataclass(frozen=True, slots=True)
class Job:
    chat_id: int  # the conversation (a forum topic has its own)
    message_id: int  # the stored message's row id
    file: ChatFile
    platform_chat_id: int | None = None  # the platform's chat, when not `chat_id` (a forum topic's group)

    @property
    def group(self) -> int:
        """Whose bound and turn in the slots it counts against: the platform's chat, so a forum's topics share
        one (a flood spread over its topics is still one chat's flood)."""
        return self.chat_id if self.platform_chat_id is None else self.platform_chat_id


class Transcriber:
    def __init__(
        self,
        settings: Settings,
        client: SttClient,
        transcripts: TranscriptStore,
        downloader: FileDownloader,
        allowances: Allowances | None,
    ) -> None:
        self._settings = settings  # read at each job: prices and allowances change on the running bot
        self._client = client
        self._transcripts = transcripts
        self._downloader = downloader
        self._allowances = allowances
        self._jobs: set[asyncio.Task[None]] = set()
        self._slots = TakeTurns(MAX_CONCURRENT_TRANSCRIPTIONS)
        self._pending: dict[int, int] = {}  # per platform chat: accepted, not yet ended
        self._closing = False

    def accept(self, job: Job, heard: Heard) -> None:
        """Transcribe in the background; `heard` is called when it is done, whether or not words came."""
        if self._closing:
            return
        pending = self._pending.get(job.group, 0)
        if pending >= MAX_PENDING_PER_CHAT:
            run = self._refuse(job, heard, BUSY_REASON)
        else:
            self._pending[job.group] = pending + 1
            run = self._run(job, heard)
        task = asyncio.create_task(run, name=f"transcribe-{job.file.ref}")
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def idle(self) -> None:
        """Until every transcription started so far has ended (tests, shutdown)."""
        while self._jobs:
            await asyncio.gather(*list(self._jobs), return_exceptions=True)

    async def close(self) -> None:
        self._closing = True
        for task in list(self._jobs):
            task.cancel()
        await asyncio.gather(*list(self._jobs), return_exceptions=True)
        await self._client.close()

    async def _refuse(self, job: Job, heard: Heard, reason: str) -> None:
        if not await self._transcripts.begin(job.file.id, job.chat_id):
            return
        log.info("transcription_refused", file=job.file.ref, chat_id=job.chat_id, reason=reason)
        await self._transcripts.failed(job.file.id, reason)
        await self._told(job, heard, "")

    async def _run(self, job: Job, heard: Heard) -> None:
        try:
            await self._run_one(job, heard)
        finally:
            left = self._pending.get(job.group, 1) - 1
            if left > 0:
                self._pending[job.group] = left
            else:
                self._pending.pop(job.group, None)

    async def _run_one(self, job: Job, heard: Heard) -> None:
        if not await self._transcripts.begin(job.file.id, job.chat_id):
            return  # transcribed (or tried) before: a redelivered message
        words = ""
        try:
            async with self._slots.slot(job.group):
                words = await self._transcribe(job)
        except _NotHeard as exc:
            log.info("transcription_failed", file=job.file.ref, chat_id=job.chat_id, reason=exc.reason)
            await self._transcripts.failed(job.file.id, exc.reason, exc.seconds)
        except Exception as exc:  # a bug must not leave it pending for ever
            log.exception("transcription_crashed", file=job.file.ref)
            await self._transcripts.failed(job.file.id, f"it could not be transcribed ({type(exc).__name__})")
        await self._told(job, heard, words)

    @staticmethod
    async def _told(job: Job, heard: Heard, words: str) -> None:
        try:
            await heard(job.chat_id, job.message_id, words)
        except Exception:
            log.exception("transcription_heard_failed", file=job.file.ref)

    async def _transcribe(self, job: Job) -> str:
        file, limit = job.file, self._settings.stt_max_seconds
        declared = file.duration_seconds
        if declared is not None and declared > limit:
            raise _NotHeard(f"it is {clock(declared)} long, over the limit of {clock(limit)}")
        if file.size_bytes is not None and file.size_bytes > MAX_AUDIO_BYTES:
            raise _NotHeard(
                f"it has {size_text(file.size_bytes)}, over the {size_text(MAX_AUDIO_BYTES)} sent to be transcribed"
            )
        try:
            data = await self._downloader.download_file(file.file_id, MAX_AUDIO_BYTES)
        except FileUnavailable as exc:
            raise _NotHeard(f"it could not be downloaded: {exc}") from None
        kind = audio_format(data[:HEAD_BYTES])
        if kind is None:
            raise _NotHeard("it is not audio (no known audio format in its bytes)")
        # The sender's client says a length it may lie about, and so may the file's header: the length is
        # computed from the file's own bytes (Ogg's packets, WAV's samples, an MP4's audio sample table), an MP3's
        # bounded by its size, and any other format refused. An Ogg's walk stops just past the limit: a file far
        # over it costs no more (an MP4's table is read whole: its boxes are few, its time table bounded).
        try:
            measured = await asyncio.to_thread(measure_audio, data, limit)
        except LengthRefused as exc:
            raise _NotHeard(str(exc)) from None
        if measured is None:
            bound = max(float(declared or 0), most_seconds(kind, len(data)))
            if bound > limit:
                raise _NotHeard(
                    f"its length cannot be read from the file, and its {size_text(len(data))} may play "
                    f"{clock(bound)}, over the limit of {clock(limit)}"
                )
        else:
            bound = max(float(declared or 0), measured.seconds)
            if bound > limit:
                least = "" if measured.complete else "at least "
                raise _NotHeard(f"it is {least}{clock(bound)} long, over the limit of {clock(limit)}", bound)
        measured_seconds = measured.seconds if measured is not None else None
        held = None
        if self._allowances is not None:
            try:
                held = await self._allowances.reserve(job.chat_id, SpendKind.SPEECH, self._estimate(bound))
            except AllowanceSpent as exc:
                raise _NotHeard(str(exc), measured_seconds) from None
        counted = False
        try:
            try:
                result = await self._client.transcribe(
                    data, _upload_name(file, kind), file.mime_type or f"audio/{kind}"
                )
            except SttError as exc:
                if exc.billed and held is not None:  # the audio went up: it may be billed whatever came back
                    counted = True
                    await asyncio.shield(self._count(held, bound, self._estimate(bound), estimated=True))
                raise _NotHeard(str(exc), measured_seconds) from None
            except BaseException:  # cancelled (shut down) mid-call, or a bug: the audio may have gone up
                if held is not None:
                    counted = True
                    await asyncio.shield(self._count(held, bound, self._estimate(bound), estimated=True))
                raise
            # The longest of what was said, measured, and reported: a lie in any one of them counts no less. With
            # neither the file nor the service saying, the client's word alone is not taken: its size's bound is.
            heard_seconds = max(float(declared or 0), measured_seconds or 0.0, result.seconds or 0.0)
            spent = bound if measured is None and result.seconds is None else heard_seconds
            if held is not None:
                counted = True
                await self._count(held, spent, len(result.text.encode()), estimated=False)
        finally:
            if held is not None and not counted and self._allowances is not None:
                await asyncio.shield(self._allowances.release(held))
        if result.over_a_day:  # counted at the most a call counts (above); words of such a file are not kept
            raise _NotHeard(f"the speech-to-text service said it is over {clock(spent)} long", spent)
        await self._transcripts.done(file.id, result.text, heard_seconds)  # shown as its length: the best word
        log.info("transcribed", file=file.ref, chat_id=job.chat_id, audio_seconds=spent, chars=len(result.text))
        return result.text

    async def _count(self, held: Reservation, seconds: float, unpriced: int, *, estimated: bool) -> None:
        """Count the call, its hold released whatever happens here: the audio's price, or with no prices set
        `unpriced` (the words' size, a token a byte; the estimate when the call failed)."""
        assert self._allowances is not None
        try:
            priced = self._price_tokens(seconds)
            tokens = priced if priced is not None else unpriced
            await self._allowances.settle(held, tokens, 0, estimated=estimated, audio_seconds=seconds)
        except BaseException:
            await asyncio.shield(self._allowances.release(held))
            raise

    def _price_tokens(self, seconds: float) -> int | None:
        """The tokens the audio's price buys of the main model's input; None when no prices are set."""
        per_minute, per_mtok = self._settings.stt_price_per_minute, self._settings.llm_price_input_per_mtok
        if per_minute <= 0 or per_mtok <= 0:
            return None
        return math.ceil(seconds / SECONDS_PER_MINUTE * per_minute / per_mtok * TOKENS_PER_MTOK)

    def _estimate(self, seconds: float) -> int:
        priced = self._price_tokens(seconds)
        return priced if priced is not None else math.ceil(seconds * BYTES_PER_SPOKEN_SECOND)


class _NotHeard(Exception):
    def __init__(self, reason: str, seconds: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.seconds = seconds


def _upload_name(file: ChatFile, kind: str) -> str:
    """A name the service takes by its extension (some decide the format by it): the posted one when it fits."""
    extension = {"ogg": ".ogg", "wav": ".wav", "mp3": ".mp3", "m4a": ".mp4", "flac": ".flac", "webm": ".webm"}
    suffix = extension.get(kind, f".{kind}")
    return f"audio{suffix}"
