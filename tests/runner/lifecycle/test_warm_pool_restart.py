"""A restart across a warm pool claim, on the in-memory runtime (and the Job runtime over its fake API) with the
real service and real SQLite: a claimed member's id is on its run's record before the claim goes on, so the next
start finds it (a run still queued starts again and its member is removed; a running one is re-attached, its time
limit counted from its run's start, not its member's); re-attached runs take back their workspace placements
before a queued run of their chat is placed; a pooled agent is answered its task only once its run is running."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from container.channel import RunChannel
from container.contract import WORKSPACE_SYNC_ENV
from container.task import RunResult
from core.store.runs import RunRecord, RunStatus, RunStore
from core.stores import Stores
from runner.lifecycle.run_container import RunContainers
from runner.runs.live_runs import LiveRun
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_CHAT_ID,
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_POOL_CONFIG,
    LABEL_RUN_ID,
)
from runner.storage.paths import DataPaths
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.runner.lifecycle.test_warm_pool import completes, until_ready
from tests.runner.lifecycle.test_warm_pool_workspaces import run_specs, workspace_of
from tests.runner.lifecycle_helpers import BACKEND, CHAT_ID, Prepare, Rig, completing, rig

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("both_backends")]

HOUR_SECONDS = 3600.0


def engine_id(runtime: MemoryRuntime, container_id: str) -> str:
    """The container's id as the runtime in use names it: the engine's, or on Kubernetes its Job's name."""
    return container_id if BACKEND.get() == "docker" else runtime.container(container_id).name


async def left_run(stores: Stores, run_id: str, status: RunStatus) -> RunStore:
    runs = RunStore(stores.db)
    await runs.create(
        run_id, chat_id=CHAT_ID, turn_id=None, task="left behind", label="left behind",
        include_context=False, status=RunStatus.QUEUED,
    )  # fmt: skip
    if status is RunStatus.RUNNING:
        await runs.mark_running(run_id, None)
    return runs


def claimed_member(run_id: str, status: RunStatus, *, member_started_at: float = 0.0) -> Prepare:
    """An earlier process that died after `run_id` claimed a member (its id on the run's record), the run
    recorded `status` (queued: before it was marked running)."""

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_POOL: "claimed", LABEL_POOL_CONFIG: "old"}
        member = runtime.add_existing(labels, started_at=member_started_at)
        runs = await left_run(stores, run_id, status)
        await runs.set_container(run_id, engine_id(runtime, member))

    return prepare


def left_members(r: Rig) -> list[MemoryContainer]:
    return [c for c in r.runtime._containers.values() if c.spec is None and LABEL_POOL in c.labels]


async def test_a_claimed_members_id_is_on_its_runs_record_before_the_claim_goes_on(tmp_path: Path) -> None:
    seen: list[tuple[RunRecord | None, str]] = []
    go_on = asyncio.Event()
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=1) as r:
        await until_ready(r, 1)
        engine = r.service.runtime
        claim = engine.claim

        async def held(container_id: str, channel_dir: Path) -> None:  # a crash here leaves a run recovery can find
            seen.append((await r.service.runs.get(channel_dir.name), container_id))
            await go_on.wait()
            await claim(container_id, channel_dir)

        engine.claim = held  # type: ignore[method-assign]
        run_id = await r.spawn()
        try:
            await r.until(lambda: bool(seen))
            ((record, member),) = seen
            assert record is not None and record.status == RunStatus.QUEUED
            assert record.container_id == member
        finally:
            go_on.set()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        assert run_specs(r) == []  # served by the member it claimed


