"""A run's token budget through LlmProxy, with FakeLLM as the provider: refusals at the budget, each call
capped by what is left (parallel calls share it), what a reattached run spent, the manager told once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from runner.channel.llm_budget import BODY_BYTES_PER_TOKEN
from runner.channel.llm_policy import DEFAULT_MAX_OUTPUT_TOKENS
from runner.channel.llm_proxy import Spent
from tests.fakes.llm_server import FakeLLM, RecordedRequest, openai_text
from tests.runner.llm_proxy_helpers import CHAT, MODEL, RUN, ProxyFactory, Sink, fake_openai, post


class Told:
    """on_budget_exhausted: the runs the manager was told about."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def __call__(self, run_id: str) -> None:
        self.runs.append(run_id)


async def test_a_run_at_its_budget_gets_429_and_the_manager_is_told_once(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    told = Told()
    await make_proxy(
        fake_openai(fake_llm), max_tokens_per_run=1_000, on_budget_exhausted=told, spent=Spent(tokens=1_000)
    )

    answers = [await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT) for _ in range(3)]
    await asyncio.sleep(0)  # the callback runs as a task of its own

    assert [status for status, _ in answers] == [429, 429, 429]
    for _, body in answers:
        assert body["error"]["type"] == "run_token_budget"
        assert "SUBAGENT_MAX_TOKENS" in body["error"]["message"]
    assert told.runs == [RUN]
    assert fake_llm.requests() == [] and sink.calls == []


def held_input(body: dict[str, Any]) -> int:
    """The input tokens the proxy holds for a call's body (the size of the JSON `body`, in tokens)."""
    return max(1, len(json.dumps(body).encode()) // BODY_BYTES_PER_TOKEN)


def held_for(seen: RecordedRequest) -> int:
    """What the proxy held for a call's input: the size of what it forwarded (the follow-ups and the output
    cap added, the model pinned), as the provider got it."""
    return max(1, len(seen.raw_body) // BODY_BYTES_PER_TOKEN)


def forwarded_chat(cap: int) -> dict[str, Any]:
    """CHAT as the provider gets it with an output cap of `cap`."""
    return {"model": MODEL, "messages": CHAT["messages"], "max_completion_tokens": cap}


async def test_calls_spend_the_budget_and_each_is_capped_by_what_is_left(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    told = Told()
    budget = 100
    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=budget, on_budget_exhausted=told)
    greedy = {**CHAT, "max_tokens": 10**12, "max_completion_tokens": 30}
    held = held_input(greedy)

    statuses = [(await post(tmp_path / "llm.sock", "/v1/chat/completions", greedy))[0] for _ in range(8)]
    await asyncio.sleep(0)

    # Each call spends 10 + 5 tokens; its output is capped by what is left after its own input.
    expected_caps: list[tuple[int, int]] = []
    left = budget
    while left > held:
        cap = left - held
        expected_caps.append((cap, min(30, cap)))
        left -= 15
    assert statuses == [200] * len(expected_caps) + [429] * (8 - len(expected_caps))
    caps = [(seen.body["max_tokens"], seen.body["max_completion_tokens"]) for seen in fake_llm.requests()]
    assert caps == expected_caps
    assert told.runs == [RUN] and len(sink.calls) == len(expected_caps)


@pytest.mark.parametrize("refusal", ["run_token_budget", "run_request_limit"])
async def test_a_reattached_run_keeps_what_it_spent(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path, refusal: str
) -> None:
    # Held for what is forwarded; 10 and the cap the policy first gives it have as many digits.
    held = held_input(forwarded_chat(10))
    # Token case: room for one call's input and 10 output tokens, not for a second call after it spends 15.
    spent = Spent(tokens=1_000 - held - 10) if refusal == "run_token_budget" else Spent(requests=2)
    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=1_000, max_requests_per_run=3, spent=spent)
    socket = tmp_path / "llm.sock"

    first, _ = await post(socket, "/v1/chat/completions", CHAT)
    second, body = await post(socket, "/v1/chat/completions", CHAT)

    assert (first, second, body["error"]["type"]) == (200, 429, refusal)
    [seen] = fake_llm.requests()
    assert held_for(seen) == held
    assert seen.body["max_completion_tokens"] == min(1_000 - spent.tokens - held, DEFAULT_MAX_OUTPUT_TOKENS)
    assert sink.calls == [(RUN, 10, 5, 1)]  # increments: what was spent before is on the record already


async def test_parallel_calls_share_what_is_left_of_the_budget(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Without holding back the calls in flight, each parallel call could spend all that is left."""
    release = asyncio.Event()

    async def slow(body: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return openai_text("done", prompt_tokens=10, completion_tokens=5)

    fake_llm.openai.handle_with(slow)
    told = Told()
    budget = 200
    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=budget, on_budget_exhausted=told)
    socket = tmp_path / "llm.sock"
    bounded = {**CHAT, "max_completion_tokens": 60}

    first = asyncio.create_task(post(socket, "/v1/chat/completions", bounded))
    await fake_llm.wait_for_requests(1)
    second = asyncio.create_task(post(socket, "/v1/chat/completions", CHAT))
    await fake_llm.wait_for_requests(2)
    third, body = await post(socket, "/v1/chat/completions", CHAT)
    release.set()
    answers = await asyncio.gather(first, second)
    fourth, _ = await post(socket, "/v1/chat/completions", CHAT)

    assert (third, body["error"]["type"]) == (429, "run_token_budget_in_flight")
    assert [status for status, _ in answers] == [200, 200] and fourth == 200
    seen = fake_llm.requests()
    second_cap = budget - held_for(seen[0]) - 60 - held_for(seen[1])
    fourth_cap = budget - 30 - held_for(seen[2])
    assert [call.body["max_completion_tokens"] for call in seen] == [60, second_cap, fourth_cap]
    assert told.runs == []  # held back is not spent: the run goes on


async def test_a_request_whose_input_alone_is_over_the_budget_is_refused_and_ends_the_run(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    told = Told()
    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=1_000, on_budget_exhausted=told)
    huge = {**CHAT, "messages": [{"role": "user", "content": "x" * 8_000}]}

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", huge)
    await asyncio.sleep(0)

    assert (status, body["error"]["type"]) == (429, "run_token_budget")
    assert fake_llm.requests() == [] and told.runs == [RUN]


async def test_a_failing_budget_callback_is_logged(fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    async def broken(run_id: str) -> None:
        raise RuntimeError("the manager is gone")

    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=1_000, on_budget_exhausted=broken, spent=Spent(1_000))
    with structlog.testing.capture_logs() as logs:
        status, _ = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)
        await asyncio.sleep(0)

    assert status == 429
    assert [entry["run_id"] for entry in logs if entry["event"] == "budget_exhausted_callback_failed"] == [RUN]
