"""Burst: 50 spawn requests land at once; the caps must hold and no request may be lost.

The full app with the offline provider and real containers (`$ sleep 2` each), a fresh app per scenario:
- ten chats (five requests each), MAX_CONCURRENT_SUBAGENTS 3 and then 10, MAX_SUBAGENTS_PER_CHAT 10 (so
  only the global cap binds and no chat gets more rejection notices than Telegram's per-group burst), with
  SUBAGENT_QUEUE_LIMIT=0: over-cap requests are refused at once, so the runs are one wave of the cap;
- the same with cap 10 and the default queue (20): three waves;
- one chat, all 50, with the default caps (3 and 3) and queue (20, of which one chat gets half): what a
  single busy group sees.
Every scenario runs with the product's defaults otherwise.

Reported per scenario: the most containers of these chats the engine ever reported running (sampled
every 75 ms), requests accepted / rejected / lost (lost: no run record at the end), the time from the
first write until every accepted run had its final status, and until every accepted run's result had
reached its chat (the fake Telegram server's record). Baseline for both times: one request alone in the
same app, just before the burst. The cap-10 scenario (docs/performance.md's goal) runs five rounds on fresh chats
(two with --quick), each with its own lone request: both times are medians of the rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass

from bench.apps import BenchApp, bench_app
from bench.common import BenchContext, bench_settings, poll_until
from bench.engine import engine_client, running_containers_of
from bench.report import Measure, Row
from container.protocol import SpawnRequest
from core.store.runs import FINAL_STATUSES, RunRecord, RunStatus
from runner.ipc.requests import ERRORS_DIR, TASKS_DIR, ensure_chat_dirs, write_spawn_request
from tests.fakes.telegram_server import FakeTelegram

NAME = "burst"
REQUESTS = 50
TASK = "$ sleep 2"
SAMPLE_SECONDS = 0.075
WAIT_SECONDS = 180.0


@dataclass(frozen=True, slots=True)
class Scenario:
    key: str
    chats: int
    cap: int
    per_chat_cap: int
    requests: int
    queue_limit: int = 0  # SUBAGENT_QUEUE_LIMIT; 0: over-cap requests are refused at once
    rounds: int = 1  # repeated on fresh chats of the same app; times are the median of the rounds

    @property
    def label(self) -> str:
        where = "one chat" if self.chats == 1 else f"{self.chats} chats"
        queue = f", queue {self.queue_limit}" if self.queue_limit else ""
        return f"{self.requests} requests at once, {where}, cap {self.cap}{queue}"


class _Sampler:
    """Counts running containers of the given chats on the engine, keeping the largest count seen."""

    def __init__(self, chat_ids: set[int]) -> None:
        self._chat_ids = chat_ids
        self.most = 0
        self.samples = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        client = await asyncio.to_thread(engine_client)
        try:
            while not self._stop.is_set():
                running = await asyncio.to_thread(running_containers_of, client, self._chat_ids)
                self.most = max(self.most, running)
                self.samples += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), SAMPLE_SECONDS)
        finally:
            client.close()

    def stop(self) -> None:
        self._stop.set()


async def _records(bench: BenchApp, chat_ids: list[int]) -> list[RunRecord]:
    service, _ = bench.subagents()
    found: list[RunRecord] = []
    for chat_id in chat_ids:
        found += await service.runs.for_chat(chat_id, REQUESTS * 2)
    return found


async def _settled(bench: BenchApp, chat_ids: list[int], ids: set[str]) -> list[RunRecord] | None:
    """All runs of `ids` final and cleaned up, or None (runs not recorded yet count as unsettled)."""
    service, _ = bench.subagents()
    records = [r for r in await _records(bench, chat_ids) if r.id in ids]
    if len(records) < len(ids) or any(r.status not in FINAL_STATUSES for r in records):
        return None
    if any(r.id in service.live for r in records):
        return None
    return records


def _delivered(tg: FakeTelegram, chat_ids: list[int], marker: str, count: int) -> float | None:
    """When (monotonic) the last of `count` result messages containing `marker` was sent, once all were."""
    sent = [m.at for m in tg.sent_messages() if m.chat_id in chat_ids and marker in m.plain_text]
    return max(sent) if len(sent) >= count else None


@dataclass(frozen=True, slots=True)
class Round:
    """One burst and the lone request before it, on chats of their own."""

    most_running: int
    samples: int
    accepted: int
    rejected: int
    lost: int
    finished_seconds: float
    delivered_seconds: float
    alone_finished: float
    alone_delivered: float
    note: str


async def _round(
    ctx: BenchContext,
    bench: BenchApp,
    tg: FakeTelegram,
    scenario: Scenario,
    chat_ids: list[int],
    folders: dict[int, str],
) -> Round:
    ipc_root = bench.app.settings.data_dir / "ipc"
    batch = secrets.token_hex(3)

    # Baseline: one request alone.
    alone_id = f"alone-{batch}"
    t_alone, m_alone = time.time(), time.monotonic()
    request = SpawnRequest(request_id=alone_id, task=TASK, label=f"alone {batch}")
    write_spawn_request(ipc_root, folders[chat_ids[0]], request)
    (alone,) = await poll_until(lambda: _settled(bench, chat_ids, {alone_id}), WAIT_SECONDS, "the lone run")
    alone_finished = (alone.finished_at or time.time()) - t_alone
    alone_delivered = await tg.wait_until(lambda: _delivered(tg, chat_ids, f"[Task: alone {batch}]", 1), WAIT_SECONDS)
    alone_delivered -= m_alone

    # The burst.
    requests = [
        SpawnRequest(request_id=f"burst-{batch}-{i:02d}", task=TASK, label=f"burst {batch} {i}")
        for i in range(scenario.requests)
    ]
    ids = {r.request_id for r in requests}
    sampler = _Sampler(set(chat_ids))
    sampling = asyncio.create_task(sampler.run())
    t0, m0 = time.time(), time.monotonic()
    for i, request in enumerate(requests):
        write_spawn_request(ipc_root, folders[chat_ids[i % len(chat_ids)]], request)
    write_seconds = time.time() - t0
    try:
        records = await poll_until(lambda: _settled(bench, chat_ids, ids), WAIT_SECONDS, "the runs", 0.2)
    except TimeoutError:
        records = [r for r in await _records(bench, chat_ids) if r.id in ids]
        ctx.note(f"{scenario.label}: not all runs settled within {WAIT_SECONDS:g} s")
    finally:
        sampler.stop()
        await sampling
    accepted = [r for r in records if r.status != RunStatus.REJECTED]
    delivered_at = await tg.wait_until(
        lambda: _delivered(tg, chat_ids, f"[Task: burst {batch} ", len(accepted)), WAIT_SECONDS
    )
    for chat_id in chat_ids:
        await asyncio.wait_for(bench.app.wait_quiet(chat_id), WAIT_SECONDS)

    left_in_tasks = sum(len(list((ipc_root / folders[c] / TASKS_DIR).iterdir())) for c in chat_ids)
    quarantined = len(list((ipc_root / ERRORS_DIR).iterdir())) if (ipc_root / ERRORS_DIR).is_dir() else 0
    statuses: dict[str, int] = {}
    for record in accepted:
        statuses[record.status] = statuses.get(record.status, 0) + 1
    finished = [r.finished_at for r in accepted if r.finished_at is not None]
    return Round(
        most_running=sampler.most,
        samples=sampler.samples,
        accepted=len(accepted),
        rejected=sum(1 for r in records if r.status == RunStatus.REJECTED),
        lost=len(ids - {r.id for r in records}),
        finished_seconds=max(finished) - t0 if finished else float("nan"),
        delivered_seconds=delivered_at - m0,
        alone_finished=alone_finished,
        alone_delivered=alone_delivered,
        note=(
            f"accepted runs ended {statuses}; {left_in_tasks} file(s) left in tasks/, {quarantined} in errors/; "
            f"the writes took {write_seconds * 1000:.0f} ms; {sampler.samples} engine samples"
        ),
    )


def _measure(values: list[float]) -> Measure:
    return Measure.of(values) if len(values) > 1 else Measure.figure(values[0])


async def _scenario(ctx: BenchContext, scenario: Scenario, chat_offset: int) -> list[Row]:
    chat_ids = [ctx.chat_id(chat_offset + i) for i in range(scenario.chats * scenario.rounds)]
    data_dir = ctx.work_dir / f"data-{scenario.key}"
    rounds: list[Round] = []
    async with FakeTelegram() as tg:
        settings = bench_settings(
            data_dir,
            token=tg.token,
            base_url=tg.base_url,
            ALLOWED_CHAT_IDS=",".join(str(c) for c in chat_ids),
            MAX_CONCURRENT_SUBAGENTS=scenario.cap,
            MAX_SUBAGENTS_PER_CHAT=scenario.per_chat_cap,
            SUBAGENT_QUEUE_LIMIT=scenario.queue_limit,
            SUBAGENT_TIMEOUT_SECONDS=120,
        )
        folders: dict[int, str] = {}
        async with bench_app(settings, with_subagents=True) as bench:
            for chat_id in chat_ids:
                tg.add_chat(chat_id, title=f"bench burst {chat_id}")
                chat = await bench.app.stores.chats.ensure(chat_id, "supergroup", "bench burst")
                folders[chat_id] = chat.folder
                await asyncio.to_thread(ensure_chat_dirs, data_dir / "ipc", chat.folder)
            await asyncio.sleep(0.5)  # the watcher restarts for the new folders; let it settle
            for index in range(scenario.rounds):
                own = chat_ids[index * scenario.chats : (index + 1) * scenario.chats]
                rounds.append(await _round(ctx, bench, tg, scenario, own, folders))

    for index, done in enumerate(rounds):
        ctx.note(f"{scenario.label}, round {index + 1} of {len(rounds)}: {done.note}")
    counts = sorted({(r.accepted, r.rejected, r.lost) for r in rounds})
    text = ", ".join(f"{a} / {r} / {lost}" for a, r, lost in counts)
    per_round = f" in each of {len(rounds)} rounds" if len(rounds) > 1 else ""
    return [
        Row(
            bench=NAME,
            metric=f"{scenario.label}: most containers running at once",
            unit="",
            result=Measure.figure(max(r.most_running for r in rounds), sum(r.samples for r in rounds)),
            baseline_label="the cap",
            baseline=Measure.figure(scenario.cap),
        ),
        Row(
            bench=NAME,
            metric=f"{scenario.label}: accepted / rejected / lost",
            unit="",
            result=Measure.figure(rounds[-1].accepted, scenario.requests),
            text=text + per_round,
            baseline_label="requests written",
            baseline_text=str(scenario.requests),
            extra={
                "accepted": sum(r.accepted for r in rounds),
                "rejected": sum(r.rejected for r in rounds),
                "lost": sum(r.lost for r in rounds),
                "rounds": len(rounds),
            },
        ),
        Row(
            bench=NAME,
            metric=f"{scenario.label}: first write → every accepted run finished",
            unit="s",
            result=_measure([r.finished_seconds for r in rounds]),
            baseline_label="one request alone → finished",
            baseline=_measure([r.alone_finished for r in rounds]),
        ),
        Row(
            bench=NAME,
            metric=f"{scenario.label}: first write → every accepted run's result in its chat",
            unit="s",
            result=_measure([r.delivered_seconds for r in rounds]),
            baseline_label="one request alone → result in the chat",
            baseline=_measure([r.alone_delivered for r in rounds]),
        ),
    ]


async def run(ctx: BenchContext) -> list[Row]:
    scenarios = [
        Scenario("ten-chats-cap3", chats=10, cap=3, per_chat_cap=10, requests=REQUESTS),
        # The headline figure: one round is one sample of a noisy machine, so the median of several.
        Scenario("ten-chats-cap10", chats=10, cap=10, per_chat_cap=10, requests=REQUESTS, rounds=ctx.scaled(5, 2)),
        # The default queue (20, at most half of it one chat's): 30 runs in three waves of the cap.
        Scenario("ten-chats-cap10-queue", chats=10, cap=10, per_chat_cap=10, requests=REQUESTS, queue_limit=20),
        # Quick runs keep the rejection notices within Telegram's per-group burst (20), so they stay quick.
        Scenario("one-chat", chats=1, cap=3, per_chat_cap=3, requests=ctx.scaled(REQUESTS, 20), queue_limit=20),
    ]
    rows: list[Row] = []
    offset = 0
    for scenario in scenarios:
        rows += await _scenario(ctx, scenario, offset)
        offset += scenario.chats * scenario.rounds
    return rows
