"""The warm pool (SUBAGENT_WARM_POOL): a spawn request file until the subagent's first LLM request when the run
takes a ready container, against a bare container start and against the cold path; ten at once on a pool of ten
against one alone; what an idle member holds; what a 100 MB workspace costs a run (pulled and pushed over the
channel, pooled) against the same workspace bind-mounted (a cold run, no pool).

Phases, each with its own app: a pool of 2 (hits, one at a time, each after the pool refilled, interleaved with a
bare `docker run` that connects to a socket, as bench/spawn.py's baseline); no pool (today's cold path, the same
interleaving, and the bind-mounted 100 MB run); a pool of 10 (ten requests written at once). The 100 MB workspace
is random bytes (no compression helps): in the pooled phase the chat's stored archive (a chat is synced once it
has one; a folder with files would stay mounted and never be pooled), in the no-pool phase the chat's folder.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.apps import BenchApp, FirstCallProbe, bench_app
from bench.common import BenchContext, bench_settings, ms
from bench.report import Measure, Row
from bench.spawn import CONNECT_CODE, _BareRunner
from container.protocol import SpawnRequest
from core.settings import Settings
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.storage.workspace_archive import WorkspaceArchives
from tests.fakes.telegram_server import FakeTelegram

NAME = "warm_pool"
RUN_TIMEOUT_SECONDS = 180.0
READY_TIMEOUT_SECONDS = 120.0
WORKSPACE_MB = 100
BYTES_PER_MB = 1024 * 1024
BURST = 10


@dataclass
class Samples:
    hit: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)
    bare_hit: list[float] = field(default_factory=list)  # the bare starts interleaved with the hits
    bare_cold: list[float] = field(default_factory=list)
    burst: list[float] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)  # hits in the burst's app, one at a time
    idle_bytes: list[float] = field(default_factory=list)  # per member
    pooled_100mb: list[float] = field(default_factory=list)  # request → done
    pooled_empty: list[float] = field(default_factory=list)
    mounted_100mb: list[float] = field(default_factory=list)


class Phase:
    """One app, one chat: spawn runs and time them."""

    def __init__(self, bench: BenchApp, folder: str, batch: str) -> None:
        self.bench = bench
        self.service, _ = bench.subagents()
        self.probe = FirstCallProbe(self.service.live)
        self.folder = folder
        self._batch = batch
        self._count = 0

    def spawn(self, task: str = "$ true") -> tuple[str, float]:
        self._count += 1
        run_id = f"wp-{self._batch}-{self._count:03d}"
        write_spawn_request(self.service.paths.ipc_root, self.folder, SpawnRequest(request_id=run_id, task=task))
        return run_id, time.perf_counter()

    async def first_call_ms(self, task: str = "$ true") -> float:
        run_id, t0 = self.spawn(task)
        first = await self.probe.wait(run_id, RUN_TIMEOUT_SECONDS)
        await self.bench.wait_run_done(run_id, RUN_TIMEOUT_SECONDS)
        return ms(first - t0)

    async def done_ms(self, task: str = "$ true") -> float:
        run_id, t0 = self.spawn(task)
        status = await self.bench.wait_run_done(run_id, RUN_TIMEOUT_SECONDS)
        if status != "completed":
            raise RuntimeError(f"run {run_id} ended {status}")
        return ms(time.perf_counter() - t0)

    async def pool_ready(self) -> None:
        pool = self.service.pool
        assert pool is not None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while pool.counts()[0] < pool.target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pool not ready: {await pool.stats()}")
            await asyncio.sleep(0.05)


@dataclass
class _App:
    settings: Settings
    chat_id: int


async def _phase(
    ctx: BenchContext, tg: FakeTelegram, index: int, pool: int, extra_chat: int | None = None, **overrides: object
) -> _App:
    chat_id = ctx.chat_id(index)
    chats = [chat_id] if extra_chat is None else [chat_id, ctx.chat_id(extra_chat)]
    for chat in chats:
        tg.add_chat(chat, title=f"bench warm pool {chat}")
    settings = bench_settings(
        ctx.work_dir / f"data{index}",
        token=tg.token,
        base_url=tg.base_url,
        ALLOWED_CHAT_IDS=",".join(map(str, chats)),
        SUBAGENT_WARM_POOL=pool,
        **overrides,
    )
    return _App(settings, chat_id)


async def _open(bench: BenchApp, chat_id: int, batch: str) -> Phase:
    chat = await bench.app.stores.chats.ensure(chat_id, "supergroup", "bench warm pool")
    service, _ = bench.subagents()
    await asyncio.to_thread(ensure_chat_dirs, service.paths.ipc_root, chat.folder)
    await asyncio.sleep(0.5)  # the watcher restarts for the new folder
    return Phase(bench, chat.folder, batch)


def _fill_archive(archive: Path) -> None:
    """The chat's stored workspace, as a run's push would have left it: one tar of WORKSPACE_MB random bytes."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        _fill_workspace(Path(folder))
        with tarfile.open(archive, "w") as tar:
            tar.add(Path(folder) / "data.bin", arcname="data.bin")


def _fill_workspace(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "data.bin", "wb") as out:
        for _ in range(WORKSPACE_MB):
            out.write(os.urandom(BYTES_PER_MB))


