"""`crewbot stats` arithmetic on synthetic records, the suggested cap's direction, and the plot."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

from PIL import Image

from core.store.chat_files import FileKind
from core.store.egress import EgressTotals
from core.store.outbox import SentFileKind
from core.store.run_files import FileTotals
from core.store.runs import RunRecord, RunStatus, RunStore
from core.store.setting_overrides import SettingChange
from core.stores import Stores
from crewbot.cap_advice import GIB, MIB, Host, advise
from crewbot.stats_command import cap_history, gather
from crewbot.stats_plot import PLOT_HEIGHT_PX, PLOT_WIDTH_PX, draw
from crewbot.usage_stats import compute, percentile
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.egress_helpers import allowed, record, refused
from tests.harness import make_settings
from tests.run_files_helpers import give, send

HOST = Host(memory_bytes=8 * GIB, cpus=4)  # 6 GiB for subagents after the 25 % reserve
CHAT = -100


def run(
    n: int,
    created: float,
    started: float | None,
    finished: float | None,
    status: RunStatus = RunStatus.COMPLETED,
    *,
    memory_mib: int | None = 100,
    cpu: float | None = 1.0,
    chat: int = CHAT,
    tokens: int = 0,
) -> RunRecord:
    return RunRecord(
        id=f"run-{n:04d}",
        chat_id=chat,
        turn_id=None,
        task="t",
        label="t",
        include_context=False,
        status=status,
        container_id=None,
        created_at=created,
        started_at=started,
        finished_at=finished,
        result=None,
        error=None,
        input_tokens=tokens,
        output_tokens=0,
        llm_requests=0,
        session_in=None,
        session_out=None,
        memory_peak_bytes=None if memory_mib is None else memory_mib * MIB,
        cpu_seconds=cpu,
    )


def fixed_cap(cap: int):  # type: ignore[no-untyped-def]
    return lambda at: cap


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([4.0], 0.95) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.05


def test_counts_waits_concurrency_and_time_at_the_cap() -> None:
    records = [
        run(1, 0.0, 10.0, 60.0, chat=1, tokens=500),  # waited 10 s
        run(2, 20.0, 20.0, 40.0, chat=2, tokens=70),  # no wait
        run(3, 30.0, None, 30.0, RunStatus.REJECTED, memory_mib=None, cpu=None),
        run(4, 50.0, 60.0, 100.0, RunStatus.FAILED, memory_mib=None, cpu=None),  # queued 50..60
    ]
    stats = compute(records, 0.0, 100.0, fixed_cap(2))
    assert stats.requests == 4 and stats.refusals == 1
    assert stats.by_outcome == {"completed": 2, "rejected": 1, "failed": 1}
    assert stats.queue_wait_seconds.p50 == 10.0 and stats.queue_wait_seconds.known == 3
    assert stats.waited == 2  # 10 s and 10 s are over the noticeable 5 s
    assert stats.peak_running == 2 and stats.peak_queued == 1
    assert stats.share_at_cap == 0.2  # two running from 20 to 40 of 0..100
    assert stats.memory_peak_bytes.known == 2 and stats.memory_peak_bytes.unknown == 1
    assert stats.tokens_by_chat == {1: 500, 2: 70, CHAT: 0}
    # The refused request would have run for the median duration (40 s) from 30: three wanted at once.
    assert stats.peak_wanted == 3


def test_time_at_the_cap_follows_live_changes_of_it() -> None:
    records = [run(1, 0.0, 0.0, 100.0)]  # one run the whole time
    changes = [SettingChange("MAX_CONCURRENT_SUBAGENTS", "3", "1", "op", 50.0)]
    stats = compute(records, 0.0, 100.0, cap_history(changes, current=1), [50.0])
    assert stats.share_at_cap == 0.5  # at the cap only once it was lowered to 1


def quiet_period() -> list[RunRecord]:
    """Runs one after another: never more than one wanted a slot."""
    return [run(n, 100.0 * n, 100.0 * n, 100.0 * n + 50) for n in range(10)]


def busy_period() -> list[RunRecord]:
    """Bursts of five at a cap of 3: two refused each time."""
    records = []
    for burst in range(4):
        base = 1000.0 * burst
        records += [run(burst * 10 + i, base, base + 0.5, base + 300) for i in range(3)]
        records += [run(burst * 10 + 5 + i, base, None, base, RunStatus.REJECTED) for i in range(2)]
    return records


def test_the_suggestion_rises_with_demand_and_falls_with_memory_per_run() -> None:
    def suggest(records: list[RunRecord]) -> int:
        stats = compute(records, 0.0, 5000.0, fixed_cap(3))
        return advise(stats, current_cap=3, memory_limit="4g", cpus_limit=1.0, host=HOST).suggested

    assert suggest(quiet_period()) == 1  # nothing waited: one slot was all it used
    assert suggest(busy_period()) == 5  # five wanted at once, and 6 GiB / 100 MiB holds far more

    hungry = [replace(r, memory_peak_bytes=2 * GIB) if r.started_at else r for r in busy_period()]
    stats = compute(hungry, 0.0, 5000.0, fixed_cap(3))
    advice = advise(stats, current_cap=3, memory_limit="4g", cpus_limit=1.0, host=HOST)
    assert advice.by_memory == 3 and advice.suggested == 3  # 6 GiB / 2 GiB: memory is the limit now
    assert "memory is the limit" in advice.lines[-1]
    assert advice.lines[0].startswith("memory: the host holds 3 at once")

    busy_cpu = [replace(r, cpu_seconds=299.5) if r.started_at else r for r in busy_period()]  # one core each
    stats = compute(busy_cpu, 0.0, 5000.0, fixed_cap(3))
    assert advise(stats, current_cap=3, memory_limit="4g", cpus_limit=1.0, host=HOST).by_cpu == 4


def test_without_measured_figures_the_limits_stand_in() -> None:
    records = [run(1, 0.0, 0.0, 10.0, memory_mib=None, cpu=None)]
    stats = compute(records, 0.0, 10.0, fixed_cap(3))
    advice = advise(stats, current_cap=3, memory_limit="1g", cpus_limit=2.0, host=HOST)
    assert advice.by_memory == 6 and advice.by_cpu == 2
    assert "no run's peak is known" in advice.lines[0] and "no run's CPU time is known" in advice.lines[1]


def test_the_plot_is_a_png_of_the_expected_size(tmp_path: Path) -> None:
    stats = compute(busy_period(), 0.0, 5000.0, fixed_cap(3))
    path = tmp_path / "plots" / "cap.png"
    draw(stats.timeline, stats.start, stats.end, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (PLOT_WIDTH_PX, PLOT_HEIGHT_PX)  # the IHDR chunk
    with Image.open(path) as image:
        image.verify()  # checksums of every chunk
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (PLOT_WIDTH_PX, PLOT_HEIGHT_PX)
        colours = {colour for _, colour in image.getcolors(maxcolors=1 << 16) or []}
    assert (200, 30, 30) in colours and (30, 90, 200) in colours  # the cap and the running line are drawn


async def test_the_command_reads_the_database_and_prints_json_and_a_plot(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir)
    stores = await Stores.open(settings)
    await stores.chats.ensure(CHAT, "group", "g")
    runs = RunStore(stores.db)
    for n in range(4):
        run_id = f"stats-{n:03d}"
        await runs.create(
            run_id, chat_id=CHAT, turn_id=None, task="t", label="t", include_context=False, status=RunStatus.QUEUED
        )
        await runs.mark_running(run_id, None)
        await runs.record_resources(run_id, memory_peak_bytes=(n + 1) * 10 * MIB, cpu_seconds=0.5, samples=3)
        await runs.record_usage(run_id, 100, 20, 1)
        if n == 0:
            await give(stores.db, run_id, CHAT, [("sales.csv", 412 * 1024, FileKind.DOCUMENT)])
            await send(stores.db, run_id, CHAT, "chart.png", 34 * 1024, SentFileKind.PHOTO, data_dir / "chart")
        if n == 1:
            pypi = allowed(run_id, CHAT, "pypi.org", 443, "151.101.0.223", down=12 * MIB, up=MIB)
            await record(stores.db, run_id, [pypi, refused(run_id, CHAT, "evil.example", 443, "not allowed")])
        await runs.finish(run_id, RunStatus.COMPLETED, result="ok")
    await stores.db.close()

    plot = tmp_path / "out.png"
    done = run_crewbot(["stats", "--since", "1h", "--json", "--plot", str(plot)], crewbot_env(data_dir), tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["requests"] == 4 and report["by_outcome"] == {"completed": 4}
    assert report["memory_peak_bytes"]["p95"] == 38.5 * MIB
    assert report["tokens_by_chat"] == {str(CHAT): 480}
    assert report["files"] == {"files_in": 1, "bytes_in": 412 * 1024, "files_out": 1, "bytes_out": 34 * 1024}
    assert report["egress"] == {"connections": 2, "refused": 1, "bytes_up": MIB, "bytes_down": 12 * MIB, "lookups": 0}
    assert report["advice"]["lines"][-1].startswith("suggested MAX_CONCURRENT_SUBAGENTS=")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    done = run_crewbot(["stats", "--since", "1h"], crewbot_env(data_dir), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "memory per run: p50 25.0 MiB, p95 38.5 MiB (4 known)" in done.stdout
    assert "start latency: no runs" in done.stdout  # these runs never had a container
    assert "files: 1 in (412 KB), 1 out (34 KB)" in done.stdout
    assert "web: 2 connections (1 refused), 12.0 MB down, 1.0 MB up" in done.stdout
    assert "apply without a restart: crewbot config set MAX_CONCURRENT_SUBAGENTS=" in done.stdout


async def test_files_are_counted_for_the_period_and_the_chat_asked_for(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    stores = await Stores.open(settings)
    other = CHAT - 1
    runs = RunStore(stores.db)
    for run_id, chat, files in (("old", CHAT, 5), ("mine", CHAT, 2), ("theirs", other, 3)):
        await stores.chats.ensure(chat, "group", str(chat))
        await runs.create(
            run_id, chat_id=chat, turn_id=None, task="t", label="t", include_context=False, status=RunStatus.QUEUED
        )
        await give(stores.db, run_id, chat, [(f"in-{n}.csv", 1000, FileKind.DOCUMENT) for n in range(files)])
        await send(stores.db, run_id, chat, "out.png", 50, SentFileKind.PHOTO, tmp_path / run_id)
    async with stores.db.write() as conn:  # the first run's files are from two days ago
        await conn.execute("UPDATE run_files SET created_at = created_at - 2 * 86400 WHERE run_id = 'old'")
    await stores.db.close()

    mine, _ = await gather(settings, 86_400.0, CHAT)
    everyone, _ = await gather(settings, 86_400.0, None)

    assert mine.files == FileTotals(files_in=2, bytes_in=2000, files_out=1, bytes_out=50)
    assert everyone.files == FileTotals(files_in=5, bytes_in=5000, files_out=2, bytes_out=100)


async def test_web_connections_are_counted_for_the_period_and_the_chat_asked_for(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    stores = await Stores.open(settings)
    other = CHAT - 1
    runs = RunStore(stores.db)
    for run_id, chat, count in (("old", CHAT, 5), ("mine", CHAT, 2), ("theirs", other, 3)):
        await stores.chats.ensure(chat, "group", str(chat))
        await runs.create(
            run_id, chat_id=chat, turn_id=None, task="t", label="t", include_context=False, status=RunStatus.QUEUED
        )
        fetched = [allowed(run_id, chat, "pypi.org", 443, "151.101.0.223", down=1000, up=10) for _ in range(count)]
        past_the_cap = [refused(run_id, chat, "evil.example", 443, "not allowed")]  # counted, not kept
        await record(stores.db, run_id, fetched, past_the_cap)
    async with stores.db.write() as conn:  # the first run was asked for two days ago
        await conn.execute("UPDATE subagent_runs SET created_at = created_at - 2 * 86400 WHERE id = 'old'")
    await stores.db.close()

    mine, _ = await gather(settings, 86_400.0, CHAT)
    everyone, _ = await gather(settings, 86_400.0, None)

    assert mine.egress == EgressTotals(connections=3, refused=1, bytes_up=20, bytes_down=2000)
    assert everyone.egress == EgressTotals(connections=7, refused=2, bytes_up=50, bytes_down=5000)
