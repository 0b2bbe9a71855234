"""The request policy through LlmProxy, with FakeLLM as the provider: the pinned model and bounded requests,
server-side tools and beta headers only when allowed, no /v1/responses."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from core.settings import LLMProvider
from runner.channel.llm_policy import DEFAULT_MAX_OUTPUT_TOKENS
from runner.channel.llm_upstream import UpstreamConfig
from tests.fakes.llm_server import FakeLLM
from tests.runner.llm_proxy_helpers import (
    API_KEY,
    CHAT,
    CONTAINER_TOKEN,
    MODEL,
    ProxyFactory,
    Sink,
    fake_anthropic,
    fake_openai,
    post,
)


@pytest.mark.parametrize("asked", ["gpt-4.5-preview", "", 7, None])
async def test_the_provider_sees_the_pinned_model_and_a_bounded_request(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path, asked: object
) -> None:
    await make_proxy(fake_openai(fake_llm))
    request = {**CHAT, "model": asked, "max_tokens": 10**12, "n": 8, "service_tier": "priority", "store": True}

    status, _ = await post(tmp_path / "llm.sock", "/v1/chat/completions", request)

    assert status == 200
    [seen] = fake_llm.requests()
    assert seen.body == {**CHAT, "model": MODEL, "max_tokens": DEFAULT_MAX_OUTPUT_TOKENS}
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"


async def test_the_offline_model_sees_the_pinned_model(make_proxy: ProxyFactory, tmp_path: Path) -> None:
    await make_proxy(UpstreamConfig(LLMProvider.OFFLINE))

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", {**CHAT, "model": "gpt-4.5-preview"})

    assert status == 200 and body["model"] == MODEL


OPENAI_BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
OPENAI_SEARCH = {"type": "web_search_preview"}
ANTHROPIC_BASH = {"name": "bash", "input_schema": {"type": "object"}}
ANTHROPIC_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 99}
MCP = [{"type": "url", "url": "https://mcp.example/sse", "name": "x"}]


@pytest.mark.parametrize("allowed", [False, True], ids=["tools-off", "tools-allowed"])
async def test_server_side_tools_reach_the_provider_only_when_allowed(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path, allowed: bool
) -> None:
    await make_proxy(fake_openai(fake_llm), allow_provider_tools=allowed)
    request = {
        **CHAT,
        "tools": [OPENAI_BASH, OPENAI_SEARCH, {"type": "web_search"}],
        "tool_choice": {"type": "web_search_preview"},
        "web_search_options": {"search_context_size": "high"},
    }

    with structlog.testing.capture_logs() as logs:
        status, _ = await post(tmp_path / "llm.sock", "/v1/chat/completions", request)

    assert status == 200
    [seen] = fake_llm.requests()
    if allowed:
        assert seen.body["tools"] == request["tools"] and "web_search_options" in seen.body
        return
    assert seen.body["tools"] == [OPENAI_BASH]
    assert "web_search_options" not in seen.body and "tool_choice" not in seen.body
    [dropped] = [entry["dropped"] for entry in logs if entry["event"] == "llm_request_fields_dropped"]
    assert {"web_search_options", "tools[web_search_preview]", "tools[web_search]", "tool_choice"} <= set(dropped)


async def test_anthropic_server_side_tools_are_stripped(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    await make_proxy(fake_anthropic(fake_llm))
    request = {**CHAT, "max_tokens": 100, "tools": [ANTHROPIC_BASH, ANTHROPIC_SEARCH], "mcp_servers": MCP}

    status, _ = await post(tmp_path / "llm.sock", "/v1/messages", request)

    assert status == 200
    [seen] = fake_llm.requests()
    assert seen.body["tools"] == [ANTHROPIC_BASH] and "mcp_servers" not in seen.body
    assert seen.body["model"] == MODEL


@pytest.mark.parametrize("allowed", [False, True], ids=["tools-off", "tools-allowed"])
async def test_beta_headers_are_forwarded_only_with_provider_tools(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path, allowed: bool
) -> None:
    await make_proxy(fake_anthropic(fake_llm), allow_provider_tools=allowed)
    headers = {
        "Anthropic-Beta": "web-fetch-2025-09-10",
        "OpenAI-Beta": "assistants=v2",
        "anthropic-version": "2023-06-01",
        "x-api-key": CONTAINER_TOKEN,
    }

    status, _ = await post(tmp_path / "llm.sock", "/v1/messages", {**CHAT, "max_tokens": 5}, headers=headers)

    assert status == 200
    [seen] = fake_llm.requests()
    assert ("anthropic-beta" in seen.headers, "openai-beta" in seen.headers) == (allowed, allowed)
    assert seen.headers["anthropic-version"] == "2023-06-01" and seen.headers["x-api-key"] == API_KEY


@pytest.mark.parametrize("provider", [LLMProvider.OPENAI, LLMProvider.OFFLINE])
async def test_the_responses_endpoint_is_not_served(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path, provider: LLMProvider
) -> None:
    """/v1/responses brings the provider's own tools (web search, file search, code interpreter)."""
    config = fake_openai(fake_llm) if provider is LLMProvider.OPENAI else UpstreamConfig(provider)
    await make_proxy(config)
    request = {"model": "gpt-4.1", "input": "search the web", "tools": [{"type": "web_search"}]}

    status, body = await post(tmp_path / "llm.sock", "/v1/responses", request)

    assert status == 404 and "/v1/responses" in body["error"]["message"]
    assert fake_llm.requests() == [] and sink.calls == []
