"""The in-memory runtime keeps DockerRuntime's documented semantics, and its controls do what they say.

The expectations mirror tests/runner/runtimes/test_docker_runtime.py (run against the real engine) and the
docstrings of runner.runtimes.runtime and runner.runtimes.docker_runtime: a fake that lies would make the race
tests lie.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator

import pytest

from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_INSTANCE,
    LABEL_RUN_ID,
    ContainerGone,
    ContainerRuntime,
    ContainerSpec,
    ContainerStartError,
    RuntimeUnavailable,
    container_name,
)
from tests.fakes.memory_runtime import SIGKILL_EXIT_CODE, MemoryContainer, MemoryRuntime

LIMIT_SECONDS = 5.0  # a guard against a hang, never reached when the fake is right


def make_spec(run_id: str, image: str = "crewbot-subagent:test", **labels: str) -> ContainerSpec:
    return ContainerSpec(
        name=container_name(run_id),
        image=image,
        command=[],
        labels={LABEL_RUN_ID: run_id, **labels},
        mounts=[],
        user="1000:1000",
    )


async def settle() -> None:
    """Let every ready task run up to its next suspension (no timing involved)."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
async def runtime() -> AsyncIterator[MemoryRuntime]:
    async with MemoryRuntime() as rt:
        yield rt


def test_it_is_a_container_runtime_with_dockers_signatures() -> None:
    as_protocol: ContainerRuntime = MemoryRuntime()  # mypy checks the structure
    members = [name for name in vars(ContainerRuntime) if not name.startswith("_")]
    assert {"start", "wait", "kill", "logs", "remove", "list", "ping", "image_exists", "close"} <= set(members)
    for name in members:
        fake, real = (
            inspect.signature(getattr(cls, name)).parameters.values() for cls in (MemoryRuntime, DockerRuntime)
        )
        assert [(p.name, p.kind, p.default) for p in fake] == [(p.name, p.kind, p.default) for p in real], name
        assert inspect.iscoroutinefunction(getattr(as_protocol, name)), name


async def test_start_records_the_spec_and_runs_it(runtime: MemoryRuntime) -> None:
    before = time.time()
    spec = make_spec("r1")
    container_id = await runtime.start(spec)

    assert len(container_id) == 64 and runtime.started_specs == [spec]
    container = runtime.container(container_id)
    assert container.spec is spec and container.name == "crewbot-run-r1"
    assert container.labels == {LABEL_APP: "1", LABEL_RUN_ID: "r1"}  # the app label added, as Docker's
    (info,) = await runtime.list({LABEL_RUN_ID: "r1"})
    assert (info.id, info.name, info.status, info.exit_code) == (container_id, "crewbot-run-r1", "running", None)
    assert info.started_at is not None and before <= info.started_at <= time.time()
    assert runtime.running_count() == 1


