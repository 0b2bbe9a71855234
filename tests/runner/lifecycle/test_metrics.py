"""`/metrics` as Prometheus scrapes it, parsed with its own text parser: the documented series exist and
move as runs start, wait, are refused, finish and are cancelled; the caps follow a live change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from container.channel import RunChannel
from container.task import RunResult
from core.live_config import LiveConfig
from core.store.runs import RunStatus
from core.store.setting_overrides import SettingOverrideStore
from core.store.spend import SpendKind
from crewbot.metrics_server import MetricsServer
from runner.lifecycle.metrics import RunMetrics
from runner.runtimes.resource_use import ResourceSample
from tests.fakes.memory_runtime import MemoryContainer
from tests.runner.lifecycle_helpers import CHAT_ID, Rig, rig

pytestmark = pytest.mark.timeout(60)

MIB = 1024 * 1024
DOCUMENTED = {
    "crewbot_subagents_running": "gauge",
    "crewbot_subagents_queued": "gauge",
    "crewbot_subagents_max_concurrent": "gauge",
    "crewbot_subagents_max_per_chat": "gauge",
    "crewbot_subagent_runs": "counter",
    "crewbot_subagent_refusals": "counter",
    "crewbot_subagent_llm_tokens": "counter",
    "crewbot_subagent_files": "counter",
    "crewbot_subagent_file_bytes": "counter",
    "crewbot_subagent_queue_wait_seconds": "histogram",
    "crewbot_subagent_start_latency_seconds": "histogram",
    "crewbot_subagent_run_duration_seconds": "histogram",
    "crewbot_subagent_cancel_latency_seconds": "histogram",
    "crewbot_subagent_memory_peak_bytes": "histogram",
    "crewbot_subagent_cpu_seconds": "histogram",
    "crewbot_llm_tokens": "counter",
    "crewbot_daily_tokens_used": "gauge",
    "crewbot_daily_tokens_allowance": "gauge",
    "crewbot_stream_first_text_seconds": "histogram",
    "crewbot_stream_edits": "counter",
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Scraper:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(self.base + path) as response:
            return response.status, await response.text()

    async def scrape(self) -> tuple[dict[str, str], Samples]:
        status, text = await self.get("/metrics")
        assert status == 200
        families = list(text_string_to_metric_families(text))
        samples: Samples = {}
        for family in families:
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return {f.name: f.type for f in families}, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@asynccontextmanager
async def serving(r: Rig) -> AsyncIterator[Scraper]:
    async def ready() -> str | None:
        return None

    server = MetricsServer(r.service.metrics.registry, "127.0.0.1:0", ready)
    await server.start()
    assert server.port is not None
    try:
        yield Scraper(server.port)
    finally:
        await server.stop()


async def test_series_exist_and_move_with_runs(tmp_path: Path) -> None:
    gates: dict[str, asyncio.Event] = {}

    async def gated(channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        await gates.setdefault(task.task, asyncio.Event()).wait()
        await channel.report(RunResult(status="completed", result="done"))
        return 0

    async with (
        # Queue 0: over the cap is a refusal, so the refusal series move (waiting: the test below).
        rig(tmp_path, gated, MAX_CONCURRENT_SUBAGENTS=1, MAX_SUBAGENTS_PER_CHAT=5, SUBAGENT_QUEUE_LIMIT=0) as r,
        serving(r) as scraper,
    ):
        types, samples = await scraper.scrape()
        assert {name: types.get(name) for name in DOCUMENTED} == DOCUMENTED
        assert value(samples, "crewbot_subagents_max_concurrent") == 1
        assert value(samples, "crewbot_subagents_running") == 0
        assert value(samples, "crewbot_subagent_runs_total", outcome="completed") == 0
        assert all("chat" not in dict(labels) for _, labels in samples)  # no chat ids as labels

        # Waiting: the engine holds the start, the run is queued.
        r.runtime.container_usage = ResourceSample(memory_peak_bytes=96 * MIB, cpu_seconds=2.5)
        r.runtime.hold_starts()
        first = await r.spawn("first")
        await r.runtime.until(lambda: r.runtime.held_starts == 1)
        _, samples = await scraper.scrape()
        assert value(samples, "crewbot_subagents_queued") == 1
        r.runtime.release_starts()
        await r.runtime.until(lambda: r.runtime.running_count() == 1)
        await r.until_status(first, RunStatus.RUNNING)
        await r.until(lambda: r.service.live.running() == 1)
        _, samples = await scraper.scrape()
        assert value(samples, "crewbot_subagents_running") == 1
        assert value(samples, "crewbot_subagents_queued") == 0
        assert value(samples, "crewbot_subagent_queue_wait_seconds_count") == 1
        assert value(samples, "crewbot_subagent_start_latency_seconds_count") == 1

        # Over the cap: refused and counted.
        refused = await r.spawn("refused")
        assert await r.status(refused) == RunStatus.REJECTED
        _, samples = await scraper.scrape()
        assert value(samples, "crewbot_subagent_refusals_total", cap="global") == 1
        assert value(samples, "crewbot_subagent_runs_total", outcome="rejected") == 1

        # A live change of the cap shows at once; the next run fits, and is cancelled.
        await LiveConfig(r.settings, SettingOverrideStore(r.stores.db)).set("MAX_CONCURRENT_SUBAGENTS", "2", "test")
        second = await r.spawn("second")
        await r.runtime.until(lambda: r.runtime.running_count() == 2)
        _, samples = await scraper.scrape()
        assert value(samples, "crewbot_subagents_max_concurrent") == 2
        assert value(samples, "crewbot_subagents_running") == 2
        assert await r.service.manager.cancel_run(CHAT_ID, second) is RunStatus.CANCELLED
        await r.until(lambda: second not in r.service.live)

        # The first finishes: its outcome, duration and what it used.
        gates.setdefault("first", asyncio.Event()).set()
        await r.until_status(first, RunStatus.COMPLETED)
        await r.settled()
        _, samples = await scraper.scrape()
        assert value(samples, "crewbot_subagents_running") == 0
        assert value(samples, "crewbot_subagent_runs_total", outcome="cancelled") == 1
        assert value(samples, "crewbot_subagent_runs_total", outcome="completed") == 1
        assert value(samples, "crewbot_subagent_cancel_latency_seconds_count") == 1
        assert value(samples, "crewbot_subagent_run_duration_seconds_count") == 2
        assert value(samples, "crewbot_subagent_memory_peak_bytes_count") == 2
        assert value(samples, "crewbot_subagent_memory_peak_bytes_sum") == 2 * 96 * MIB
        record = await r.service.runs.get(first)
        assert record is not None and record.memory_peak_bytes == 96 * MIB and record.cpu_seconds == 2.5

        assert await scraper.get("/healthz") == (200, "ok\n")
        assert (await scraper.get("/readyz"))[0] == 200


async def test_the_queued_gauge_counts_runs_waiting_for_a_slot(tmp_path: Path) -> None:
    async def blocked(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await asyncio.Event().wait()
        return None

    async with rig(tmp_path, blocked, MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=5) as r, serving(r) as scraper:
        ids = [await r.spawn(f"job {i}") for i in range(3)]
        await r.runtime.until(lambda: r.runtime.running_count() == 1)
        assert sorted([await r.status(run_id) for run_id in ids]) == ["queued", "queued", "running"]
        _, samples = await scraper.scrape()
        assert value(samples, "crewbot_subagents_queued") == 2
        assert value(samples, "crewbot_subagents_running") == 1
        assert value(samples, "crewbot_subagent_refusals_total", cap="global") == 0


def test_llm_tokens_by_kind_and_the_bots_daily_gauges() -> None:
    metrics = RunMetrics()
    metrics.count_llm_tokens(SpendKind.MAIN, 100, 20)  # what the main agent's side calls for each turn's call
    metrics.count_llm_tokens(SpendKind.SCHEDULED, 7, -1)
    metrics.watch_allowance(used=lambda: 1_234, allowance=lambda: 5_000)

    def get(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert (
        get("crewbot_llm_tokens_total", kind="main", direction="input"),
        get("crewbot_llm_tokens_total", kind="main", direction="output"),
    ) == (100, 20)
    assert get("crewbot_llm_tokens_total", kind="scheduled", direction="output") == 0  # never negative
    assert get("crewbot_llm_tokens_total", kind="announce", direction="input") == 0  # every series from the start
    assert (get("crewbot_daily_tokens_used"), get("crewbot_daily_tokens_allowance")) == (1_234, 5_000)


def test_streamed_answers_first_text_and_edits() -> None:
    metrics = RunMetrics()
    metrics.count_stream(1.2, 7, draft=False)
    metrics.count_stream(None, 2, draft=True)  # its first words never showed: only its writes count
    metrics.count_stream(0.4, -1, draft=True)

    def get(name: str, shown: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"shown": shown})

    assert get("crewbot_stream_first_text_seconds_count", "message") == 1
    assert get("crewbot_stream_first_text_seconds_sum", "message") == 1.2
    assert get("crewbot_stream_first_text_seconds_count", "draft") == 1
    assert (get("crewbot_stream_edits_total", "message"), get("crewbot_stream_edits_total", "draft")) == (7, 2)


def test_the_turn_gauges_read_the_engine_when_scraped() -> None:
    metrics = RunMetrics()
    counts = (0, 0)
    metrics.watch_turns(lambda: counts, 32)
    counts = (3, 5)  # read at the scrape, not at the watch

    def value(name: str) -> float | None:
        return metrics.registry.get_sample_value(name)

    assert [value(f"crewbot_turns_{name}") for name in ("running", "waiting", "max_concurrent")] == [3.0, 5.0, 32.0]
