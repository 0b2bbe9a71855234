"""What the LlmProxy tests share: the run and key they use, the liveness gate and usage sink the proxy is
given, FakeUpstream (a scripted provider on 127.0.0.1 for the hang-ups and mid-stream cuts), the upstream
configurations, and `post`, a container's request over the run's socket. Their fixtures are in conftest.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from core.settings import LLMProvider
from runner.channel.llm_proxy import LlmProxy
from runner.channel.llm_upstream import UpstreamConfig
from tests.fakes.llm_server import FakeLLM

API_KEY = "sk-test-provider-key-0123456789"
CONTAINER_TOKEN = "container-made-up-token"
RUN = "run-aaaaaa"
OTHER_RUN = "run-bbbbbb"
MODEL = "pinned-subagent-model"  # SUBAGENT_MODEL: what every request reaching the provider asks for
PLENTY = 10_000_000  # a run's token budget when the budget is not what a test is about


@dataclass
class Gate:
    live: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)  # what the chat sent every run (the main agent's `send`)

    def is_live(self, run_id: str) -> bool:
        return run_id in self.live

    def followups(self, run_id: str) -> list[str]:
        return list(self.notes)


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


ProxyFactory = Callable[..., Awaitable[LlmProxy]]


def openai_upstream(upstream: FakeUpstream, **overrides: Any) -> UpstreamConfig:
    fields: dict[str, Any] = {
        "provider": LLMProvider.OPENAI,
        "base_url": f"{upstream.base}/v1",
        "api_key": SecretStr(API_KEY),
        "timeout_seconds": 5.0,
    }
    fields.update(overrides)
    return UpstreamConfig(**fields)


def fake_openai(llm: FakeLLM) -> UpstreamConfig:
    return UpstreamConfig(LLMProvider.OPENAI, llm.base_url, SecretStr(API_KEY), 5.0)


def fake_anthropic(llm: FakeLLM) -> UpstreamConfig:
    return UpstreamConfig(LLMProvider.ANTHROPIC, llm.anthropic_base_url, SecretStr(API_KEY), 5.0)


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
