"""The Docker runtime the engine tests drive: a real DockerRuntime, waits sliced at a second so a stop is quick."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runner.runtimes.docker_runtime import DockerRuntime


@pytest.fixture
async def runtime(docker_engine: None) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(max_concurrency=2, wait_slice_seconds=1.0)
    yield rt
    await rt.close()
