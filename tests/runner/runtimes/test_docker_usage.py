"""DockerRuntime.usage against the real engine: a running container's peak memory and CPU time, and
nothing once it has exited (the engine forgets them: why the supervisor samples while it runs). A local
engine's figures come from the container's cgroup files, without the engine's one-second stats call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import docker
import pytest

from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.resource_use import cgroup_sample
from runner.runtimes.runtime import ContainerSpec
from tests.runner.docker_helpers import TEST_LABEL

pytestmark = pytest.mark.docker

MIB = 1024 * 1024
HELD_MIB = 80
CONTAINER_USER = "1000:1000"
WAIT_SECONDS = 60.0
# Writes every page of HELD_MIB (so they are resident), burns some CPU, says so, then holds it all.
PROGRAM = (
    f"import sys, time; held = b'x' * ({HELD_MIB} << 20); sum(i * i for i in range(2_000_000)); "
    "print('ready', flush=True); time.sleep(60)"
)


@pytest.fixture
async def runtime(docker_engine: None) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(max_concurrency=2)
    yield rt
    await rt.close()


async def test_usage_while_running_and_none_after_exit(
    runtime: DockerRuntime, subagent_image: str, run_label: str
) -> None:
    spec = ContainerSpec(
        name=f"crewbot-test-usage-{run_label}",
        image=subagent_image,
        command=["-c", PROGRAM],
        entrypoint=["python3"],
        labels={TEST_LABEL: run_label},
        mounts=[],
        user=CONTAINER_USER,
        memory="256m",
        workdir="/tmp",
    )
    container_id = await runtime.start(spec)
    async with asyncio.timeout(WAIT_SECONDS):
        while True:  # the engine has no event for a line of output: look again
            if b"ready" in await runtime.logs(container_id):
                break
            await asyncio.sleep(0.1)
    local = cgroup_sample(container_id)
    assert local is not None, "no cgroup of the container found under /sys/fs/cgroup (v1 or v2)"

    def no_engine_stats(*args: object, **kwargs: object) -> object:
        raise AssertionError("the engine's stats were asked for although the cgroup is readable here")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(docker.APIClient, "stats", no_engine_stats)
        sample = await runtime.usage(container_id)
    assert sample is not None
    assert sample.memory_peak_bytes is not None, "this engine reports no peak (cgroup v2 without memory.peak?)"
    assert HELD_MIB * MIB <= sample.memory_peak_bytes <= 256 * MIB
    assert sample.cpu_seconds is not None and sample.cpu_seconds > 0.05

    await runtime.kill(container_id)
    assert await runtime.wait(container_id, WAIT_SECONDS) is not None
    assert await runtime.usage(container_id) is None  # exited: the engine has no figures any more
    await runtime.remove(container_id)
    assert await runtime.usage(container_id) is None  # gone
