"""The queue over the caps (SUBAGENT_QUEUE_LIMIT): requests wait and start as slots free, fairly across
chats, cancels and merges reach them in the queue, and a restart keeps their order. Real store, real run
channels, the in-memory container runtime; each container waits for the test to let it finish."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from container.channel import RunChannel
from container.task import RunResult
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID, LABEL_INSTANCE, LABEL_RUN_ID
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.runner.lifecycle_helpers import CHAT_ID, OTHER_CHAT_ID, Rig, rig

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("both_backends")]

THIRD_CHAT_ID = -1003


class Gates:
    """One gate per run: its container runs until the test opens it, then reports and exits."""

    def __init__(self) -> None:
        self._gates: dict[str, asyncio.Event] = {}

    def gate(self, run_id: str) -> asyncio.Event:
        return self._gates.setdefault(run_id, asyncio.Event())

    def open(self, run_id: str) -> None:
        self.gate(run_id).set()

    async def behaviour(self, channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        await self.gate(container.labels[LABEL_RUN_ID]).wait()
        await channel.report(RunResult(status="completed", result=f"done: {task.task}"))
        return 0


def started(r: Rig) -> list[str]:
    """Run ids in the order their containers were started."""
    return [spec.labels[LABEL_RUN_ID] for spec in r.runtime.started_specs]


async def test_a_burst_from_three_chats_runs_in_turn_fairly_within_the_cap(tmp_path: Path) -> None:
    gates = Gates()
    async with rig(
        tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=2, MAX_SUBAGENTS_PER_CHAT=2, SUBAGENT_QUEUE_LIMIT=10
    ) as r:
        await r.stores.chats.ensure(THIRD_CHAT_ID, "group", "third")
        # One chat's burst first, then one request each from two other chats.
        a = [await r.spawn(f"a{i}") for i in range(4)]
        b = await r.spawn("b0", chat_id=OTHER_CHAT_ID)
        c = await r.spawn("c0", chat_id=THIRD_CHAT_ID)
        for run_id in [*a[2:], b, c]:
            assert await r.status(run_id) == RunStatus.QUEUED
        await r.until(lambda: len(started(r)) == 2)
        assert set(started(r)) == set(a[:2])  # started together: either may reach the engine first

        # Free one slot at a time: each time exactly one waiting run takes it.
        for finished in range(4):
            gates.open(started(r)[finished])
            await r.until(lambda n=finished: len(started(r)) == n + 3)  # type: ignore[misc]
        for run_id in started(r):
            gates.open(run_id)
        await r.settled()

        # The other chats did not wait behind the first chat's burst (arrival order would be a2, a3, b, c).
        assert started(r)[2:] == [b, c, a[2], a[3]]
        assert r.runtime.max_running == 2
        for run_id in [*a, b, c]:
            assert await r.status(run_id) == RunStatus.COMPLETED
        await r.until(lambda: sum("done: " in t for t in r.texts()) == 4)
        await r.until(lambda: any("done: b0" in t for t in r.texts(OTHER_CHAT_ID)))
        await r.until(lambda: any("done: c0" in t for t in r.texts(THIRD_CHAT_ID)))
        # Each chat learnt its place in the queue.
        await r.until(lambda: any("queued, 2 ahead" in t for t in r.texts(OTHER_CHAT_ID)))
        await r.until(lambda: any("queued, 3 ahead" in t for t in r.texts(THIRD_CHAT_ID)))
        await r.until(lambda: any("2 tasks are queued, 0 ahead" in t for t in r.texts()))


async def test_the_per_chat_cap_holds_for_runs_leaving_the_queue(tmp_path: Path) -> None:
    gates = Gates()
    async with rig(
        tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=3, MAX_SUBAGENTS_PER_CHAT=1, SUBAGENT_QUEUE_LIMIT=10
    ) as r:
        first, second = await r.spawn("one"), await r.spawn("two")
        other = await r.spawn("other", chat_id=OTHER_CHAT_ID)
        await r.until(lambda: len(started(r)) == 2)
        assert set(started(r)) == {first, other}  # a free global slot, but this chat has its one
        assert await r.status(second) == RunStatus.QUEUED
        gates.open(first)
        await r.until(lambda: len(started(r)) == 3)
        assert started(r)[2] == second
        gates.open(second)
        gates.open(other)
        await r.settled()


async def test_beyond_the_queue_limit_or_a_chats_share_of_it_requests_are_refused_as_before(tmp_path: Path) -> None:
    gates = Gates()
    async with rig(tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=3) as r:
        first = await r.spawn("job a0")  # takes the slot
        mine = [await r.spawn(f"job a{i}") for i in range(1, 4)]  # two wait (half the queue), one is refused
        other = [await r.spawn(f"job b{i}", chat_id=OTHER_CHAT_ID) for i in range(2)]  # one waits: the queue is full
        assert [await r.status(i) for i in [*mine, *other]] == [
            RunStatus.QUEUED,
            RunStatus.QUEUED,
            RunStatus.REJECTED,
            RunStatus.QUEUED,
            RunStatus.REJECTED,
        ]
        await r.until(lambda: any("not started" in t for t in r.texts()))
        for run_id in [first, *mine, *other]:
            gates.open(run_id)
        await r.settled()
        assert sorted(started(r)) == sorted([first, mine[0], mine[1], other[0]])


async def test_a_queued_run_cancelled_by_a_merge_or_a_cancel_never_starts(tmp_path: Path) -> None:
    gates = Gates()
    async with rig(tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=10) as r:
        running = await r.spawn("running", turn_id=None)
        merged = await r.spawn("merged away", turn_id="turn-1")
        cancelled = await r.spawn("cancelled", turn_id=None)
        kept = await r.spawn("kept", turn_id=None)
        await r.until(lambda: len(started(r)) == 1)

        # What the engine does when a merge aborts turn-1 (MERGE_CANCEL_SCOPE=turn).
        assert await r.service.manager.cancel_turn("turn-1", "turn aborted (merged)") == 1
        assert await r.service.manager.cancel_run(CHAT_ID, cancelled) == RunStatus.CANCELLED

        gates.open(running)
        await r.until(lambda: len(started(r)) == 2)
        gates.open(kept)
        await r.settled()
        assert started(r) == [running, kept]
        assert await r.status(merged) == RunStatus.CANCELLED
        assert await r.status(cancelled) == RunStatus.CANCELLED
        assert await r.status(kept) == RunStatus.COMPLETED


def left_queued(run_ids: list[str], running_id: str, containers: dict[str, str]):  # type: ignore[no-untyped-def]
    """The scene a killed process left: one run with its container running, and requests waiting."""

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        runs = RunStore(stores.db)
        for run_id in [running_id, *run_ids]:
            await runs.create(
                run_id,
                chat_id=CHAT_ID,
                turn_id=None,
                task=f"task {run_id}",
                label=run_id,
                include_context=False,
                status=RunStatus.QUEUED,
            )
        await runs.mark_running(running_id, None)
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_RUN_ID: running_id, LABEL_CHAT_ID: str(CHAT_ID)}
        containers[running_id] = runtime.add_existing(labels)
        await runs.set_container(running_id, containers[running_id])

    return prepare


async def test_the_queue_survives_a_restart_in_order_within_the_cap(tmp_path: Path) -> None:
    gates = Gates()
    waiting = ["queued-1", "queued-2", "queued-3"]
    containers: dict[str, str] = {}
    prepare = left_queued(waiting, "old-run", containers)
    async with rig(tmp_path, gates.behaviour, prepare=prepare, MAX_CONCURRENT_SUBAGENTS=1) as r:
        # The survivor holds the one slot: nothing of the queue starts beside it.
        assert r.service.live.count() == 1
        assert [await r.status(i) for i in waiting] == [RunStatus.QUEUED] * 3
        assert started(r) == []
        r.runtime.finish(containers["old-run"], 0)
        for n, run_id in enumerate(waiting):
            await r.until(lambda n=n: len(started(r)) == n + 1)  # type: ignore[misc]
            assert started(r)[n] == run_id
            gates.open(run_id)
        await r.settled()
        assert r.runtime.max_running == 1
