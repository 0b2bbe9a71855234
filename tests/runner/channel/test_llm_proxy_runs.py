"""LlmProxy on real Unix sockets, one per run: the provider's key in place of the container's credentials,
a run's liveness (a cancelled or closed run gets 403 and its upstream call is dropped), the sockets, and
the upstream configuration from the settings."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from pydantic import SecretStr

from core.settings import LLMProvider, load_settings
from runner.channel.llm_policy import DEFAULT_MAX_OUTPUT_TOKENS, RequestPolicy
from runner.channel.llm_proxy import LlmProxy
from runner.channel.llm_upstream import (
    DEFAULT_ANTHROPIC_BASE_URL,
    DEFAULT_ANTHROPIC_VERSION,
    DEFAULT_OPENAI_BASE_URL,
    UpstreamConfig,
)
from tests.runner.llm_proxy_helpers import (
    API_KEY,
    CHAT,
    CONTAINER_TOKEN,
    MODEL,
    OTHER_RUN,
    PLENTY,
    RUN,
    FakeUpstream,
    Gate,
    ProxyFactory,
    Sink,
    openai_upstream,
    post,
)


async def test_key_added_and_container_credentials_replaced(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    await make_proxy(openai_upstream(upstream))
    headers = {"Authorization": f"Bearer {CONTAINER_TOKEN}", "x-api-key": CONTAINER_TOKEN, "Cookie": "a=b"}

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT, headers=headers)

    assert status == 200 and body["choices"][0]["message"]["content"] == "hello"
    [seen] = upstream.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.body == {**CHAT, "model": MODEL, "max_completion_tokens": DEFAULT_MAX_OUTPUT_TOKENS}
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"
    assert "x-api-key" not in seen.headers and "cookie" not in seen.headers
    assert sink.calls == [(RUN, 11, 7, 1)]


async def test_anthropic_gets_x_api_key_and_version(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    async def message(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        usage = {"input_tokens": 20, "output_tokens": 5, "cache_read_input_tokens": 3}
        return web.json_response({"type": "message", "content": [{"type": "text", "text": "ok"}], "usage": usage})

    upstream.behaviour = message
    config = UpstreamConfig(LLMProvider.ANTHROPIC, upstream.base, SecretStr(API_KEY), 5.0)
    await make_proxy(config)
    socket = tmp_path / "llm.sock"
    payload = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}

    status, _ = await post(socket, "/v1/messages", payload, headers={"Authorization": f"Bearer {CONTAINER_TOKEN}"})
    status_2, _ = await post(socket, "/v1/messages", payload, headers={"anthropic-version": "2099-01-01"})

    assert status == status_2 == 200
    first, second = upstream.seen
    assert first.path == "/v1/messages"
    assert first.headers["x-api-key"] == API_KEY and "authorization" not in first.headers
    assert first.headers["anthropic-version"] == DEFAULT_ANTHROPIC_VERSION
    assert second.headers["anthropic-version"] == "2099-01-01"
    assert sink.calls == [(RUN, 23, 5, 1), (RUN, 23, 5, 1)]
    assert (await post(socket, "/v1/chat/completions", CHAT))[0] == 404  # not this provider's route


async def test_the_key_is_never_logged(upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    await make_proxy(openai_upstream(upstream))
    with structlog.testing.capture_logs() as logs:
        await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)
    calls = [entry for entry in logs if entry["event"] == "llm_call"]
    assert calls and calls[0]["run_id"] == RUN and calls[0]["status"] == 200
    assert calls[0]["input_tokens"] == 11 and calls[0]["output_tokens"] == 7
    assert API_KEY not in repr(logs)


async def test_closed_run_is_refused_and_not_forwarded(
    upstream: FakeUpstream, make_proxy: ProxyFactory, gate: Gate, sink: Sink, tmp_path: Path
) -> None:
    await make_proxy(openai_upstream(upstream))
    gate.live.discard(RUN)

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)

    assert status == 403
    assert body == {"error": {"message": f"run {RUN} is cancelled or finished", "type": "run_closed"}}
    assert upstream.seen == [] and sink.calls == []


async def test_cancel_mid_call_drops_the_upstream_request(
    upstream: FakeUpstream, make_proxy: ProxyFactory, gate: Gate, sink: Sink, tmp_path: Path
) -> None:
    reached = asyncio.Event()

    async def hang(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        reached.set()
        await asyncio.sleep(60)
        raise AssertionError("never answered")

    upstream.behaviour = hang
    await make_proxy(openai_upstream(upstream))
    call = asyncio.create_task(post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT))
    await asyncio.wait_for(reached.wait(), 5)

    gate.live.discard(RUN)  # the manager cancels the run; nothing else
    status, body = await asyncio.wait_for(call, 5)

    assert status == 403 and body["error"]["type"] == "run_closed"
    await asyncio.wait_for(upstream.dropped.wait(), 5)
    assert sink.calls == [(RUN, 0, 0, 1)]


async def test_close_run_mid_call_answers_403_and_removes_the_socket(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    reached = asyncio.Event()

    async def hang(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        reached.set()
        await asyncio.sleep(60)
        raise AssertionError("never answered")

    upstream.behaviour = hang
    proxy = await make_proxy(openai_upstream(upstream), gate_poll_seconds=30)  # only close_run can stop it
    socket = tmp_path / "llm.sock"
    call = asyncio.create_task(post(socket, "/v1/chat/completions", CHAT))
    await asyncio.wait_for(reached.wait(), 5)

    await proxy.close_run(RUN)
    status, _ = await asyncio.wait_for(call, 5)

    assert status == 403
    await asyncio.wait_for(upstream.dropped.wait(), 5)
    assert not socket.exists() and proxy.open_runs() == []
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(socket, "/v1/chat/completions", CHAT)
    await proxy.close_run(RUN)  # twice is fine


async def test_answer_arriving_after_cancel_is_not_delivered(
    upstream: FakeUpstream, make_proxy: ProxyFactory, gate: Gate, sink: Sink, tmp_path: Path
) -> None:
    async def cancel_then_answer(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        gate.live.discard(RUN)  # cancelled while the provider was working
        return await FakeUpstream.chat_completion(request, body)

    upstream.behaviour = cancel_then_answer
    await make_proxy(openai_upstream(upstream), gate_poll_seconds=30)

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)

    assert status == 403 and body["error"]["type"] == "run_closed"
    assert sink.calls == [(RUN, 11, 7, 1)]  # the tokens were spent, so they count


async def test_each_socket_speaks_for_its_own_run(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    proxy = await make_proxy(openai_upstream(upstream))
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    await proxy.open_run(OTHER_RUN, other_dir / "llm.sock")

    await post(other_dir / "llm.sock", "/v1/chat/completions", CHAT)
    await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)

    assert [call[0] for call in sink.calls] == [OTHER_RUN, RUN]
    assert sorted(proxy.open_runs()) == sorted([RUN, OTHER_RUN])
    with pytest.raises(ValueError, match="already"):
        await proxy.open_run(RUN, tmp_path / "again.sock")


async def test_socket_is_world_connectable(make_proxy: ProxyFactory, tmp_path: Path) -> None:
    await make_proxy(UpstreamConfig(LLMProvider.OFFLINE))
    mode = (tmp_path / "llm.sock").stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o666


async def test_too_long_socket_path_is_refused(gate: Gate, sink: Sink, tmp_path: Path) -> None:
    policy = RequestPolicy(LLMProvider.OFFLINE, MODEL, allow_provider_tools=False)
    proxy = LlmProxy(UpstreamConfig(LLMProvider.OFFLINE), gate, sink, policy=policy, max_tokens_per_run=PLENTY)
    with pytest.raises(ValueError, match="DATA_DIR"):
        await proxy.open_run(RUN, tmp_path / ("d" * 120) / "llm.sock")
    await proxy.close()


def test_upstream_config_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLM_PROVIDER", "LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL", "LLM_TIMEOUT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    offline = UpstreamConfig.from_settings(load_settings(_env_file=None, LLM_PROVIDER="offline"))
    assert offline.provider is LLMProvider.OFFLINE and offline.base_url == ""
    openai_config = UpstreamConfig.from_settings(
        load_settings(_env_file=None, LLM_PROVIDER="openai", LLM_MODEL="m", LLM_API_KEY=API_KEY, LLM_TIMEOUT_SECONDS=7)
    )
    assert openai_config.base_url == DEFAULT_OPENAI_BASE_URL and openai_config.timeout_seconds == 7
    assert openai_config.api_key is not None and API_KEY not in repr(openai_config)
    anthropic_config = UpstreamConfig.from_settings(
        load_settings(_env_file=None, LLM_PROVIDER="anthropic", LLM_MODEL="m", LLM_API_KEY="k" * 8)
    )
    assert anthropic_config.base_url == DEFAULT_ANTHROPIC_BASE_URL
    local = UpstreamConfig.from_settings(
        load_settings(_env_file=None, LLM_PROVIDER="openai", LLM_MODEL="m", LLM_BASE_URL="http://127.0.0.1:8000/v1/")
    )
    assert local.base_url == "http://127.0.0.1:8000/v1" and local.api_key is None
