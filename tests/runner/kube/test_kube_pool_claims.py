"""A pool member's bridge and claim on the Job runtime, fast: the real KubeRuntime over the in-memory API
(tests/fakes/memory_kube.py) with bridges that record where they were pointed. The real bridge and cluster are
in test_pod_bridge.py and test_kube_pool.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from container.contract import BRIDGE_TARGET_EGRESS, BRIDGE_TARGET_RUN, CHANNEL_SOCKET_FILE, EGRESS_SOCKET_FILE
from core.setting_runtime import PullPolicy
from core.settings import load_settings
from runner.kube.job_spec import JobOptions
from runner.kube.kube_runtime import SIGKILL_EXIT_CODE, KubeRuntime
from runner.lifecycle.container_spec import pool_container_spec
from runner.runtimes.runtime import ContainerGone, ContainerSpec, ContainerStartError
from runner.storage.paths import DataPaths
from tests.fakes.memory_kube import MemoryKube
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime

WAIT_SECONDS = 10.0


class RecordingBridge:
    def __init__(self, job: str, sockets: Mapping[str, Path | None], pooled: bool) -> None:
        self.job = job
        self.pointed = [dict(sockets)]  # where it was made towards, then each repoint
        self.pooled = pooled
        self.closed = False

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.closed = True

    def repoint(self, sockets: Mapping[str, Path | None]) -> None:
        self.pointed.append(dict(sockets))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.paths = DataPaths(tmp_path / "data")
        self.settings = load_settings(DATA_DIR=str(self.paths.data_dir), SUBAGENT_RUNTIME="kubernetes")
        self.engine = MemoryRuntime(on_start=idle)
        self.api = MemoryKube(self.engine, asyncio.get_running_loop(), self.paths.channel_dir)
        self.bridges: list[RecordingBridge] = []
        self.made = asyncio.Event()  # set and replaced at each bridge made

    def runtime(self, *, pool_idle_seconds: float = 3_600) -> KubeRuntime:
        options = JobOptions("memory", PullPolicy.NEVER, 600, 300, 16)

        def bridge(
            job: str, pod: str, sockets: dict[str, Path | None], still_running: object, pooled: bool
        ) -> RecordingBridge:
            made = RecordingBridge(job, sockets, pooled)
            self.bridges.append(made)
            self.made.set()
            self.made = asyncio.Event()
            return made

        return KubeRuntime(
            self.api,
            max_concurrency=4,
            options=lambda: options,
            bridges=bridge,
            channel_dir=self.paths.channel_dir,
            wait_slice_seconds=1,
            pool_idle_seconds=pool_idle_seconds,
        )

    def member(self, member_id: str = "m0000001") -> ContainerSpec:
        channel_dir = self.paths.pool_channel_dir(member_id)
        channel_dir.mkdir(parents=True)
        (channel_dir / CHANNEL_SOCKET_FILE).touch()  # the pool's listening socket, in the test a file
        return pool_container_spec(
            self.settings,
            member_id=member_id,
            instance_id="test",
            channel_dir=channel_dir,
            workspace=self.paths.pool_scratch(member_id),
            image_id="sha256:0123456789abcdef",
        )

    async def bridge_of(self, job: str, count: int = 1) -> RecordingBridge:
        async with asyncio.timeout(WAIT_SECONDS):
            while len(made := [b for b in self.bridges if b.job == job]) < count:
                await self.made.wait()
        return made[-1]


async def idle(container: MemoryContainer) -> int | None:
    await asyncio.Event().wait()  # an idle member's agent: waits until it is killed
    return None


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    yield Rig(tmp_path)


def run_folder(rig: Rig, member_id: str, run_id: str, *, door: bool) -> Path:
    """What the pool does at a claim: the member's folder renamed to the run's (and the run's door opened)."""
    run_dir = rig.paths.channel_dir(run_id)
    rig.paths.pool_channel_dir(member_id).rename(run_dir)
    if door:
        (run_dir / EGRESS_SOCKET_FILE).touch()
    return run_dir


async def test_a_members_bridge_is_made_towards_its_folder_and_a_claim_repoints_it_at_the_runs(rig: Rig) -> None:
    runtime = rig.runtime()
    job = await runtime.start(rig.member())
    bridge = await rig.bridge_of(job)
    member_dir = rig.paths.pool_channel_dir("m0000001")
    assert bridge.pooled  # its exec listens for the door too when egress is on: a run may have one
    assert bridge.pointed == [{BRIDGE_TARGET_RUN: member_dir / CHANNEL_SOCKET_FILE, BRIDGE_TARGET_EGRESS: None}]
    run_dir = run_folder(rig, "m0000001", "run-aaaaaa", door=True)
    await runtime.claim(job, run_dir)
    assert bridge.pointed[-1] == {
        BRIDGE_TARGET_RUN: run_dir / CHANNEL_SOCKET_FILE,
        BRIDGE_TARGET_EGRESS: run_dir / EGRESS_SOCKET_FILE,
    }
    assert len(rig.bridges) == 1  # no new bridge (no exec) for the claim
    await runtime.kill(job)
    async with asyncio.timeout(WAIT_SECONDS):
        assert await runtime.wait(job) == SIGKILL_EXIT_CODE
    await runtime.remove(job)
    assert bridge.closed
    await runtime.close()


async def test_after_a_restart_a_claimed_member_is_bridged_again_towards_its_runs_folder(rig: Rig) -> None:
    before = rig.runtime()
    job = await before.start(rig.member())
    await rig.bridge_of(job)
    run_dir = run_folder(rig, "m0000001", "run-bbbbbb", door=False)
    await before.claim(job, run_dir)
    await before.close()  # the bot restarts; the member's Job runs on
    after = rig.runtime()
    async with asyncio.timeout(WAIT_SECONDS):
        assert await after.wait(job, timeout_seconds=0.1) is None  # re-attached by its Job name: still running
    assert len(rig.bridges) == 1  # no run id on a member's Job: its bridge waits for the claim to know its folder
    await after.claim(job, run_dir)
    again = await rig.bridge_of(job, count=2)
    assert again.pointed == [
        {BRIDGE_TARGET_RUN: run_dir / CHANNEL_SOCKET_FILE, BRIDGE_TARGET_EGRESS: run_dir / EGRESS_SOCKET_FILE}
    ]  # the door's socket is looked for when a stream opens: a claim comes before the run's door opens
    await after.kill(job)
    await after.close()


async def test_a_member_idle_too_long_is_retired_and_cannot_be_claimed(rig: Rig) -> None:
    runtime = rig.runtime(pool_idle_seconds=0.05)
    job = await runtime.start(rig.member())
    async with asyncio.timeout(WAIT_SECONDS):
        assert await runtime.wait(job) == SIGKILL_EXIT_CODE  # the pool's waiter sees it end, and replaces it
    with pytest.raises(ContainerGone):
        await runtime.claim(job, rig.paths.channel_dir("run-cccccc"))
    await runtime.close()


async def test_a_claimed_member_is_not_retired(rig: Rig) -> None:
    runtime = rig.runtime(pool_idle_seconds=0.2)
    job = await runtime.start(rig.member())
    await rig.bridge_of(job)
    await runtime.claim(job, run_folder(rig, "m0000001", "run-dddddd", door=False))
    async with asyncio.timeout(WAIT_SECONDS):
        assert await runtime.wait(job, timeout_seconds=0.5) is None  # past the idle limit, still its run's
    await runtime.kill(job)
    await runtime.close()


async def test_the_image_id_is_the_names_until_a_pod_runs_another_image_then_that_ones(rig: Rig) -> None:
    runtime = rig.runtime()
    image = rig.settings.subagent_image
    assert await runtime.image_id(image) == image  # no pod has run yet: members are made under the name
    first = await runtime.start(rig.member("m0000001"))
    await rig.bridge_of(first)
    assert await runtime.image_id(image) == image  # the first pod's image is the name's: those members stay good
    rig.engine.image_generation += 1  # rebuilt and loaded under the same tag
    second = await runtime.start(rig.member("m0000002"))
    await rig.bridge_of(second)
    changed = await runtime.image_id(image)
    assert changed not in (None, image)  # the pool's fingerprint changes: the members made before are drained
    third = await runtime.start(rig.member("m0000003"))
    await rig.bridge_of(third)
    assert await runtime.image_id(image) == changed  # and stays
    await runtime.close()


async def test_a_member_whose_pod_runs_an_older_image_than_the_newest_seen_is_refused_at_its_claim(rig: Rig) -> None:
    runtime = rig.runtime()
    old = await runtime.start(rig.member("m0000001"))
    await rig.bridge_of(old)
    rig.engine.image_generation += 1  # rebuilt and loaded under the same tag: the next pod runs the new one
    new = await runtime.start(rig.member("m0000002"))
    await rig.bridge_of(new)
    with pytest.raises(ContainerStartError, match="not the newest"):
        await runtime.claim(old, run_folder(rig, "m0000001", "run-old-img", door=False))
    await runtime.claim(new, run_folder(rig, "m0000002", "run-new-img", door=False))
    for job in (old, new):
        await runtime.kill(job)
    await runtime.close()