async def run(ctx: BenchContext) -> list[Row]:
    count = ctx.scaled(8, 3)
    s = Samples()
    batch = secrets.token_hex(3)
    async with FakeTelegram() as tg, _BareRunner(ctx, "crewbot-agent:latest") as bare:
        await _pooled(ctx, tg, bare, s, count, batch)
        await _cold(ctx, tg, bare, s, count, batch)
        await _burst(ctx, tg, s, batch)
    ctx.note(f"{count} samples each; one container at a time except the burst ({BURST} at once on a pool of {BURST})")
    return _rows(s)


async def _pooled(ctx: BenchContext, tg: FakeTelegram, bare: _BareRunner, s: Samples, count: int, batch: str) -> None:
    app = await _phase(ctx, tg, 0, 2, extra_chat=3)
    async with bench_app(app.settings, with_subagents=True) as bench:
        phase = await _open(bench, app.chat_id, batch + "a")
        big = await _open(bench, ctx.chat_id(3), batch + "w")  # a chat whose workspace holds 100 MB
        archive = WorkspaceArchives(big.service.paths, lambda: WORKSPACE_MB * 2).chat(big.folder).path
        await asyncio.to_thread(_fill_archive, archive)  # an archived chat: its runs are synced and pooled
        await phase.pool_ready()
        await phase.first_call_ms()  # warm-up
        for _ in range(count):
            await phase.pool_ready()
            s.hit.append(await phase.first_call_ms())
            s.bare_hit.append((await bare.sample(CONNECT_CODE))[1])
            await phase.pool_ready()
            s.pooled_empty.append(await phase.done_ms())
            await phase.pool_ready()
            s.pooled_100mb.append(await big.done_ms())
        pool = phase.service.pool
        assert pool is not None
        await phase.pool_ready()
        stats = await pool.stats()
        if stats.idle_memory_bytes is not None and stats.ready:
            s.idle_bytes.append(stats.idle_memory_bytes / stats.ready)
        ctx.note(f"pool of 2: {stats.hits} hits, {stats.misses} misses")


async def _cold(ctx: BenchContext, tg: FakeTelegram, bare: _BareRunner, s: Samples, count: int, batch: str) -> None:
    app = await _phase(ctx, tg, 1, 0)
    async with bench_app(app.settings, with_subagents=True) as bench:
        phase = await _open(bench, app.chat_id, batch + "b")
        await phase.first_call_ms()  # warm-up
        for _ in range(count):
            s.cold.append(await phase.first_call_ms())
            s.bare_cold.append((await bare.sample(CONNECT_CODE))[1])
        await asyncio.to_thread(_fill_workspace, phase.service.paths.workspace(phase.folder))
        for _ in range(count):
            s.mounted_100mb.append(await phase.done_ms())


async def _burst(ctx: BenchContext, tg: FakeTelegram, s: Samples, batch: str) -> None:
    app = await _phase(ctx, tg, 2, BURST, MAX_CONCURRENT_SUBAGENTS=BURST, MAX_SUBAGENTS_PER_CHAT=BURST)
    async with bench_app(app.settings, with_subagents=True) as bench:
        phase = await _open(bench, app.chat_id, batch + "c")
        for _ in range(ctx.scaled(3, 1)):
            await phase.pool_ready()
            s.alone.append(await phase.first_call_ms())
            await phase.pool_ready()
            await asyncio.sleep(1.0)  # the refill's own start settles
            spawned = [phase.spawn() for _ in range(BURST)]
            for run_id, t0 in spawned:
                first = await phase.probe.wait(run_id, RUN_TIMEOUT_SECONDS)
                s.burst.append(ms(first - t0))
            for run_id, _ in spawned:
                await bench.wait_run_done(run_id, RUN_TIMEOUT_SECONDS)


def _rows(s: Samples) -> list[Row]:
    first = "request file → the container's first LLM request"
    bare = "bare docker run: python -c connect, until it connects"
    return [
        Row(NAME, f"{first}, pool hit", "ms", Measure.of(s.hit), bare, Measure.of(s.bare_hit)),
        Row(NAME, f"{first}, pool hit", "ms", Measure.of(s.hit), "today's cold path (no pool)", Measure.of(s.cold)),
        Row(NAME, f"{first}, cold path (no pool)", "ms", Measure.of(s.cold), bare, Measure.of(s.bare_cold)),
        Row(
            NAME,
            f"{first}: {BURST} at once on a pool of {BURST}",
            "ms",
            Measure.of(s.burst),
            "one alone (a hit)",
            Measure.of(s.alone),
        ),
        Row(
            NAME,
            "an idle member's memory (engine's figure)",
            "MiB",
            Measure.of([b / BYTES_PER_MB for b in s.idle_bytes]),
        ),
        Row(
            NAME,
            f"request file → run done, pooled, {WORKSPACE_MB} MB workspace (pulled + pushed)",
            "ms",
            Measure.of(s.pooled_100mb),
            "the same, empty workspace",
            Measure.of(s.pooled_empty),
        ),
        Row(
            NAME,
            f"request file → run done, pooled, {WORKSPACE_MB} MB workspace (pulled + pushed)",
            "ms",
            Measure.of(s.pooled_100mb),
            f"cold, {WORKSPACE_MB} MB workspace bind-mounted (no pool)",
            Measure.of(s.mounted_100mb),
        ),
    ]
