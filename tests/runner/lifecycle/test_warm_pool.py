"""The warm pool's lifecycle and races on the in-memory runtime: the real service, real run channels on Unix
sockets, real SQLite; each "container" a coroutine that talks to its channel as the agent does."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from container.channel import RunChannel
from container.contract import POOLED_ENV, WORKSPACE_SYNC_ENV
from container.task import RunResult
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.lifecycle.container_spec import run_container_spec
from runner.lifecycle.pool_memory import MemoryCheck
from runner.lifecycle.warm_pool import WarmPool
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_POOL_CONFIG,
    LABEL_RUN_ID,
    ContainerSpec,
)
from runner.storage.paths import DataPaths
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import make_settings
from tests.runner.lifecycle_helpers import CHAT_ID, Prepare, Rig, rig

pytestmark = pytest.mark.timeout(60)


class Concurrency:
    """Runs (containers that got a task) at once, at most."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def __call__(self, channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        await pulls_if_synced(channel, container)
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.01)
            await channel.report(RunResult(status="completed", result=f"done: {task.task}"))
        finally:
            self.now -= 1
        return 0


async def pulls_if_synced(channel: RunChannel, container: MemoryContainer) -> None:
    """As the agent does first with a synced workspace (a pooled run's always is): asks for it."""
    if container.spec is not None and container.spec.environment.get(WORKSPACE_SYNC_ENV):
        await channel.fetch_workspace(lambda response: 0)


async def completes(channel: RunChannel, container: MemoryContainer) -> int | None:
    task = await channel.task()
    await pulls_if_synced(channel, container)
    await channel.report(RunResult(status="completed", result=f"done: {task.task}"))
    return 0


def members(r: Rig) -> list[MemoryContainer]:
    return [r.runtime.container(c.id) for c in r.runtime._live() if LABEL_POOL in c.labels]


def pool_of(r: Rig) -> WarmPool:
    assert r.service.pool is not None
    return r.service.pool


async def until_ready(r: Rig, count: int = 2) -> None:
    await r.until(lambda: pool_of(r).counts()[0] == count)


async def eventually(predicate: Callable[[], bool]) -> None:
    """Until `predicate()` holds (the pool has no change events), looked at every 10 ms for up to 10 s."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("still not so after 10 s")


def hardening(spec: ContainerSpec) -> ContainerSpec:
    """A spec without what differs between a run's and a member's: name, labels, mounts' sources, environment."""
    return dataclasses.replace(spec, name="", labels={}, mounts=[], environment={})


