"""Defects a review found in the host's early first call (commit 69e3329), each kept as a regression test.

Proxy side (runner/llm_proxy.py `_handle` / `_first_call_answer`), with FakeLLM as the provider:
- the container's first request started before, or arriving while the host's marked call is parsed, is not
  matched: the provider is asked twice for the same first call;
- the container's matching request holds its own input estimate against the budget before it is matched, so a
  large first request (a long prior session) gets 429 `run_token_budget_in_flight` while the host's call runs,
  instead of the answer that is already paid for;
- the socket's close log says the first call was handed over when it failed and the container asked itself.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from runner.llm_policy import RequestPolicy, Sanitized
from tests.fakes.faults import Fault
from tests.fakes.llm_server import FakeLLM
from tests.runner.llm_proxy_helpers import FIRST, FIRST_PATH, RUN, ProxyFactory, fake_openai, marked, post

PATH = FIRST_PATH


async def test_a_container_request_under_way_when_the_hosts_call_comes_costs_one_provider_call(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """The container's first request has begun (headers in, body still arriving: a container sets its own pace)
    when the host's marked call arrives. The proxy counts a request only once its body is read, so the host's
    call is not refused 409, and the container's request was not keyed at entry: both reach the provider."""
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    body = json.dumps(FIRST).encode()
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield body[:10]
        await release.wait()
        yield body[10:]

    async def container() -> int:
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as session,
            session.post(f"http://llm{PATH}", data=slow_body(), headers={"Content-Type": "application/json"}) as r,
        ):
            await r.read()
            return r.status

    container_request = asyncio.create_task(container())
    await asyncio.sleep(0.3)  # its headers are in: the proxy's handler is reading its body
    host_status, _ = await post(socket, PATH, FIRST, headers=marked(proxy))
    release.set()
    container_status = await container_request

    assert 200 in (host_status, container_status)
    assert len(fake_llm.requests(PATH)) == 1


async def test_the_containers_first_request_while_the_hosts_call_is_parsed_gets_the_hosts_answer(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's marked call is in its worker thread (parse and policy; a big first request takes a while)
    when the container's identical request arrives. `keyed` was decided at the container's entry, before the
    host's call had set `run.first_call`, so the container's request has no key, never matches, and is a
    second provider call for the same first request."""
    original = RequestPolicy.sanitize
    second_entered = threading.Event()
    calls = 0
    lock = threading.Lock()

    def sanitize(self: RequestPolicy, path: str, payload: object, remaining_tokens: int) -> Sanitized:
        nonlocal calls
        with lock:
            calls += 1
            mine = calls
        if mine == 1:
            second_entered.wait(5)  # the host's call: still being parsed when the container's comes
        else:
            second_entered.set()
        return original(self, path, payload, remaining_tokens)

    monkeypatch.setattr(RequestPolicy, "sanitize", sanitize)
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    fake_llm.set_delay(0.3)

    host = asyncio.create_task(post(socket, PATH, FIRST, headers=marked(proxy)))
    await asyncio.sleep(0.2)  # the host's call is in its thread
    container_status, container_answer = await post(socket, PATH, FIRST)
    host_status, host_answer = await host

    assert (host_status, container_status) == (200, 200)
    assert len(fake_llm.requests(PATH)) == 1
    assert container_answer == host_answer


def big_first_request(tokens: int) -> dict[str, Any]:
    """A first request whose body the proxy estimates at about `tokens` input tokens (4 bytes a token):
    what a run continuing a long prior session sends."""
    return {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "x" * (tokens * 4)},
        ],
    }


async def test_a_large_first_request_waiting_for_the_hosts_call_is_answered_not_refused_429(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Budget 40,000 tokens, first request about 15,000 tokens of input: fine on its own (and for the host's
    call). While the host's call holds its input and output cap (15,000 + 16,384), the container's identical
    request holds its own input estimate before it is matched: 15,000 >= 40,000 - 31,384, so it gets 429
    run_token_budget_in_flight for an answer that is already paid for and costs nothing more."""
    proxy = await make_proxy(fake_openai(fake_llm), max_tokens_per_run=40_000)
    socket = tmp_path / "llm.sock"
    first = big_first_request(15_000)
    fake_llm.set_delay(1.0)

    host = asyncio.create_task(post(socket, PATH, first, headers=marked(proxy)))
    await fake_llm.wait_for_requests(1)
    container_status, container_answer = await post(socket, PATH, first)
    host_status, host_answer = await host

    assert host_status == 200
    assert container_status == 200, container_answer
    assert container_answer == host_answer
    assert len(fake_llm.requests(PATH)) == 1


async def test_a_first_call_that_failed_is_not_logged_as_handed_over(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """`first_call_handed_over` on `llm_socket_closed` (what the e2e test and an operator read) is
    `PrefetchedCall.used`, which is set when the container's request matches, before it is known whether
    there is an answer to hand over. The host's call failed here and the container asked the provider itself,
    yet the run is logged as handed over."""
    proxy = await make_proxy(fake_openai(fake_llm))
    socket = tmp_path / "llm.sock"
    fake_llm.fail_next(Fault.server_error())

    with structlog.testing.capture_logs() as logs:
        host_status, _ = await post(socket, PATH, FIRST, headers=marked(proxy))
        status, _ = await post(socket, PATH, FIRST)
        await proxy.close_run(RUN)

    assert (host_status, status) == (500, 200)
    assert len(fake_llm.requests(PATH)) == 2  # nothing was handed over
    assert not [e for e in logs if e["event"] == "llm_call" and e.get("first_call")]
    closed = [e for e in logs if e["event"] == "llm_socket_closed"]
    assert [e["first_call_handed_over"] for e in closed] == [False]