async def test_a_member_claimed_by_a_run_still_queued_is_removed_and_the_run_starts_again(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    channel_dir, scratch = paths.channel_dir("queued-run-1"), paths.run_scratch("queued-run-1")
    channel_dir.mkdir(parents=True)  # the member's folders, renamed the run's by the claim
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:  # the dead process's socket file stays
        listening.bind(str(channel_dir / "run.sock"))
    scratch.mkdir(parents=True)
    (scratch / "left").write_text("by the member")
    async with rig(tmp_path, completing("done"), prepare=claimed_member("queued-run-1", RunStatus.QUEUED)) as r:
        (member,) = left_members(r)
        assert member.removed  # its agent had no task: nothing of it to re-attach, and nothing leaks
        assert await r.until_status("queued-run-1", RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        record = await r.service.runs.get("queued-run-1")
        assert record is not None and record.container_id not in (None, engine_id(r.runtime, member.id))
        assert sum("done: left behind" in text for text in r.texts()) == 1  # its one result, from the restart
        await r.settled()
        assert not scratch.exists()
        assert len(run_specs(r)) == 1


async def test_a_running_run_on_a_member_is_reattached_with_its_time_limit_from_its_own_start(tmp_path: Path) -> None:
    run_id = "pooled-run-1"
    prepare = claimed_member(run_id, RunStatus.RUNNING, member_started_at=time.time() - HOUR_SECONDS)
    async with rig(tmp_path, completes, prepare=prepare, SUBAGENT_TIMEOUT_SECONDS=600) as r:
        (member,) = left_members(r)
        assert not member.removed and run_id in r.service.live
        place = r.service.placements.of(run_id)
        assert place is not None and place.synced  # a member's run is always synced
        socket = r.service.paths.channel_dir(run_id) / "run.sock"
        await r.until(socket.exists)
        async with RunChannel(socket) as channel:
            await channel.report(RunResult(status="completed", result="finished across the restart"))
        r.runtime.finish(member.id, 0)
        # Counted from the member's start (an hour ago), its 10 minutes would have been over at once.
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED


async def test_a_queued_run_after_a_restart_takes_the_way_of_its_chats_reattached_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chat's folder is empty and the pool on, so a new run of it alone would be synced; its run re-attached
    from before the restart mounts the folder, so the queued one must too (one chat, one workspace)."""
    if BACKEND.get() == "kubernetes":
        pytest.skip("every run of a pod is synced: a chat's runs there have one way only")
    reattached, queued = "folder-run-1", "queued-run-2"

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_RUN_ID: reattached, LABEL_CHAT_ID: str(CHAT_ID)}
        container = runtime.add_existing(labels)  # no scratch folder of its own: it mounts the chat's folder
        runs = await left_run(stores, reattached, RunStatus.RUNNING)
        await runs.set_container(reattached, engine_id(runtime, container))
        await left_run(stores, queued, RunStatus.QUEUED)

    reattach = RunContainers.reattached

    async def slow(self: RunContainers, live: LiveRun, chat: object) -> None:  # a slow store or engine at its start
        await asyncio.sleep(0.3)
        await reattach(self, live, chat)  # type: ignore[arg-type]

    monkeypatch.setattr(RunContainers, "reattached", slow)
    async with rig(tmp_path, completes, prepare=prepare, SUBAGENT_WARM_POOL=2) as r:
        assert await r.until_status(queued, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        (spec,) = run_specs(r)
        assert WORKSPACE_SYNC_ENV not in spec.environment
        assert workspace_of(spec) == r.service.paths.workspace(r.chat.folder).resolve()
        socket = r.service.paths.channel_dir(reattached) / "run.sock"
        await r.until(socket.exists)
        async with RunChannel(socket) as channel:
            await channel.report(RunResult(status="completed", result="done"))
        (left,) = [c for c in r.runtime._containers.values() if c.labels.get(LABEL_RUN_ID) == reattached]
        r.runtime.finish(left.id, 0)
        assert await r.until_status(reattached, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED


async def test_a_pooled_agent_is_answered_its_task_only_once_its_run_is_marked_running(tmp_path: Path) -> None:
    statuses: list[str] = []
    rigged: list[Rig] = []

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        record = await rigged[0].service.runs.get(task.run_id)
        statuses.append(record.status if record is not None else "missing")
        return await completes_after_task(channel, container, task.task)

    async with rig(tmp_path, behaviour, SUBAGENT_WARM_POOL=1) as r:
        rigged.append(r)
        await until_ready(r, 1)
        mark_running = r.service.runs.mark_running

        async def slow_mark(run_id: str, session_in: str | None) -> bool:  # a busy database
            await asyncio.sleep(0.3)
            return await mark_running(run_id, session_in)

        r.service.runs.mark_running = slow_mark  # type: ignore[method-assign]
        run_id = await r.spawn()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        assert run_specs(r) == []  # pooled
        assert statuses == [RunStatus.RUNNING]


async def completes_after_task(channel: RunChannel, container: MemoryContainer, text: str) -> int:
    if container.spec is not None and container.spec.environment.get(WORKSPACE_SYNC_ENV):
        await channel.fetch_workspace(lambda response: 0)
    await channel.report(RunResult(status="completed", result=f"done: {text}"))
    return 0
