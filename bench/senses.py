"""The senses: a 12-megapixel photo made ready for the model, and the cost of transcription beyond the service.

- image: a member's 4000×3000 JPEG (a fractal at quality 90, about what a phone sends), downloaded through
  PTB from the fake Bot API in this process. **Arm**: `SeenImages.see` on a fresh platform file (a new unique
  id each sample, so nothing is reused): the download, the decode in a thread (`draft` to half scale), the
  downscale to 1,568 px, the JPEG encode and the copy kept on disk. **Baseline**: the same file's download
  alone (`bot.channels.telegram_files.download`), alternating with the arm. Goal: the arm at most 150 ms over
  its download.
- memory: RSS sampled every 0.5 ms by a thread while `prepare_image` works on the photo's bytes, minus RSS
  just before (first call after a warm-up on a small image). Goal: at most +64 MiB.
- transcription: a 60-second voice note through the transcriber (real SQLite, allowances, the STT client)
  to a fake OpenAI-compatible service that takes SERVICE_SECONDS per call. **Arm**: from `accept` to the
  `heard` callback. **Baseline**: the service's own time per call (from its request's arrival to its answer).
  Goal: the arm at most 10 % over the service's time.
"""

from __future__ import annotations

import asyncio
import gc
import io
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image
from telegram import Bot

from bench.common import BenchContext, bench_settings, ms
from bench.report import Measure, Row
from bot.channels.telegram import file_url_for
from bot.channels.telegram_files import download
from bot.senses.image_prep import prepare_image
from bot.senses.seen_images import MAX_IMAGE_DOWNLOAD_BYTES, SeenImages
from bot.senses.stt_client import SttClient
from bot.senses.transcriber import Job, Transcriber
from core.allowances import Allowances
from core.store.chat_files import ChatFile, FileKind, NewFile
from core.store.messages import NewMessage
from core.store.spend import SpendStore
from core.stores import Stores
from tests.bot.senses.media import ogg_opus
from tests.fakes.stt_server import FakeStt
from tests.fakes.telegram_server import FakeTelegram

NAME = "senses"
PHOTO_SIZE = (4000, 3000)
NOISE_SIGMA = 40
SERVICE_SECONDS = 1.0
VOICE_SECONDS = 60.0
RSS_SAMPLE_SECONDS = 0.0005
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024
CHAT = -1_009_001