async def test_a_run_takes_a_ready_member_made_as_its_own_container_and_the_pool_refills(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        member = members(r)[0]
        run_id = await r.spawn("pooled")
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        claimed_id, channel_dir = r.runtime.claims[0]
        assert claimed_id == member.id and channel_dir == r.service.paths.channel_dir(run_id)
        record = await r.service.runs.get(run_id)
        assert record is not None and record.container_id == member.id  # recovery re-attaches it by this id
        assert member.spec is not None
        assert member.spec.environment == {WORKSPACE_SYNC_ENV: "1", POOLED_ENV: "1"}
        assert LABEL_RUN_ID not in member.labels and member.labels[LABEL_POOL]
        cold = run_container_spec(
            r.settings, run_id="x" * 8, chat_id=CHAT_ID, instance_id="i", workspace=tmp_path, channel_dir=tmp_path
        )
        assert hardening(member.spec) == hardening(cold)  # the same user, limits, network, runtime class
        await r.settled()
        assert r.runtime.container(member.id).removed  # one run per container: never back in the pool
        await until_ready(r)  # refilled
        assert member.id not in {m.id for m in members(r)}
        _, _, hits, misses = pool_of(r).counts()
        assert (hits, misses) == (1, 0)
        assert not r.service.paths.run_scratch(run_id).exists()  # its scratch workspace went with it


async def test_a_member_killed_from_outside_while_idle_is_replaced_and_never_handed_to_a_run(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        killed = members(r)[0]
        r.runtime.finish(killed.id, 137)
        await r.until(lambda: r.runtime.container(killed.id).removed)
        await until_ready(r)
        run_id = await r.spawn()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        assert killed.id not in {claimed for claimed, _ in r.runtime.claims}


async def test_a_burst_of_50_on_a_pool_of_2_loses_none_and_holds_the_cap(tmp_path: Path) -> None:
    runs = Concurrency()
    # A queue whose one-chat share (half) holds the whole burst: every request is run, none refused.
    async with rig(tmp_path, runs, SUBAGENT_QUEUE_LIMIT=100, MAX_CONCURRENT_SUBAGENTS=3, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        run_ids = [await r.spawn(f"burst {i}") for i in range(50)]
        for run_id in run_ids:
            assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        assert runs.most <= 3
        _, _, hits, misses = pool_of(r).counts()
        assert hits >= 2 and hits + misses == 50  # the rest started cold, as without a pool
        await r.settled()


async def test_an_image_rebuilt_under_the_same_tag_drains_the_pool_and_the_next_run_is_cold(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        old = {m.id: m.labels[LABEL_POOL_CONFIG] for m in members(r)}
        r.runtime.image_generation += 1
        run_id = await r.spawn()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        assert r.runtime.claims == []  # cold: no stale member was claimed
        assert all(r.runtime.container(member_id).removed for member_id in old)
        await until_ready(r)
        assert {m.labels[LABEL_POOL_CONFIG] for m in members(r)}.isdisjoint(old.values())
        assert pool_of(r).counts()[3] == 1  # one miss


async def test_the_engine_away_with_a_full_pool_pauses_refilling_and_runs_are_not_lost(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        r.runtime.set_engine_down(True)
        dead = {member.id for member in members(r)}
        for member in members(r):  # an engine restart ends its containers
            r.runtime.finish(member.id, 137)
        run_id = await r.spawn("while the engine is away")
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.FAILED
        await r.until(lambda: pool_of(r).paused is not None)
        r.runtime.set_engine_down(False)
        await r.until(lambda: pool_of(r).paused is None)  # the dead members seen and replaced
        await until_ready(r)
        assert not ({m.id for m in members(r)} & dead)
        later = await r.spawn("after")
        assert await r.until_status(later, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED


async def test_a_member_whose_agent_never_comes_up_is_removed_and_the_reason_kept(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=1)

    async def silent(container: MemoryContainer) -> int | None:
        await asyncio.Event().wait()  # never connects
        return None

    async with MemoryRuntime(on_start=silent) as runtime:
        pool = WarmPool(settings, runtime, DataPaths(settings.data_dir), image_id=runtime.image_id, ready_seconds=0.1)
        pool.start()
        try:
            await runtime.until(lambda: len(runtime.removed) >= 1)
            await eventually(lambda: pool.paused is not None)
            assert "did not come up" in (pool.paused or "")
            assert pool.counts()[0] == 0
            assert await pool.claim("run-000001") is None
        finally:
            await pool.close()
        assert runtime.started_specs and runtime.running_count() == 0  # tried, and nothing left running


async def test_memory_pressure_stops_refilling_with_its_reason(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=2)
    async with MemoryRuntime() as runtime:
        pool = WarmPool(
            settings,
            runtime,
            DataPaths(settings.data_dir),
            image_id=runtime.image_id,
            memory=MemoryCheck(available=lambda: 300 * 1024 * 1024),
        )
        pool.start()
        try:
            await eventually(lambda: pool.paused is not None)
            assert (pool.paused or "").startswith("memory: 300 MiB available")
            assert runtime.started_specs == []
        finally:
            await pool.close()


def left_pool(claimed_run: str) -> Prepare:
    """An earlier process's pool: two members no run claimed, and one a running run had claimed."""

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_POOL_CONFIG: "old"}
        for member in ("idle-1", "idle-2"):
            runtime.add_existing({**labels, LABEL_POOL: member})
        claimed = runtime.add_existing({**labels, LABEL_POOL: "claimed"})
        runs = RunStore(stores.db)
        await runs.create(
            claimed_run, chat_id=CHAT_ID, turn_id=None, task="claimed", label="claimed",
            include_context=False, status=RunStatus.QUEUED,
        )  # fmt: skip
        await runs.mark_running(claimed_run, None)
        await runs.set_container(claimed_run, claimed)

    return prepare


async def test_recovery_removes_unclaimed_members_and_reattaches_a_claimed_one(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, prepare=left_pool("claimed-run-1"), SUBAGENT_WARM_POOL=2) as r:
        left = {c.labels[LABEL_POOL]: c for c in r.runtime._containers.values() if c.spec is None}
        assert left["idle-1"].removed and left["idle-2"].removed
        assert not left["claimed"].removed  # re-attached with its run, by the container id on its record
        assert "claimed-run-1" in r.service.live
        socket = r.service.paths.channel_dir("claimed-run-1") / "run.sock"
        await r.until(socket.exists)
        async with RunChannel(socket) as channel:
            await channel.report(RunResult(status="completed", result="finished across the restart"))
        r.runtime.finish(left["claimed"].id, 0)
        status = await r.until_status("claimed-run-1", RunStatus.COMPLETED, RunStatus.FAILED)
        assert status == RunStatus.COMPLETED
        await until_ready(r)  # the new process's own pool, filled after recovery
