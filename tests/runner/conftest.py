"""Fixtures of the runner tests. For the LlmProxy tests (test_llm_proxy_*.py): a scripted upstream, FakeLLM as
the provider, the liveness gate and usage sink, and `make_proxy`, which opens RUN's socket at
tmp_path / "llm.sock". For the engine tests: `run_label`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.channel.llm_policy import RequestPolicy
from runner.channel.llm_proxy import LlmProxy, Spent
from runner.channel.llm_upstream import UpstreamConfig
from tests.fakes.llm_server import FakeLLM, anthropic_text, openai_text
from tests.runner.docker_helpers import remove_labelled
from tests.runner.llm_proxy_helpers import (
    API_KEY,
    MODEL,
    OTHER_RUN,
    PLENTY,
    RUN,
    FakeUpstream,
    Gate,
    ProxyFactory,
    Sink,
)


@pytest.fixture
def run_label() -> Iterator[str]:
    """A label value unique to one test; every container it starts carries it and is removed afterwards."""
    value = uuid.uuid4().hex[:12]
    yield value
    remove_labelled(value)


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def gate() -> Gate:
    return Gate(live={RUN, OTHER_RUN})


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
async def make_proxy(gate: Gate, sink: Sink, tmp_path: Path) -> AsyncIterator[ProxyFactory]:
    proxies: list[LlmProxy] = []

    async def make(
        config: UpstreamConfig, *, allow_provider_tools: bool = False, spent: Spent | None = None, **options: Any
    ) -> LlmProxy:
        options.setdefault("gate_poll_seconds", 0.05)
        options.setdefault("max_tokens_per_run", PLENTY)
        options.setdefault("policy", RequestPolicy(config.provider, MODEL, allow_provider_tools=allow_provider_tools))
        proxy = LlmProxy(config, gate, sink, **options)
        proxies.append(proxy)
        await proxy.open_run(RUN, tmp_path / "llm.sock", spent=spent)
        return proxy

    yield make
    for proxy in proxies:
        await proxy.close()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(api_key=API_KEY) as llm:  # 401 unless the proxy added the provider's key
        llm.openai.handle_with(lambda body: openai_text("done", prompt_tokens=10, completion_tokens=5))
        llm.anthropic.handle_with(lambda body: anthropic_text("done", input_tokens=10, output_tokens=5))
        yield llm
