"""LlmProxy on real Unix sockets, against scripted upstreams on 127.0.0.1 (FakeUpstream here for the
hang-ups and mid-stream cuts, tests/fakes/llm_server.py's FakeLLM for what reaches the provider) and the
offline model: credentials, liveness, limits, streams, and the request policy and token budget."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import openai
import pytest
import structlog
from aiohttp import web
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import BaseModel, SecretStr
from pydantic_ai import Agent, models
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from core.settings import LLMProvider, load_settings
from runner.llm_policy import DEFAULT_MAX_OUTPUT_TOKENS, RequestPolicy
from runner.llm_proxy import LlmProxy, Spent
from runner.llm_upstream import (
    DEFAULT_ANTHROPIC_BASE_URL,
    DEFAULT_ANTHROPIC_VERSION,
    DEFAULT_OPENAI_BASE_URL,
    UpstreamConfig,
)
from runner.llm_usage import SseUsageScanner, Usage
from tests.fakes.llm_server import FakeLLM, anthropic_text, openai_text

API_KEY = "sk-test-provider-key-0123456789"
CONTAINER_TOKEN = "container-made-up-token"
RUN = "run-aaaaaa"
OTHER_RUN = "run-bbbbbb"
MODEL = "pinned-subagent-model"  # SUBAGENT_MODEL: what every request reaching the provider asks for
PLENTY = 10_000_000  # a run's token budget when the budget is not what a test is about


@dataclass
class Gate:
    live: set[str] = field(default_factory=set)

    def is_live(self, run_id: str) -> bool:
        return run_id in self.live


@dataclass
class Sink:
    calls: list[tuple[str, int, int, int]] = field(default_factory=list)
    recorded: asyncio.Event = field(default_factory=asyncio.Event)

    async def record_usage(self, run_id: str, input_tokens: int, output_tokens: int, requests: int) -> None:
        self.calls.append((run_id, input_tokens, output_tokens, requests))
        self.recorded.set()


Behaviour = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeUpstream:
    """A scripted provider on 127.0.0.1: records what reached it, answers with `behaviour`."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.dropped = asyncio.Event()  # set when the proxy hung up on a request in progress
        self.behaviour: Behaviour = self.chat_completion
        self._runner: web.AppRunner | None = None
        self.base = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{path:.*}", self._handle)
        # handler_cancellation: a proxy that hangs up shows here as a cancelled handler.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, {k.lower(): v for k, v in request.headers.items()}, body))
        try:
            return await self.behaviour(request, body)
        except asyncio.CancelledError:
            self.dropped.set()
            raise

    @staticmethod
    async def chat_completion(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model", "m"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            }
        )


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


ProxyFactory = Callable[..., Awaitable[LlmProxy]]


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


def openai_upstream(upstream: FakeUpstream, **overrides: Any) -> UpstreamConfig:
    fields: dict[str, Any] = {
        "provider": LLMProvider.OPENAI,
        "base_url": f"{upstream.base}/v1",
        "api_key": SecretStr(API_KEY),
        "timeout_seconds": 5.0,
    }
    fields.update(overrides)
    return UpstreamConfig(**fields)


