"""The host's early first call of a run (runner/llm_prefetch.py) through LlmProxy with FakeLLM as the provider:
the container's identical first request gets that call's answer and costs nothing more; anything else, and
anything a container could fake, goes to the provider as always."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import structlog

from container.protocol import TaskSpec
from runner.first_call import FirstCalls
from runner.llm_prefetch import OFF_SECONDS, PREFETCH_HEADER, PrefetchMark
from runner.llm_proxy import LlmProxy
from tests.fakes.faults import Fault
from tests.fakes.llm_server import FakeLLM
from tests.runner.llm_proxy_helpers import (
    CHAT,
    FIRST,
    FIRST_PATH,
    RUN,
    Gate,
    ProxyFactory,
    Sink,
    fake_openai,
    marked,
    post,
)

PATH = FIRST_PATH


def reordered(body: Mapping[str, object]) -> bytes:
    """The same JSON with its keys in another order and other spacing: what another client would send."""
    return json.dumps(dict(reversed(list(body.items()))), indent=2).encode()


async def test_the_containers_identical_first_request_gets_the_hosts_answer_once_paid(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"

    host_status, host_answer = await post(socket, PATH, FIRST, headers=marked(proxy))
    status, answer = await post(socket, PATH, data=reordered(FIRST), headers={"Content-Type": "application/json"})

    assert (host_status, status) == (200, 200)
    assert answer == host_answer
    assert len(fake_llm.requests(PATH)) == 1
    assert PREFETCH_HEADER.lower() not in fake_llm.requests(PATH)[0].headers  # the mark never leaves the host
    assert sink.calls == [(RUN, 10, 5, 1)]  # paid once

    second_status, _ = await post(socket, PATH, FIRST)  # the hand-over is once: a repeat is a new call
    assert second_status == 200 and len(fake_llm.requests(PATH)) == 2


async def test_a_container_waiting_while_the_hosts_call_is_in_flight_gets_its_answer(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    fake_llm.set_delay(0.5)

    host = asyncio.create_task(post(socket, PATH, FIRST, headers=marked(proxy)))
    await fake_llm.wait_for_requests(1)
    container_status, container_answer = await post(socket, PATH, FIRST)

    assert (container_status, container_answer) == await host
    assert len(fake_llm.requests(PATH)) == 1


async def test_another_first_request_goes_to_the_provider(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"

    await post(socket, PATH, FIRST, headers=marked(proxy))
    status, _ = await post(socket, PATH, CHAT)

    assert status == 200
    assert [r.body["messages"] for r in fake_llm.requests(PATH)] == [FIRST["messages"], CHAT["messages"]]
    assert len(sink.calls) == 2


async def test_a_made_up_mark_is_an_ordinary_call_and_keeps_nothing(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    forged = {PREFETCH_HEADER: "0" * 32, "Content-Type": "application/json"}

    await post(socket, PATH, FIRST, headers=forged)
    await post(socket, PATH, FIRST)

    assert len(fake_llm.requests(PATH)) == 2  # the second was not answered from the first


async def test_the_hosts_call_after_the_containers_first_is_refused_not_paid(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"

    await post(socket, PATH, CHAT)  # the container was quicker
    late_status, _ = await post(socket, PATH, FIRST, headers=marked(proxy))
    await post(socket, PATH, FIRST)

    assert late_status == 409  # refused before it cost anything
    assert len(fake_llm.requests(PATH)) == 2


async def test_a_failed_first_call_leaves_the_container_to_ask_itself(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    fake_llm.fail_next(Fault.server_error())

    host_status, _ = await post(socket, PATH, FIRST, headers=marked(proxy))
    status, answer = await post(socket, PATH, FIRST)

    assert (host_status, status) == (500, 200)
    assert answer["choices"][0]["message"]["content"] == "done"
    assert len(fake_llm.requests(PATH)) == 2


async def test_a_follow_up_from_the_chat_in_between_means_a_fresh_call(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, gate: Gate, tmp_path: Path
) -> None:
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    notes: list[str] = []
    gate.followups = lambda run_id: notes  # type: ignore[method-assign]

    await post(socket, PATH, FIRST, headers=marked(proxy))
    notes.append("also check the logs")
    await post(socket, PATH, FIRST)

    requests = fake_llm.requests(PATH)
    assert len(requests) == 2
    assert "also check the logs" in json.dumps(requests[1].body)


async def test_a_run_closed_while_its_container_waits_for_the_first_call_gets_403(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, gate: Gate, tmp_path: Path
) -> None:
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    fake_llm.set_delay(2.0)

    host = asyncio.create_task(post(socket, PATH, FIRST, headers=marked(proxy)))
    await fake_llm.wait_for_requests(1)
    container = asyncio.create_task(post(socket, PATH, FIRST))
    await asyncio.sleep(0.2)
    gate.live.discard(RUN)  # cancelled

    assert (await container)[0] == 403
    assert (await host)[0] == 403


async def first_runs(proxy: LlmProxy, gate: Gate, tmp_path: Path, container_bodies: list[Mapping[str, object]]) -> None:
    """One run per body: the host's early call, then the container's first request with that body."""
    for i, body in enumerate(container_bodies):
        run_id, socket = f"run-first-{i:02d}", tmp_path / f"first-{i}.sock"
        gate.live.add(run_id)
        await proxy.open_run(run_id, socket)
        await post(socket, PATH, FIRST, headers=marked(proxy))
        await post(socket, PATH, body)
        await proxy.close_run(run_id)


async def test_containers_that_keep_asking_otherwise_turn_early_calls_off_for_a_while_with_the_reason(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, gate: Gate, tmp_path: Path
) -> None:
    now = [1_000.0]
    proxy = await make_proxy(fake_openai(fake_llm), prefetch_mark=PrefetchMark(clock=lambda: now[0]))
    first_calls = FirstCalls(proxy.prefetch_mark, lambda: True)
    spec = TaskSpec(run_id="run-next-01", task="anything", label="next")

    with structlog.testing.capture_logs() as logs:
        await first_runs(proxy, gate, tmp_path, [CHAT, CHAT, FIRST, CHAT, CHAT])  # a hand-over resets the count
        assert proxy.prefetch_mark.allows_early_call()
        await first_runs(proxy, gate, tmp_path, [CHAT])

    assert not proxy.prefetch_mark.allows_early_call()
    assert first_calls.learn_soon(spec) is None  # the image runs other agent code: every call would be wasted
    off = [e for e in logs if e["event"] == "early_first_calls_off"]
    assert len(off) == 1 and "python -m runner.image" in off[0]["hint"]
    assert len([e for e in logs if e["event"] == "first_call_mismatch"]) == 5

    now[0] += OFF_SECONDS - 1
    assert not proxy.prefetch_mark.allows_early_call()
    now[0] += 2
    assert proxy.prefetch_mark.allows_early_call()  # one more try after the pause...
    await first_runs(proxy, gate, tmp_path, [CHAT])
    assert not proxy.prefetch_mark.allows_early_call()  # ...and one more miss is enough to stop again
