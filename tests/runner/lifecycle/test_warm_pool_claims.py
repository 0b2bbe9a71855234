"""Claims at the pool's edges, on the in-memory runtime and the real file system: a re-queued run's leftover
folders never drain the pool, a claim the engine cannot vouch for is a miss (not a drain), a claim racing the
pool's close or its run's cancel takes nothing, and an image missing while refilling pauses with its reason."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from container.channel import RunChannel
from core.store.chats import Chat
from core.store.runs import RunStore
from core.stores import Stores
from runner.lifecycle.container_spec import pool_config, pool_container_spec
from runner.lifecycle.run_container import RunContainers
from runner.lifecycle.warm_pool import WarmPool
from runner.runs.live_runs import LiveRun
from runner.runtimes.runtime import LABEL_POOL_CONFIG
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import WorkspaceArchives
from runner.storage.workspace_placement import WorkspacePlacements
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import make_settings
from tests.runner.lifecycle.test_warm_pool import eventually
from tests.runner.lifecycle_helpers import socket_of

pytestmark = pytest.mark.timeout(60)


async def waits_for_its_task(container: MemoryContainer) -> int | None:
    async with RunChannel(socket_of(container)) as channel:
        await channel.task()
    return 0


@asynccontextmanager
async def ready_pool(tmp_path: Path, **image: Any) -> AsyncIterator[tuple[WarmPool, MemoryRuntime, DataPaths]]:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=2)
    paths = DataPaths(settings.data_dir)
    async with MemoryRuntime(on_start=waits_for_its_task) as runtime:
        pool = WarmPool(settings, runtime, paths, image_id=image.get("image_id", runtime.image_id))
        pool.start()
        try:
            await eventually(lambda: pool.counts()[0] == 2)
            yield pool, runtime, paths
        finally:
            await pool.close()
            await runtime.stop_behaviours()


async def test_a_requeued_runs_leftover_folders_are_removed_and_the_pool_is_not_drained(tmp_path: Path) -> None:
    async with ready_pool(tmp_path) as (pool, runtime, paths):
        run_id = "requeued-run"
        for leftover in (paths.channel_dir(run_id), paths.run_scratch(run_id)):  # a crash after an earlier claim
            leftover.mkdir(parents=True)
            (leftover / "left").write_text("by the earlier attempt")
        claimed = await pool.claim(run_id)
        assert claimed is not None
        assert not (paths.run_scratch(run_id) / "left").exists() and not (paths.channel_dir(run_id) / "left").exists()
        assert pool.counts()[0] == 1  # the other member is still ready
        claimed.listening.close()
        await runtime.remove(claimed.container_id)


async def test_a_claim_the_engine_cannot_vouch_for_is_a_miss_and_drains_nothing(tmp_path: Path) -> None:
    async with ready_pool(tmp_path) as (pool, runtime, _):
        runtime.set_engine_down(True)
        assert await pool.claim("run-while-away") is None
        assert pool.counts()[0] == 2 and pool.counts()[3] == 1
        runtime.set_engine_down(False)


async def test_a_claim_that_resumes_after_close_began_takes_nothing(tmp_path: Path) -> None:
    release = asyncio.Event()
    blocking = False

    async def image_id(image: str) -> str | None:
        if blocking:
            await release.wait()
        return "sha256:one"

    async with ready_pool(tmp_path, image_id=image_id) as (pool, runtime, _):
        blocking = True
        claim = asyncio.create_task(pool.claim("run-at-shutdown"))
        await asyncio.sleep(0.01)
        release.set()
        await pool.close()
        assert await claim is None
        assert runtime.claims == []


async def test_a_run_cancelled_before_its_claim_takes_no_member(tmp_path: Path) -> None:
    async with ready_pool(tmp_path) as (pool, runtime, paths):
        settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=2)
        placements = WorkspacePlacements(paths, WorkspaceArchives(paths, lambda: 10))
        stores = await Stores.open(settings)
        try:
            containers = RunContainers(settings, runtime, paths, RunStore(stores.db), pool=pool, placements=placements)
            live = LiveRun(id="cancelled-run", chat_id=1, turn_id=None, label="x", cancelled=True)
            assert await containers.claim(live, Chat(1, "group", "t", "chat_1")) is None
            assert pool.counts()[0] == 2 and pool.counts()[2] == 0
            await containers.release(live)
        finally:
            await stores.db.close()


async def test_an_image_missing_while_refilling_pauses_with_its_reason(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=1)
    async with MemoryRuntime(images=set(), on_start=waits_for_its_task) as runtime:
        pool = WarmPool(settings, runtime, DataPaths(settings.data_dir), image_id=runtime.image_id)
        pool.start()
        try:
            await eventually(lambda: pool.paused is not None)
            assert (pool.paused or "").startswith("ContainerStartError: image") and "not found" in (pool.paused or "")
        finally:
            await pool.close()


def test_a_members_fingerprint_is_its_own_specs_not_one_taken_before_it_was_built(tmp_path: Path) -> None:
    before = make_settings(tmp_path / "data", SUBAGENT_MEMORY="512m")
    built_with = make_settings(tmp_path / "data", SUBAGENT_MEMORY="768m")  # the live setting changed meanwhile
    spec = pool_container_spec(
        built_with, member_id="m1", instance_id="i", channel_dir=tmp_path, workspace=tmp_path, image_id="sha256:1"
    )
    assert spec.memory == "768m"
    assert spec.labels[LABEL_POOL_CONFIG] == pool_config(built_with, "sha256:1")
    assert spec.labels[LABEL_POOL_CONFIG] != pool_config(before, "sha256:1")
    assert pool_config(built_with, "sha256:1") != pool_config(built_with, "sha256:2")
