"""doctor's network line on Kubernetes, decided by what its probe pod printed (the in-memory runtime plays the
pod here; tests/runner/kube/test_kube_doctor.py runs the real probe in the kit, whose pods reach nothing)."""

from __future__ import annotations

import pytest

from crewbot.doctor_kube import NETWORK_PROBE, _network_check
from runner.runtimes.runtime import ContainerSpec
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime


def probe_spec() -> ContainerSpec:
    return ContainerSpec(
        name="crewbot-doctor-net",
        image="crewbot-agent:latest",
        command=["-c", NETWORK_PROBE],
        labels={},
        mounts=[],
        user="1000:1000",
    )


@pytest.mark.parametrize(
    ("printed", "code", "status", "words"),
    [
        (b"api shut\nmetadata shut\n", 0, "ok", "reaches neither"),
        (b"api open\nmetadata shut\n", 0, "FAIL", "reaches the API server"),
        (b"api shut\nmetadata open\n", 0, "FAIL", "metadata address 169.254.169.254"),
        (b"Traceback: no python\n", 1, "FAIL", "ended with code 1"),
    ],
)
async def test_the_network_line_says_what_a_pod_reached(printed: bytes, code: int, status: str, words: str) -> None:
    async def pod(container: MemoryContainer) -> int:
        container.logs = printed
        return code

    async with MemoryRuntime(on_start=pod) as runtime:
        result = await _network_check(runtime, probe_spec())
    assert result.status == status and words in result.detail
    if status == "FAIL":
        assert result.fix is not None and "NetworkPolicy" in result.fix
    assert runtime.removed  # the probe's container is removed, whatever it found
