"""LlmProxy relaying streamed answers: events passed through and their usage counted (also when the
container hangs up before the last event), streams cut by a cancel or an upstream gone silent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from runner.channel.llm_usage import SseUsageScanner, Usage
from tests.runner.llm_proxy_helpers import CHAT, RUN, FakeUpstream, Gate, ProxyFactory, Sink, openai_upstream, post


async def test_stream_is_relayed_and_its_usage_counted(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "he"}}]},
        {"choices": [{"index": 0, "delta": {"content": "llo"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}},
    ]

    async def sse(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    upstream.behaviour = sse
    await make_proxy(openai_upstream(upstream))

    status, text = await post(tmp_path / "llm.sock", "/v1/chat/completions", {**CHAT, "stream": True})

    assert status == 200 and isinstance(text, str)
    assert [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")] == events
    assert text.rstrip().endswith("data: [DONE]")
    assert upstream.seen[0].body["stream_options"] == {"include_usage": True}
    assert sink.calls == [(RUN, 9, 2, 1)]


def test_sse_scanner_reads_usage_across_chunk_boundaries() -> None:
    usage = Usage()
    scanner = SseUsageScanner(usage)
    start_event = {"type": "message_start", "message": {"usage": {"input_tokens": 30, "output_tokens": 1}}}
    delta_event = {"type": "message_delta", "usage": {"output_tokens": 12}}
    stream = (
        f"event: message_start\ndata: {json.dumps(start_event)}\n\n"
        f"event: message_delta\ndata: {json.dumps(delta_event)}\n\ndata: [DONE]"
    ).encode()
    for start in range(0, len(stream), 7):
        scanner.feed(stream[start : start + 7])
    scanner.close()
    assert (usage.input_tokens, usage.output_tokens) == (30, 12)


async def test_a_stream_the_container_hangs_up_on_is_still_counted(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    """OpenAI reports a stream's usage in its last event: hanging up just before it must not make the call free."""
    first = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "he"}}]}
    last = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}
    hung_up = asyncio.Event()

    async def sse_past_a_hang_up(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(first)}\n\n".encode())
        await hung_up.wait()
        for _ in range(3):  # the proxy's first write after the hang-up may still land in the socket's buffer
            await response.write(f"data: {json.dumps(first)}\n\n".encode())
            await asyncio.sleep(0.05)
        await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    upstream.behaviour = sse_past_a_hang_up
    await make_proxy(openai_upstream(upstream))
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(tmp_path / "llm.sock"))) as session:
        response = await session.post("http://llm/v1/chat/completions", json={**CHAT, "stream": True})
        assert b"he" in await response.content.readany()
        response.close()  # the container goes away mid-stream
    hung_up.set()

    await asyncio.wait_for(sink.recorded.wait(), 5)
    assert sink.calls == [(RUN, 9, 2, 1)]


async def test_a_stream_the_container_hangs_up_on_before_its_first_event_is_still_counted(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    """The review's bypass: a container that hangs up while the provider works on a large prompt got the call for
    nothing (the relay failed to start, and its usage was never read): twenty 99k-token prompts, 0 spent."""
    last = {"choices": [], "usage": {"prompt_tokens": 99_000, "completion_tokens": 1, "total_tokens": 99_001}}
    called, hung_up = asyncio.Event(), asyncio.Event()

    async def sse_after_the_hang_up(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        called.set()
        await hung_up.wait()
        await asyncio.sleep(0.1)  # the proxy has seen the container's connection end
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    upstream.behaviour = sse_after_the_hang_up
    await make_proxy(openai_upstream(upstream))
    body = json.dumps({**CHAT, "stream": True}).encode()
    _, writer = await asyncio.open_unix_connection(str(tmp_path / "llm.sock"))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await asyncio.wait_for(called.wait(), 5)  # the provider has the call
    writer.close()  # the container goes away before the first event
    await writer.wait_closed()
    hung_up.set()

    await asyncio.wait_for(sink.recorded.wait(), 5)
    assert sink.calls == [(RUN, 99_000, 1, 1)]


async def test_stream_cut_by_cancel_ends_with_an_error_event(
    upstream: FakeUpstream, make_proxy: ProxyFactory, gate: Gate, tmp_path: Path
) -> None:
    first = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "he"}}]}

    async def sse_then_hang(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(first)}\n\n".encode())
        gate.live.discard(RUN)  # cancelled mid-stream
        await asyncio.sleep(60)
        raise AssertionError("never finished")

    upstream.behaviour = sse_then_hang
    await make_proxy(openai_upstream(upstream))

    status, text = await post(tmp_path / "llm.sock", "/v1/chat/completions", {**CHAT, "stream": True})

    assert status == 200 and isinstance(text, str)
    events = [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]
    assert events == [first, {"error": {"type": "run_closed", "message": f"run {RUN} is cancelled or finished"}}]
    await asyncio.wait_for(upstream.dropped.wait(), 5)


async def test_stream_gone_silent_ends_with_a_timeout_event(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    first = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "he"}}]}

    async def sse_then_silence(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(first)}\n\n".encode())
        await asyncio.sleep(60)
        raise AssertionError("never finished")

    upstream.behaviour = sse_then_silence
    await make_proxy(openai_upstream(upstream, timeout_seconds=0.3))

    status, text = await post(tmp_path / "llm.sock", "/v1/chat/completions", {**CHAT, "stream": True})

    assert status == 200 and isinstance(text, str)
    events = [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]
    assert events[0] == first and events[1]["error"]["type"] == "upstream_timeout"
    assert sink.calls == [(RUN, 0, 0, 1)]
