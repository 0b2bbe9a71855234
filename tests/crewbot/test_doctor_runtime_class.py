"""`crewbot doctor` with SUBAGENT_RUNTIME_CLASS: one `runtime` line saying whether a container actually starts
under it, or why not and the fix; shown as skipped when the engine or the image is missing, absent when
the setting is. Against MemoryRuntime, and against the real engine (runsc, and a name it does not know)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from crewbot.doctor import run_doctor
from runner.runtimes.docker_runtime import RUNTIME_CLASS_FIX, DockerRuntime, UnknownRuntimeClass
from runner.runtimes.runtime import ContainerSpec
from tests.crewbot.test_doctor_fixes import IMAGE, assert_fixes, by_name
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import make_settings
from tests.runner.gvisor_helpers import RUNSC, require_runsc

GVISOR_RELEASE = "4.4.0"  # what gVisor's kernel says it is


async def sandboxed(container: MemoryContainer) -> int | None:
    """The doctor's probes: Python's version under the default runtime, gVisor's kernel under runsc."""
    assert container.spec is not None
    container.logs = b"4.4.0\n" if container.spec.runtime_class == RUNSC else b"3.11.2\n"
    return 0


async def cannot_fork(container: MemoryContainer) -> int | None:
    assert container.spec is not None
    if container.spec.runtime_class is None:
        return await sandboxed(container)
    container.logs = b"BlockingIOError: [Errno 11] Resource temporarily unavailable\n"
    return 1


class NoRunsc(MemoryRuntime):
    """An engine that has never heard of runsc, as DockerRuntime reports it."""

    async def start(self, spec: ContainerSpec) -> str:
        if spec.runtime_class is not None:
            raise UnknownRuntimeClass(f"the engine has no runtime {spec.runtime_class!r}")
        return await super().start(spec)


async def doctor(tmp_path: Path, runtime: MemoryRuntime | DockerRuntime, **settings: object) -> dict[str, str]:
    lines: list[str] = []
    code = await run_doctor(make_settings(tmp_path / "data", None, **settings), out=lines.append, runtime=runtime)
    assert code == (1 if any(line.startswith("FAIL") for line in lines) else 0)
    assert_fixes(lines)
    return by_name(lines)


async def test_a_container_under_the_runtime_class_is_one_ok_line(tmp_path: Path) -> None:
    async with MemoryRuntime(images={IMAGE}, on_start=sandboxed) as runtime:
        lines = await doctor(tmp_path, runtime, SUBAGENT_RUNTIME_CLASS=RUNSC, SUBAGENT_PIDS="300")

    assert list(lines)[-4:] == ["container", "runtime", "pool", "mcp"]  # the MCP servers' line last
    assert lines["runtime"] == (
        f"ok   runtime   runsc: a test container started under it "
        f"(its own kernel {GVISOR_RELEASE}, not the host's {platform.release()})"
    )
    probe = runtime.started_specs[-1]
    assert probe.runtime_class == RUNSC and probe.network == "none" and probe.pids == 300
    assert runtime.started_specs[0].runtime_class is None  # the plain container check stays on the default
    assert all(container_id in runtime.removed for container_id in runtime.kills)


async def test_no_runtime_line_without_the_setting(tmp_path: Path) -> None:
    async with MemoryRuntime(images={IMAGE}, on_start=sandboxed) as runtime:
        lines = await doctor(tmp_path, runtime)

    assert "runtime" not in lines and len(runtime.started_specs) == 1


async def test_an_engine_without_the_runtime_names_how_to_register_it(tmp_path: Path) -> None:
    async with NoRunsc(images={IMAGE}, on_start=sandboxed) as runtime:
        lines = await doctor(tmp_path, runtime, SUBAGENT_RUNTIME_CLASS=RUNSC)

    assert lines["container"].startswith("ok")
    assert lines["runtime"] == (
        f"FAIL runtime   the engine has no runtime 'runsc' (SUBAGENT_RUNTIME_CLASS); fix: {RUNTIME_CLASS_FIX}"
    )


async def test_a_sandbox_that_cannot_fork_points_at_the_pids_limit(tmp_path: Path) -> None:
    async with MemoryRuntime(images={IMAGE}, on_start=cannot_fork) as runtime:
        lines = await doctor(tmp_path, runtime, SUBAGENT_RUNTIME_CLASS=RUNSC)

    assert "FAIL runtime   a test container under runsc exited with code 1: BlockingIOError" in lines["runtime"]
    assert "SUBAGENT_PIDS also counts the sandbox's own threads: raise it" in lines["runtime"]


async def test_skipped_with_the_reason_when_nothing_can_run(tmp_path: Path) -> None:
    async with MemoryRuntime(images=set()) as runtime:
        lines = await doctor(tmp_path, runtime, SUBAGENT_RUNTIME_CLASS=RUNSC)
    assert lines["runtime"] == "skip runtime   not checked: no image"

    engine = DockerRuntime(max_concurrency=1, base_url=f"unix://{tmp_path}/no-engine.sock")
    try:
        lines = await doctor(tmp_path, engine, SUBAGENT_RUNTIME_CLASS=RUNSC)
    finally:
        await engine.close()
    assert lines["runtime"] == "skip runtime   not checked: no Docker engine"


@pytest.mark.docker
async def test_runsc_on_the_real_engine(tmp_path: Path, subagent_image: str) -> None:
    require_runsc()
    engine = DockerRuntime(max_concurrency=1)
    try:
        lines = await doctor(tmp_path, engine, SUBAGENT_RUNTIME_CLASS=RUNSC)
        unknown = await doctor(tmp_path, engine, SUBAGENT_RUNTIME_CLASS="crewbot-no-such-runtime")
    finally:
        await engine.close()

    assert lines["runtime"].startswith("ok   runtime   runsc: a test container started under it (its own kernel ")
    assert platform.release() in lines["runtime"]
    assert unknown["runtime"].startswith(
        "FAIL runtime   the engine has no runtime 'crewbot-no-such-runtime' (SUBAGENT_RUNTIME_CLASS); fix: "
    )


async def test_doctor_names_kubeconfig_when_the_cluster_cannot_be_loaded(tmp_path: Path) -> None:
    from core.settings import load_settings
    from crewbot.doctor import run_doctor

    settings = load_settings(
        DATA_DIR=str(tmp_path / "data"), SUBAGENT_RUNTIME="kubernetes", KUBECONFIG=str(tmp_path / "missing")
    )
    lines: list[str] = []
    assert await run_doctor(settings, out=lines.append) == 1
    kube = next(line for line in lines if line.split()[1] == "kube")
    assert kube.startswith("FAIL") and "KUBECONFIG=" in kube and "fix:" in kube
    assert [line.split()[0] for line in lines if line.split()[1] in ("rbac", "container")] == ["skip", "skip"]
