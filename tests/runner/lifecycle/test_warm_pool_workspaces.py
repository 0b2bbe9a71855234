"""A chat's workspace with the warm pool on and off, on the in-memory runtime with the real service and real
SQLite: a chat whose folder holds files keeps it (mounted, never emptied, never pooled) even when an archive
appears while its runs last; an archived chat is synced with the pool off too; a claim that fails at the
engine, or a member gone before its claim, starts the run cold."""

from __future__ import annotations

import asyncio
from pathlib import Path

from container.channel import RunChannel
from container.contract import WORKSPACE_SYNC_ENV
from container.protocol import WORKSPACE_DIR
from container.task import RunResult
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.runtimes.runtime import LABEL_APP, LABEL_INSTANCE, LABEL_POOL, LABEL_RUN_ID, ContainerGone, ContainerSpec
from runner.storage.workspace_archive import WorkspaceArchives
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.runner.lifecycle.test_warm_pool import completes, members, pool_of, until_ready
from tests.runner.lifecycle_helpers import CHAT_ID, Rig, rig


def workspace_of(spec: ContainerSpec) -> Path:
    return next(m.source for m in spec.mounts if m.target == WORKSPACE_DIR)


def run_specs(r: Rig) -> list[ContainerSpec]:
    return [s for s in r.runtime.started_specs if LABEL_POOL not in s.labels]


def archive_path(r: Rig) -> Path:
    return WorkspaceArchives(r.service.paths, lambda: 10).chat(r.chat.folder).path


async def test_a_chats_folder_with_files_stays_mounted_and_whole_beside_a_pool_and_two_runs(tmp_path: Path) -> None:
    second_may_end = asyncio.Event()
    started = 0

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        nonlocal started
        task = await channel.task()
        started += 1
        if task.task == "first":
            path = archive_path(r)  # as if a push of the chat's landed meanwhile (the old design then emptied it)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"pushed")
        else:
            await second_may_end.wait()
        await channel.report(RunResult(status="completed", result=task.task))
        return 0

    async with rig(tmp_path, behaviour, SUBAGENT_WARM_POOL=2) as r:
        folder = r.service.paths.workspace(r.chat.folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "notes.txt").write_text("kept from before the pool\n")
        await until_ready(r)
        first, second = await r.spawn("first"), await r.spawn("second")
        assert await r.until_status(first, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        await r.until(lambda: first not in r.service.live)
        assert (folder / "notes.txt").read_text() == "kept from before the pool\n"  # while "second" still works
        second_may_end.set()
        assert await r.until_status(second, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        await r.settled()
        assert r.runtime.claims == []  # never pooled: a member cannot mount the chat's folder
        for spec in run_specs(r):
            assert workspace_of(spec) == folder.resolve() and WORKSPACE_SYNC_ENV not in spec.environment
        assert (folder / "notes.txt").exists()
        assert pool_of(r).counts()[2:] == (0, 2)


async def test_an_archived_chat_is_synced_with_the_pool_off(tmp_path: Path) -> None:
    async with rig(tmp_path, completes) as r:
        path = archive_path(r)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"a pushed workspace")
        run_id = await r.spawn()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        (spec,) = run_specs(r)
        assert spec.environment.get(WORKSPACE_SYNC_ENV) == "1"
        assert workspace_of(spec) == r.service.paths.run_scratch(run_id).resolve()
        await r.settled()
        assert not r.service.paths.run_scratch(run_id).exists()


async def test_a_claim_the_engine_refuses_starts_the_run_cold(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        taken = members(r)[0]

        async def retired(container_id: str, channel_dir: Path) -> None:
            raise ContainerGone(f"container {container_id[:12]} no longer exists")

        r.runtime.claim = retired  # type: ignore[method-assign]  # the member retired just before the claim
        run_id = await r.spawn()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        (spec,) = run_specs(r)  # started cold
        assert spec.environment.get(WORKSPACE_SYNC_ENV) == "1"
        await r.settled()
        assert r.runtime.container(taken.id).removed
        assert pool_of(r).counts()[2:] == (0, 1)


async def test_an_earlier_processs_scratch_and_member_folders_are_swept_at_start_with_the_pool_off(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    left = [data / "scratch" / "crashed-run", data / "scratch" / ".pool.old", data / "channels" / ".pool.old"]
    for folder in left:
        folder.mkdir(parents=True)
        (folder / "file").write_text("left by a crash")
    async with rig(tmp_path, completes) as r:
        assert not any(folder.exists() for folder in left)
        run_id = await r.spawn()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED


async def test_a_member_that_exits_before_its_task_is_served_is_a_miss_and_the_run_starts_cold(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        claim = r.runtime.claim

        async def dies_at_its_claim(container_id: str, channel_dir: Path) -> None:
            await claim(container_id, channel_dir)
            r.runtime.finish(container_id, 137)  # after the pool stopped watching it, before its task

        r.runtime.claim = dies_at_its_claim  # type: ignore[method-assign]
        run_id = await r.spawn()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        (spec,) = run_specs(r)  # started cold
        assert workspace_of(spec) == r.service.paths.run_scratch(run_id).resolve()
        await r.settled()
        (dead, _), *_ = r.runtime.claims
        assert r.runtime.container(dead).removed
        assert pool_of(r).counts()[2:] == (0, 1)


async def test_a_synced_run_reattached_after_a_restart_stays_synced_and_its_scratch_goes_with_it(
    tmp_path: Path,
) -> None:
    run_id = "synced-run-1"
    scratch = tmp_path / "data" / "scratch" / run_id
    scratch.mkdir(parents=True)  # its /workspace, as the earlier process made it

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_RUN_ID: run_id}
        container = runtime.add_existing(labels)
        runs = RunStore(stores.db)
        await runs.create(
            run_id, chat_id=CHAT_ID, turn_id=None, task="synced", label="synced",
            include_context=False, status=RunStatus.QUEUED,
        )  # fmt: skip
        await runs.mark_running(run_id, None)
        await runs.set_container(run_id, container)

    async with rig(tmp_path, completes, prepare=prepare) as r:
        assert run_id in r.service.live and scratch.is_dir()  # not swept: its run lives
        place = r.service.placements.of(run_id)
        assert place is not None and place.synced and place.folder == scratch
        (container,) = [c for c in r.runtime._containers.values() if c.labels.get(LABEL_RUN_ID) == run_id]
        r.runtime.finish(container.id, 0)
        await r.until(lambda: run_id not in r.service.live)
        assert not scratch.exists()


async def test_a_run_cancelled_while_its_dead_member_is_looked_at_starts_nothing_cold(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, SUBAGENT_WARM_POOL=2) as r:
        await until_ready(r)
        claim = r.runtime.claim

        async def dies_at_its_claim(container_id: str, channel_dir: Path) -> None:
            await claim(container_id, channel_dir)
            r.runtime.finish(container_id, 137)

        r.runtime.claim = dies_at_its_claim  # type: ignore[method-assign]
        run_id = await r.spawn()
        await r.until_status(run_id, RunStatus.RUNNING)  # its start waits to hear from the member
        assert await r.service.manager.cancel_run(CHAT_ID, run_id) == RunStatus.CANCELLED
        await r.until(lambda: run_id not in r.service.live)
        assert run_specs(r) == []  # no cold container for a cancelled run