def photo() -> bytes:
    """A fractal with sensor-like noise in each channel: about the size of a phone's 12-MP JPEG (3 to 4 MB)."""
    base = Image.effect_mandelbrot(PHOTO_SIZE, (-2.0, -1.2, 1.0, 1.2), 80)
    channels = [Image.blend(base, Image.effect_noise(PHOTO_SIZE, NOISE_SIGMA), 0.3) for _ in range(3)]
    image = Image.merge("RGB", channels)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def peak_rss_while(work: Callable[[], object]) -> int:
    """The highest RSS seen while `work()` runs, less RSS just before it."""
    gc.collect()
    before = rss_bytes()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes())
            time.sleep(RSS_SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return max(peak, rss_bytes()) - before


async def image_rows(ctx: BenchContext, data: bytes) -> list[Row]:
    rounds = ctx.scaled(12, 4)
    arm: list[float] = []
    baseline: list[float] = []
    async with FakeTelegram() as tg:
        bot = Bot(tg.token, base_url=tg.base_url, base_file_url=file_url_for(tg.base_url))
        async with bot:
            seen = SeenImages(ctx.work_dir / "seen", _Downloader(bot))
            for n in range(rounds + 1):
                update = tg.push_media_message(
                    ctx.chat_id(0), "document", data, file_name="p.jpg", mime_type="image/jpeg"
                )
                media = update["message"]["document"]
                file = ChatFile(n, ctx.chat_id(0), n, FileKind.PHOTO, media["file_id"], f"bench-{n}", "p.jpg",
                                "image/jpeg", len(data), time.time())  # fmt: skip
                for first in (True, False) if n % 2 else (False, True):
                    started = time.perf_counter()
                    if first:
                        result = await seen.see(file)
                        assert result.image is not None, result.refused
                    else:
                        got = await download(bot, media["file_id"], MAX_IMAGE_DOWNLOAD_BYTES)
                        assert len(got) == len(data)
                    took = ms(time.perf_counter() - started)
                    if n:  # the first round warms up both
                        (arm if first else baseline).append(took)
    over = [a - b for a, b in zip(arm, baseline, strict=True)]
    ctx.note(f"image: {len(data) / MIB:.1f} MiB JPEG of {PHOTO_SIZE[0]}x{PHOTO_SIZE[1]}; over its download, per round: "
             + ", ".join(f"{o:.0f}" for o in over) + " ms")  # fmt: skip
    return [
        Row(
            NAME,
            "a 12-MP photo (4000×3000 JPEG) downloaded and made an image part (1568×1176)",
            "ms",
            Measure.of(arm),
            "its download alone",
            Measure.of(baseline),
            extra={"over_download_ms_median": round(sorted(over)[len(over) // 2], 1), "goal_over_ms": 150},
        )
    ]


class _Downloader:
    def __init__(self, bot: Bot) -> None:
        self._bot = bot

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        return await download(self._bot, file_id, max_bytes)


def _prepared_peak(path: str) -> float:
    """In a fresh process: warm up on a small image, then RSS's peak over before while the photo is prepared."""
    small = io.BytesIO()
    Image.new("RGB", (64, 48)).save(small, "JPEG")
    prepare_image(small.getvalue())  # the decoders and encoders loaded
    data = Path(path).read_bytes()
    return peak_rss_while(lambda: prepare_image(data)) / MIB


def memory_rows(ctx: BenchContext, data: bytes) -> list[Row]:
    path = ctx.work_dir / "photo.jpg"
    path.write_bytes(data)
    samples = []
    # Each in a process of its own: an allocator that kept pages from an earlier decode would hide the peak.
    for _ in range(ctx.scaled(3, 1)):
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            samples.append(pool.submit(_prepared_peak, str(path)).result())
    return [
        Row(
            NAME,
            "memory while a 12-MP photo is prepared (RSS peak over before, a fresh process each)",
            "MiB",
            Measure.of(samples),
            "goal",
            Measure.figure(64.0),
        )
    ]


async def transcription_rows(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(6, 3)
    settings = bench_settings(ctx.work_dir / "data", STT_BASE_URL="http://127.0.0.1:9/v1")
    stores = await Stores.open(settings)
    await stores.chats.ensure(CHAT, "group", "bench")
    voice = ogg_opus(VOICE_SECONDS)
    totals: list[float] = []
    try:
        async with FakeStt() as stt:
            stt.answer("a minute of words " * 20, seconds=VOICE_SECONDS, delay_seconds=SERVICE_SECONDS)
            client = SttClient(stt.base_url, "whisper-1")
            transcriber = Transcriber(settings, client, stores.transcripts, _Bytes(voice),
                                      Allowances(settings, SpendStore(stores.db)))  # fmt: skip
            for n in range(rounds + 1):
                new = NewFile(FileKind.VOICE, f"v{n}", f"u{n}", "voice.ogg", "audio/ogg", len(voice), 60)
                row = await stores.messages.add(NewMessage(CHAT, "Alice", "", kind="file", file=new))
                stored = await stores.messages.get(row or 0)
                assert stored is not None and stored.file is not None
                heard = asyncio.Event()

                async def told(chat_id: int, message_id: int, words: str, event: asyncio.Event = heard) -> None:
                    assert words
                    event.set()

                started = time.perf_counter()
                transcriber.accept(Job(CHAT, stored.id, stored.file), told)
                await heard.wait()
                if n:
                    totals.append(ms(time.perf_counter() - started))
            await transcriber.close()
            service = [ms(call.seconds_taken) for call in stt.calls[1:]]
    finally:
        await stores.db.close()
    overhead = [100.0 * (t - s) / s for t, s in zip(totals, service, strict=True)]
    return [
        Row(
            NAME,
            f"a {VOICE_SECONDS:.0f}-s voice note transcribed and stored, the service taking {SERVICE_SECONDS:g} s",
            "ms",
            Measure.of(totals),
            "the service's own time",
            Measure.of(service),
            extra={"overhead_percent_median": round(sorted(overhead)[len(overhead) // 2], 2), "goal_percent": 10},
        )
    ]


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        return self._data


async def run(ctx: BenchContext) -> list[Row]:
    data = await asyncio.to_thread(photo)
    rows = await asyncio.to_thread(memory_rows, ctx, data)
    rows += await image_rows(ctx, data)
    rows += await transcription_rows(ctx)
    return rows