async def test_wait_times_out_with_none_and_leaves_it_running(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    assert await runtime.wait(container_id, timeout_seconds=0.01) is None
    assert runtime.container(container_id).status == "running"


async def test_wait_with_no_time_left_is_none_even_for_an_exited_container(runtime: MemoryRuntime) -> None:
    # DockerRuntime checks its deadline before asking the engine; the manager relies on it at the time limit.
    container_id = await runtime.start(make_spec("r1"))
    runtime.finish(container_id, 0)
    assert await runtime.wait(container_id, 0) is None
    runtime.set_engine_down(True)
    assert await runtime.wait(container_id, 0) is None  # not even an engine call


async def test_finish_wakes_a_blocked_wait_and_sets_logs(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    waiting = asyncio.create_task(runtime.wait(container_id))
    await settle()
    assert not waiting.done()

    assert runtime.finish(container_id, 3, logs=b"to-stdout\n") is True
    async with asyncio.timeout(LIMIT_SECONDS):
        assert await waiting == 3
    assert await runtime.wait(container_id, 1) == 3  # an exited container answers at once
    assert await runtime.logs(container_id) == b"to-stdout\n"
    assert runtime.finish(container_id, 0) is False  # exits once
    assert runtime.container(container_id).exit_code == 3
    assert runtime.running_count() == 0


async def test_kill_is_sigkill_and_idempotent(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    waiting = asyncio.create_task(runtime.wait(container_id))
    await settle()

    await runtime.kill(container_id)
    async with asyncio.timeout(LIMIT_SECONDS):
        assert await waiting == SIGKILL_EXIT_CODE
    await runtime.kill(container_id)  # already exited
    await runtime.remove(container_id)
    await runtime.kill(container_id)  # gone
    await runtime.remove(container_id)
    assert await runtime.logs(container_id) == b""
    assert runtime.kills == [container_id] * 3 and runtime.removed == [container_id]


async def test_kill_keeps_the_exit_code_of_an_exited_container(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    runtime.finish(container_id, 0)
    await runtime.kill(container_id)
    assert await runtime.wait(container_id) == 0


async def test_wait_on_a_removed_or_unknown_container_raises_gone(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    runtime.finish(container_id, 0)
    await runtime.remove(container_id)

    with pytest.raises(ContainerGone, match="no longer exists"):
        await runtime.wait(container_id, 5)
    with pytest.raises(ContainerGone):
        await runtime.wait("0" * 64)
    assert await runtime.list({}) == []
    assert runtime.container(container_id).removed  # still there for the test to inspect


async def test_removing_a_running_container_kills_it_first(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    waiting = asyncio.create_task(runtime.wait(container_id))
    await settle()
    await runtime.remove(container_id)
    async with asyncio.timeout(LIMIT_SECONDS):
        assert await waiting == SIGKILL_EXIT_CODE
    assert runtime.running_count() == 0


async def test_a_name_is_taken_until_its_container_is_removed(runtime: MemoryRuntime) -> None:
    first = await runtime.start(make_spec("r1"))
    runtime.finish(first, 0)
    with pytest.raises(ContainerStartError, match="crewbot-run-r1"):
        await runtime.start(make_spec("r1"))
    await runtime.remove(first)
    second = await runtime.start(make_spec("r1"))
    assert second != first


async def test_list_filters_by_every_label(runtime: MemoryRuntime) -> None:
    running_id = await runtime.start(make_spec("a", role="a", group="g"))
    finished_id = await runtime.start(make_spec("b", role="b", group="g"))
    runtime.finish(finished_id, 4)

    everything = {info.id: info for info in await runtime.list({"group": "g"})}
    assert set(everything) == {running_id, finished_id}
    assert everything[running_id].status == "running" and everything[running_id].exit_code is None
    assert everything[finished_id].status == "exited" and everything[finished_id].exit_code == 4
    only_b = await runtime.list({"group": "g", "role": "b"})
    assert [info.id for info in only_b] == [finished_id] and only_b[0].labels[LABEL_APP] == "1"
    assert await runtime.list({"group": "no-such-value"}) == []
    assert [info.id for info in await runtime.list({})] == [finished_id, running_id]  # newest first


async def test_missing_image_is_a_start_error() -> None:
    runtime = MemoryRuntime(images={"crewbot-subagent:test"})
    assert await runtime.image_exists("crewbot-subagent:test") is True
    assert await runtime.image_exists("crewbot-no-such-image:never") is False
    with pytest.raises(ContainerStartError, match="crewbot-no-such-image:never"):
        await runtime.start(make_spec("r1", image="crewbot-no-such-image:never"))
    assert await runtime.list({}) == [] and runtime.started_specs == []


async def test_every_call_raises_while_the_engine_is_down(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    runtime.set_engine_down(True)
    calls = [
        runtime.ping(),
        runtime.start(make_spec("r2")),
        runtime.wait(container_id, 1),
        runtime.kill(container_id),
        runtime.logs(container_id),
        runtime.remove(container_id),
        runtime.list({}),
        runtime.image_exists("x"),
    ]
    for call in calls:
        with pytest.raises(RuntimeUnavailable, match="not reachable at memory://"):
            await call

    # The container ran on meanwhile and may exit; once the engine is back its outcome is there.
    runtime.finish(container_id, 0)
    runtime.set_engine_down(False)
    assert await runtime.wait(container_id) == 0
    assert runtime.kills == [] and runtime.removed == [] and len(runtime.started_specs) == 1


async def test_a_blocked_wait_raises_when_the_engine_goes_down(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    waiting = asyncio.create_task(runtime.wait(container_id, 60))
    await settle()

    runtime.set_engine_down(True)
    runtime.finish(container_id, 0)  # too late for that wait: its connection has dropped
    async with asyncio.timeout(LIMIT_SECONDS):
        with pytest.raises(RuntimeUnavailable):
            await waiting
    runtime.set_engine_down(False)
    assert await runtime.wait(container_id) == 0


async def test_close_refuses_calls_and_ends_blocked_waits(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    waiting = asyncio.create_task(runtime.wait(container_id))
    await settle()
    await runtime.close()
    async with asyncio.timeout(LIMIT_SECONDS):
        with pytest.raises(RuntimeUnavailable, match="closed"):
            await waiting
    with pytest.raises(RuntimeUnavailable, match="closed"):
        await runtime.ping()
    assert runtime.container(container_id).status == "running"  # closing the client kills nothing


async def test_injected_start_failure_happens_once_and_leaves_no_container(runtime: MemoryRuntime) -> None:
    runtime.fail_next_start(RuntimeUnavailable("engine restarting"))
    with pytest.raises(RuntimeUnavailable, match="engine restarting"):
        await runtime.start(make_spec("r1"))
    assert await runtime.list({}) == [] and runtime.started_specs == []
    assert await runtime.start(make_spec("r1"))


async def test_injected_kill_failure_leaves_it_running(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    runtime.fail_next_kill(RuntimeUnavailable("engine restarting"))
    with pytest.raises(RuntimeUnavailable):
        await runtime.kill(container_id)
    assert runtime.container(container_id).status == "running" and runtime.kills == []
    await runtime.kill(container_id)
    assert await runtime.wait(container_id) == SIGKILL_EXIT_CODE


async def test_a_held_start_creates_nothing_until_released(runtime: MemoryRuntime) -> None:
    runtime.hold_starts()
    starting = asyncio.create_task(runtime.start(make_spec("r1")))
    async with asyncio.timeout(LIMIT_SECONDS):
        await runtime.until(lambda: runtime.held_starts == 1)
    assert await runtime.list({}) == [] and runtime.started_specs == [] and not starting.done()

    runtime.release_starts()
    async with asyncio.timeout(LIMIT_SECONDS):
        container_id = await starting
    assert runtime.held_starts == 0 and runtime.container(container_id).status == "running"
    assert await runtime.start(make_spec("r2"))  # released: later starts pass straight through


async def test_a_held_start_can_be_cancelled(runtime: MemoryRuntime) -> None:
    runtime.hold_starts()
    starting = asyncio.create_task(runtime.start(make_spec("r1")))
    async with asyncio.timeout(LIMIT_SECONDS):
        await runtime.until(lambda: runtime.held_starts == 1)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert runtime.held_starts == 0
    runtime.release_starts()
    assert await runtime.list({}) == []


async def test_a_held_start_fails_when_the_engine_goes_down(runtime: MemoryRuntime) -> None:
    runtime.hold_starts()
    starting = asyncio.create_task(runtime.start(make_spec("r1")))
    async with asyncio.timeout(LIMIT_SECONDS):
        await runtime.until(lambda: runtime.held_starts == 1)
    runtime.set_engine_down(True)
    runtime.set_engine_down(False)  # back already: the call in flight was lost all the same
    async with asyncio.timeout(LIMIT_SECONDS):
        with pytest.raises(RuntimeUnavailable):
            await starting
    assert await runtime.list({}) == []


async def test_on_start_runs_the_containers_behaviour() -> None:
    seen: list[ContainerSpec | None] = []

    async def behaviour(container: MemoryContainer) -> int | None:
        seen.append(container.spec)
        container.logs += b"working\n"
        return 7

    async with MemoryRuntime(on_start=behaviour) as runtime:
        container_id = await runtime.start(make_spec("r1"))
        async with asyncio.timeout(LIMIT_SECONDS):
            assert await runtime.wait(container_id) == 7
        assert seen == runtime.started_specs
        assert await runtime.logs(container_id) == b"working\n"


async def test_killing_a_container_ends_its_behaviour() -> None:
    ended = asyncio.Event()

    async def behaviour(container: MemoryContainer) -> int | None:
        try:
            await asyncio.Event().wait()  # runs until killed
        finally:
            ended.set()
        return 0

    async with MemoryRuntime(on_start=behaviour) as runtime:
        container_id = await runtime.start(make_spec("r1"))
        await settle()
        await runtime.kill(container_id)
        async with asyncio.timeout(LIMIT_SECONDS):
            await ended.wait()
        assert await runtime.wait(container_id) == SIGKILL_EXIT_CODE


async def test_a_crashing_behaviour_exits_non_zero_and_fails_the_test() -> None:
    async def behaviour(container: MemoryContainer) -> int | None:
        raise ValueError("bad behaviour")

    with pytest.raises(ValueError, match="bad behaviour"):
        async with MemoryRuntime(on_start=behaviour) as runtime:
            container_id = await runtime.start(make_spec("r1"))
            async with asyncio.timeout(LIMIT_SECONDS):
                assert await runtime.wait(container_id) == 1
            assert b"ValueError: bad behaviour" in await runtime.logs(container_id)


async def test_running_count_and_its_peak(runtime: MemoryRuntime) -> None:
    first = await runtime.start(make_spec("r1"))
    second = await runtime.start(make_spec("r2"))
    runtime.finish(first, 0)
    await runtime.start(make_spec("r3"))
    await runtime.kill(second)
    assert runtime.running_count() == 1 and runtime.max_running == 2
    async with asyncio.timeout(LIMIT_SECONDS):
        await runtime.until(lambda: runtime.running_count() == 1)  # true already: returns at once


async def test_until_wakes_on_a_change(runtime: MemoryRuntime) -> None:
    container_id = await runtime.start(make_spec("r1"))
    exited = asyncio.create_task(runtime.until(lambda: runtime.running_count() == 0))
    await settle()
    assert not exited.done()
    runtime.finish(container_id, 0)
    async with asyncio.timeout(LIMIT_SECONDS):
        await exited


async def test_existing_containers_for_recovery(runtime: MemoryRuntime) -> None:
    mine = {LABEL_APP: "1", LABEL_INSTANCE: "here"}
    running_id = runtime.add_existing({**mine, LABEL_RUN_ID: "old1"}, started_at=1000.0)
    exited_id = runtime.add_existing({**mine, LABEL_RUN_ID: "old2"}, status="exited", exit_code=5)
    runtime.add_existing({LABEL_APP: "1", LABEL_INSTANCE: "elsewhere"})

    found = {info.id: info for info in await runtime.list(mine)}
    assert set(found) == {running_id, exited_id}
    assert (found[running_id].status, found[running_id].exit_code, found[running_id].started_at) == (
        "running",
        None,
        1000.0,
    )
    assert found[running_id].name == container_name("old1")
    assert (found[exited_id].status, found[exited_id].exit_code) == ("exited", 5)
    assert runtime.container(exited_id).spec is None and runtime.started_specs == []
    assert await runtime.wait(exited_id) == 5
    assert runtime.max_running == 2
    with pytest.raises(ContainerStartError):  # the old container still holds the run's name
        await runtime.start(make_spec("old1"))


def test_add_existing_wants_an_exit_code_exactly_when_exited() -> None:
    runtime = MemoryRuntime()
    with pytest.raises(ValueError):
        runtime.add_existing({}, status="exited")
    with pytest.raises(ValueError):
        runtime.add_existing({}, status="running", exit_code=0)
