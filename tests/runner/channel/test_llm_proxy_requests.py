"""LlmProxy against requests it must refuse (too large, over the per-run limit, not JSON, hostile JSON, wrong
route or method) and upstreams that fail (provider errors, unreachable, too slow)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr

from core.settings import LLMProvider
from runner.channel.llm_upstream import UpstreamConfig
from tests.runner.llm_proxy_helpers import API_KEY, CHAT, FakeUpstream, ProxyFactory, Sink, openai_upstream, post


async def test_oversized_request_is_413_and_not_forwarded(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    await make_proxy(openai_upstream(upstream), max_body_bytes=4096)
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", big)

    assert status == 413 and body["error"]["type"] == "request_too_large"
    assert upstream.seen == []


async def test_request_limit_per_run_is_429(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    await make_proxy(openai_upstream(upstream), max_requests_per_run=2)
    socket = tmp_path / "llm.sock"

    statuses = [(await post(socket, "/v1/chat/completions", CHAT))[0] for _ in range(3)]
    _, body = await post(socket, "/v1/chat/completions", CHAT)

    assert statuses == [200, 200, 429]
    assert "limit of 2 LLM requests" in body["error"]["message"]
    assert len(upstream.seen) == 2 and len(sink.calls) == 2


async def test_bad_requests(upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    await make_proxy(openai_upstream(upstream))
    socket = tmp_path / "llm.sock"

    assert (await post(socket, "/v1/chat/completions", data=b"{not json"))[0] == 400
    assert (await post(socket, "/v1/chat/completions", [1, 2]))[0] == 400
    assert (await post(socket, "/v1/embeddings", CHAT))[0] == 404
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as session,
        session.get("http://llm/v1/chat/completions") as response,
    ):
        assert response.status == 405
    assert upstream.seen == []


@pytest.mark.parametrize(
    "data",
    [
        b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # json.loads: RecursionError
        b'{"messages": [], "max_tokens": ' + b"9" * 5_000 + b"}",  # over Python's int-parsing limit
        b'{"messages": [], "temperature": NaN}',
        b'{"messages": [{"role": "user", "content": "\xff"}]}',
    ],
    ids=["deep", "huge-int", "nan", "not-utf8"],
)
async def test_hostile_json_is_400_not_500(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, data: bytes
) -> None:
    await make_proxy(openai_upstream(upstream))

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", data=data)

    assert status == 400 and body["error"]["type"] == "invalid_request"
    assert upstream.seen == []


async def test_provider_errors_pass_through(upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    async def rate_limited(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return web.json_response({"error": {"message": "slow down", "type": "rate_limit"}}, status=429)

    upstream.behaviour = rate_limited
    await make_proxy(openai_upstream(upstream))

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)

    assert status == 429 and body["error"]["message"] == "slow down"


async def test_unreachable_upstream_is_502(make_proxy: ProxyFactory, tmp_path: Path) -> None:
    unused = await free_port()
    await make_proxy(UpstreamConfig(LLMProvider.OPENAI, f"http://127.0.0.1:{unused}/v1", SecretStr(API_KEY), 5.0))

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)

    assert status == 502 and body["error"]["type"] == "upstream_error"
    assert API_KEY not in json.dumps(body)


async def test_slow_upstream_is_504(upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    async def slow(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(5)
        raise AssertionError("too late")

    upstream.behaviour = slow
    await make_proxy(openai_upstream(upstream, timeout_seconds=0.2))

    status, body = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)

    assert status == 504 and body["error"]["type"] == "upstream_timeout"


async def free_port() -> int:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port
