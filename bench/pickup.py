"""Pickup latency: a spawn request's atomic rename into tasks/ until the watcher calls its handler.

The real `IpcWatcher` with a recording handler (no containers). Requests are written open-loop, one every
20-80 ms (random, seeded) across four chat folders, so a slow watcher cannot slow the writer down.
Compared with the same watcher polling once a second with a one-second rescan, which is how NanoClaw
picks up its IPC files; the product's own polling fallback (IPC_FORCE_POLLING) is shown as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass

from bench.common import BenchContext, ms, wait_event
from bench.report import Measure, Row
from container.protocol import SpawnRequest
from core.store.chats import folder_for_chat
from runner.ipc.batch import RequestOutcome
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.ipc.watcher import POLL_DELAY_MS, IpcWatcher

NAME = "pickup"
FOLDERS = 4
MAX_FILE_BYTES = 256 * 1024
GAP_SECONDS = (0.02, 0.08)
PRODUCT_RESCAN_SECONDS = 5.0  # IPC_RESCAN_SECONDS default


@dataclass(frozen=True, slots=True)
class Variant:
    key: str
    label: str
    force_polling: bool
    poll_delay_ms: int | None  # None: the watcher's own POLL_DELAY_MS
    rescan_seconds: float


INOTIFY = Variant("inotify", "inotify (default)", False, None, PRODUCT_RESCAN_SECONDS)
PRODUCT_POLLING = Variant("poll", "IPC_FORCE_POLLING (100 ms poll)", True, None, PRODUCT_RESCAN_SECONDS)
NANOCLAW = Variant("nanoclaw", "1 s poll + 1 s rescan", True, 1000, 1.0)


async def _measure(ctx: BenchContext, variant: Variant, count: int, rng: random.Random) -> list[float]:
    root = ctx.work_dir / f"ipc-{variant.key}"
    chats = {folder_for_chat(ctx.chat_id(i)): ctx.chat_id(i) for i in range(FOLDERS)}
    for folder in chats:
        ensure_chat_dirs(root, folder)
    written: dict[str, float] = {}
    handled: dict[str, float] = {}
    all_handled = asyncio.Event()

    async def on_request(chat_id: int, request: SpawnRequest) -> RequestOutcome:
        handled.setdefault(request.request_id, time.perf_counter())
        if len(handled) >= count:
            all_handled.set()
        return RequestOutcome.ACCEPTED

    async def resolve(folder: str) -> int | None:
        return chats.get(folder)

    watcher = IpcWatcher(
        root,
        resolve,
        on_request,
        rescan_interval_seconds=variant.rescan_seconds,
        force_polling=variant.force_polling,
        max_file_bytes=MAX_FILE_BYTES,
        poll_delay_ms=variant.poll_delay_ms if variant.poll_delay_ms is not None else POLL_DELAY_MS,
    )
    folders = sorted(chats)
    task = asyncio.create_task(watcher.run(), name=f"bench-watcher-{variant.key}")
    try:
        await wait_event(watcher.ready, 10, "the watcher to be ready")
        await asyncio.sleep(0.2)  # let the first session settle (its sweep has run)
        for i in range(count):
            request = SpawnRequest(request_id=f"pk-{variant.key}-{i:05d}", task="$ true", label="pickup")
            await asyncio.sleep(rng.uniform(*GAP_SECONDS))
            write_spawn_request(root, folders[i % len(folders)], request)
            written[request.request_id] = time.perf_counter()  # the rename was the write's last step
        await wait_event(all_handled, 30, f"{count} requests to be handled ({len(handled)} so far)")
    finally:
        await watcher.close()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return [ms(handled[key] - written[key]) for key in written]


async def run(ctx: BenchContext) -> list[Row]:
    count = ctx.scaled(200, 40)
    rng = random.Random(20240611)
    results = {
        variant.key: await _measure(ctx, variant, count, rng) for variant in (INOTIFY, PRODUCT_POLLING, NANOCLAW)
    }
    baseline = Measure.of(results[NANOCLAW.key])
    rows = [
        Row(
            bench=NAME,
            metric=f"request file renamed → handler called, {variant.label}",
            unit="ms",
            result=Measure.of(results[variant.key]),
            baseline_label=f"same watcher, {NANOCLAW.label} (NanoClaw-style)",
            baseline=baseline,
            extra={"max_ms": max(results[variant.key])},
        )
        for variant in (INOTIFY, PRODUCT_POLLING)
    ]
    ctx.note(f"{count} requests per variant, written every {GAP_SECONDS[0] * 1000:.0f}-{GAP_SECONDS[1] * 1000:.0f} ms")
    return rows
