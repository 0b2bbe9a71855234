"""Real containers: each run's peak memory and CPU time land in its record, and `crewbot stats` and its
suggested cap are computed from them (the engine, the image, SQLite, the fake Bot API; nothing mocked)."""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.protocol import SpawnRequest
from core.store.runs import RunStatus, RunStore
from crewbot.cap_advice import HOST_MEMORY_RESERVE_FRACTION, Host
from crewbot.stats_command import gather
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS, final, wait_for_runs

pytestmark = pytest.mark.docker

MIB = 1024 * 1024
HELD_MIB = 150  # what the heavy run writes into memory and holds while it is sampled
# b"x" * n writes every page (a calloc'd bytearray would not be resident); the sum keeps a core busy.
HEAVY_TASK = (
    f'$ python3 -c \'import time; held = b"x" * ({HELD_MIB} << 20); '
    "sum(i * i for i in range(20_000_000)); time.sleep(3)'"
)
LIGHT_TASK = "$ sleep 3"
BURN_MARGIN_SECONDS = 0.5  # 20 million squares take well over a second of CPU on any machine that runs this


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def test_real_runs_record_memory_and_cpu_and_feed_the_stats(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    settings = make_settings(tmp_path, tg, MAX_CONCURRENT_SUBAGENTS=2, SUBAGENT_MEMORY="512m")
    async with telegram_app(settings, with_subagents=True) as app:
        chat = await app.stores.chats.ensure(GROUP_ID, "supergroup", "resources")
        tg.add_chat(GROUP_ID, title="resources")
        ipc_root = settings.data_dir / "ipc"
        ensure_chat_dirs(ipc_root, chat.folder)
        batch = secrets.token_hex(3)
        heavy, light = f"heavy-{batch}", f"light-{batch}"
        write_spawn_request(ipc_root, chat.folder, SpawnRequest(request_id=heavy, task=HEAVY_TASK, label="heavy"))
        write_spawn_request(ipc_root, chat.folder, SpawnRequest(request_id=light, task=LIGHT_TASK, label="light"))
        runs = RunStore(app.stores.db)
        await wait_for_runs(runs, GROUP_ID, 2, final, RUN_WAIT_SECONDS)
        # A result is sent before its container has exited; the figures are kept once it has.
        await asyncio.wait_for(app.wait_quiet(GROUP_ID), RUN_WAIT_SECONDS)
        records = {r.id: r for r in await runs.for_chat(GROUP_ID, 10)}

    big, small = records[heavy], records[light]
    assert big.status is RunStatus.COMPLETED and small.status is RunStatus.COMPLETED, (big.error, small.error)
    for record in (big, small):
        assert record.resource_samples >= 1
        assert record.started_at is not None and record.container_started_at is not None
        assert record.container_started_at >= record.started_at
    assert big.memory_peak_bytes is not None and small.memory_peak_bytes is not None
    assert HELD_MIB * MIB <= big.memory_peak_bytes < 512 * MIB  # what it held, under its limit
    assert small.memory_peak_bytes < big.memory_peak_bytes
    assert big.cpu_seconds is not None and small.cpu_seconds is not None
    # Both pay the agent's own Python start-up (about 1.3 s here); the heavy one burns seconds more.
    assert big.cpu_seconds > small.cpu_seconds + BURN_MARGIN_SECONDS

    # Stats from the database those runs filled, as `crewbot stats` computes them.
    stats, advice = await gather(settings, 3600.0, GROUP_ID)
    assert stats.requests == 2 and stats.by_outcome == {"completed": 2}
    assert stats.memory_peak_bytes.known == 2 and stats.memory_peak_bytes.p95 is not None
    assert stats.memory_peak_bytes.p95 >= HELD_MIB * MIB * 0.95
    host = Host.this_machine()
    usable = host.memory_bytes * (1 - HOST_MEMORY_RESERVE_FRACTION)
    assert advice.by_memory == max(1, math.floor(usable / stats.memory_peak_bytes.p95))
    assert advice.suggested == min(advice.needed, advice.by_memory, advice.by_cpu)
