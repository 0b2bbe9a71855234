"""A streamable-HTTP server's answers are bounded: a JSON body past MAX_MESSAGE_BYTES is cut off as it arrives (the
SDK read it whole), an event past it ends that call; either way the call fails saying why, and others go on."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from core.mcp_client import CallStatus, McpConnection, ServerUnavailable
from core.mcp_config import McpServer, parse_config
from core.mcp_stdio import MAX_MESSAGE_BYTES
from tests.mcp_helpers import http_server


def server(url: str) -> McpServer:
    return parse_config(json.dumps({"mcpServers": {"h": {"url": url, "timeout_seconds": 60}}}), {}).servers[0]


@asynccontextmanager
async def serve(answer: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """An aiohttp server on 127.0.0.1 answering every path with `answer`; yields its MCP URL, stops it after."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        await runner.cleanup()


@pytest.fixture
async def endless_json() -> AsyncIterator[tuple[str, list[int]]]:
    """Answers every POST with an application/json body that never ends; notes how many bytes it sent."""
    sent = [0]

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b" " * 65536
        try:
            while sent[0] < 8 * MAX_MESSAGE_BYTES:
                await response.write(chunk)
                sent[0] += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response

    async with serve(answer) as url:
        yield url, sent


async def test_a_json_body_past_the_limit_is_cut_off(endless_json: tuple[str, list[int]]) -> None:
    url, sent = endless_json
    connection = McpConnection(server(url))
    try:
        with pytest.raises(ServerUnavailable, match="over 4 MiB"):
            await connection.tools()
    finally:
        await connection.close()
    assert sent[0] < 8 * MAX_MESSAGE_BYTES  # the client stopped reading long before the server stopped sending


async def test_an_event_past_the_limit_fails_that_call_alone() -> None:
    async with http_server() as url:
        connection = McpConnection(server(url))
        try:
            big = await connection.call("big", {"n": MAX_MESSAGE_BYTES + 1024})
            assert big.status is CallStatus.FAILED and "byte limit" in big.text
            assert (await connection.call("add", {"a": 2, "b": 3})).text == "5"
        finally:
            await connection.close()


async def test_a_compressed_answer_is_refused_not_inflated_past_the_limit() -> None:
    """4 MiB of gzip is 4 GiB of JSON once inflated: the client asks for identity and refuses anything else."""
    asked: list[str] = []
    bomb = gzip.compress(b" " * (8 * MAX_MESSAGE_BYTES))  # about 32 KiB on the wire

    async def answer(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Accept-Encoding", ""))
        return web.Response(body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    async with serve(answer) as url:
        connection = McpConnection(server(url))
        try:
            with pytest.raises(ServerUnavailable, match="compressed its answer"):
                await connection.tools()
        finally:
            await connection.close()
    assert asked and all(value == "identity" for value in asked)