async def post(
    socket: Path, path: str, payload: Any = None, *, headers: dict[str, str] | None = None, data: bytes | None = None
) -> tuple[int, Any]:
    """What a container does: POST to the proxy over its socket. Returns status and parsed JSON (or text)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as session,
        session.post(
            f"http://llm{path}", data=data if data is not None else json.dumps(payload), headers=headers
        ) as response,
    ):
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


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


async def test_the_key_is_never_logged(upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    await make_proxy(openai_upstream(upstream))
    with structlog.testing.capture_logs() as logs:
        await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)
    calls = [entry for entry in logs if entry["event"] == "llm_call"]
    assert calls and calls[0]["run_id"] == RUN and calls[0]["status"] == 200
    assert calls[0]["input_tokens"] == 11 and calls[0]["output_tokens"] == 7
    assert API_KEY not in repr(logs)


async def test_offline_end_to_end_with_the_openai_client(make_proxy: ProxyFactory, sink: Sink, tmp_path: Path) -> None:
    await make_proxy(UpstreamConfig(LLMProvider.OFFLINE))
    socket = tmp_path / "llm.sock"
    bash: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
    http_client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(socket)))
    client = openai.AsyncOpenAI(base_url="http://llm/v1", api_key="unused", http_client=http_client)
    try:
        messages: list[Any] = [{"role": "user", "content": "Say hi\n$ echo hi"}]
        first = await client.chat.completions.create(model="offline", messages=messages, tools=[bash])
        call = first.choices[0].message.tool_calls
        assert call is not None and call[0].type == "function"
        assert call[0].function.name == "bash" and json.loads(call[0].function.arguments) == {"command": "echo hi"}

        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call[0].id, "content": "hi\n"},
        ]
        final = await client.chat.completions.create(model="offline", messages=messages, tools=[bash])
        assert final.choices[0].message.content == "Ran 1 command(s).\n$ echo hi\nhi"
        assert final.usage is not None and final.usage.prompt_tokens > 0

        stream = await client.chat.completions.create(
            model="offline", messages=messages, tools=[bash], stream=True, stream_options={"include_usage": True}
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        assert text == "Ran 1 command(s).\n$ echo hi\nhi"
    finally:
        await client.close()
    assert len(sink.calls) == 3 and all(call[0] == RUN and call[1] > 0 and call[2] > 0 for call in sink.calls)


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


async def test_offline_end_to_end_with_a_pydantic_ai_agent(
    make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The container's agent stack (pydantic-ai over the OpenAI client) against the offline model."""
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # a local Unix socket, not a provider
    await make_proxy(UpstreamConfig(LLMProvider.OFFLINE))
    http_client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(tmp_path / "llm.sock")))
    client = openai.AsyncOpenAI(base_url="http://llm/v1", api_key="unused", http_client=http_client)
    model = OpenAIChatModel("offline-subagent", provider=OpenAIProvider(openai_client=client))
    ran: list[str] = []

    def bash(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return f"<{command}>"

    class Report(BaseModel):
        summary: str

    try:
        agent = Agent(model, tools=[bash])
        result = await agent.run("Look around\n$ pwd\n$ ls")
        assert result.output == "Ran 2 command(s).\n$ pwd\n<pwd>\n$ ls\n<ls>"
        follow_up = await agent.run("$ date", message_history=result.all_messages())
        assert follow_up.output == "Ran 1 command(s).\n$ date\n<date>"
        async with agent.run_stream("$ id") as streamed:
            assert await streamed.get_output() == "Ran 1 command(s).\n$ id\n<id>"
        structured = await Agent(model, tools=[bash], output_type=Report).run("$ whoami")
        assert structured.output == Report(summary="Ran 1 command(s).\n$ whoami\n<whoami>")
    finally:
        await client.close()
    assert ran == ["pwd", "ls", "date", "id", "whoami"]


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


# --- the request policy and the token budget, with FakeLLM as the provider ------------------------------


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(api_key=API_KEY) as llm:  # 401 unless the proxy added the provider's key
        llm.openai.handle_with(lambda body: openai_text("done", prompt_tokens=10, completion_tokens=5))
        llm.anthropic.handle_with(lambda body: anthropic_text("done", input_tokens=10, output_tokens=5))
        yield llm


def fake_openai(llm: FakeLLM) -> UpstreamConfig:
    return UpstreamConfig(LLMProvider.OPENAI, llm.base_url, SecretStr(API_KEY), 5.0)


def fake_anthropic(llm: FakeLLM) -> UpstreamConfig:
    return UpstreamConfig(LLMProvider.ANTHROPIC, llm.anthropic_base_url, SecretStr(API_KEY), 5.0)


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


async def test_calls_spend_the_budget_and_each_is_capped_by_what_is_left(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path
) -> None:
    told = Told()
    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=40, on_budget_exhausted=told)
    greedy = {**CHAT, "max_tokens": 10**12, "max_completion_tokens": 30}

    statuses = [(await post(tmp_path / "llm.sock", "/v1/chat/completions", greedy))[0] for _ in range(4)]
    await asyncio.sleep(0)

    assert statuses == [200, 200, 200, 429]  # each call spends 10 + 5 tokens
    caps = [(seen.body["max_tokens"], seen.body["max_completion_tokens"]) for seen in fake_llm.requests()]
    assert caps == [(40, 30), (25, 25), (10, 10)]
    assert told.runs == [RUN] and len(sink.calls) == 3


@pytest.mark.parametrize(
    ("spent", "refusal"), [(Spent(tokens=990), "run_token_budget"), (Spent(requests=2), "run_request_limit")]
)
async def test_a_reattached_run_keeps_what_it_spent(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, sink: Sink, tmp_path: Path, spent: Spent, refusal: str
) -> None:
    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=1_000, max_requests_per_run=3, spent=spent)
    socket = tmp_path / "llm.sock"

    first, _ = await post(socket, "/v1/chat/completions", CHAT)
    second, body = await post(socket, "/v1/chat/completions", CHAT)

    assert (first, second, body["error"]["type"]) == (200, 429, refusal)
    [seen] = fake_llm.requests()
    assert seen.body["max_completion_tokens"] == min(1_000 - spent.tokens, DEFAULT_MAX_OUTPUT_TOKENS)
    assert sink.calls == [(RUN, 10, 5, 1)]  # increments: what was spent before is on the record already


async def test_parallel_calls_share_what_is_left_of_the_budget(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Without holding back the calls in flight, each parallel call could spend all that is left."""
    release = asyncio.Event()

    async def held(body: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return openai_text("done", prompt_tokens=10, completion_tokens=5)

    fake_llm.openai.handle_with(held)
    told = Told()
    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=100, on_budget_exhausted=told)
    socket = tmp_path / "llm.sock"

    first = asyncio.create_task(post(socket, "/v1/chat/completions", {**CHAT, "max_completion_tokens": 60}))
    await fake_llm.wait_for_requests(1)
    second = asyncio.create_task(post(socket, "/v1/chat/completions", CHAT))
    await fake_llm.wait_for_requests(2)
    third, body = await post(socket, "/v1/chat/completions", CHAT)
    release.set()
    answers = await asyncio.gather(first, second)
    fourth, _ = await post(socket, "/v1/chat/completions", CHAT)

    assert (third, body["error"]["type"]) == (429, "run_token_budget_in_flight")
    assert [status for status, _ in answers] == [200, 200] and fourth == 200
    assert [seen.body["max_completion_tokens"] for seen in fake_llm.requests()] == [60, 40, 70]
    assert told.runs == []  # held back is not spent: the run goes on


async def test_a_failing_budget_callback_is_logged(fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path) -> None:
    async def broken(run_id: str) -> None:
        raise RuntimeError("the manager is gone")

    await make_proxy(fake_openai(fake_llm), max_tokens_per_run=1_000, on_budget_exhausted=broken, spent=Spent(1_000))
    with structlog.testing.capture_logs() as logs:
        status, _ = await post(tmp_path / "llm.sock", "/v1/chat/completions", CHAT)
        await asyncio.sleep(0)

    assert status == 429
    assert [entry["run_id"] for entry in logs if entry["event"] == "budget_exhausted_callback_failed"] == [RUN]


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


async def free_port() -> int:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port
