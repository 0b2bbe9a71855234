"""The fake LLM provider, driven by the real openai and anthropic clients (over httpx2)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import MessageParam, TextBlock, ToolUseBlock
from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam

from tests.fakes.llm_server import (
    FakeLLM,
    Fault,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_call,
)

KEY = "sk-test-key"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
ANTHROPIC_MESSAGES: list[MessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def llm(tmp_path: Path) -> AsyncIterator[FakeLLM]:
    async with FakeLLM(socket_path=tmp_path / "llm.sock", api_key=KEY) as server:
        yield server


def tcp_client(llm: FakeLLM) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=llm.base_url, api_key=KEY, max_retries=0)


def unix_client(llm: FakeLLM) -> openai.AsyncOpenAI:
    assert llm.socket_path is not None
    transport = httpx2.AsyncHTTPTransport(uds=str(llm.socket_path))
    http_client = httpx2.AsyncClient(transport=transport)
    return openai.AsyncOpenAI(base_url="http://llm/v1", api_key=KEY, max_retries=0, http_client=http_client)


async def test_scripted_replies_over_tcp_and_the_unix_socket(llm: FakeLLM) -> None:
    llm.openai.enqueue(openai_text("over tcp"), openai_tool_call("spawn_subagent", {"task": "build"}))
    async with tcp_client(llm) as tcp, unix_client(llm) as unix:
        first = await tcp.chat.completions.create(model="m1", messages=MESSAGES)
        second = await unix.chat.completions.create(model="m2", messages=MESSAGES)

    assert first.choices[0].message.content == "over tcp"
    assert first.model == "m1" and first.usage is not None and first.usage.total_tokens == 15
    [call] = second.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "spawn_subagent"
    assert json.loads(call.function.arguments) == {"task": "build"}
    assert [(r.via, r.body["model"]) for r in llm.requests()] == [("tcp", "m1"), ("unix", "m2")]
    assert llm.requests()[1].headers["authorization"] == f"Bearer {KEY}"
    assert llm.requests()[0].body["messages"] == MESSAGES


async def test_handler_streaming_and_models(llm: FakeLLM) -> None:
    llm.openai.handle_with(lambda request: openai_text(f"echo {request['messages'][-1]['content']}"))
    async with tcp_client(llm) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo hi"
        assert chunks[-1].usage is not None
        assert [m.id async for m in client.models.list()] == ["fake-model"]


async def test_cancelled_request_is_seen_as_a_disconnect(llm: FakeLLM) -> None:
    llm.set_delay(30)
    async with unix_client(llm) as client:
        call = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
        await llm.wait_for_requests(1)
        call.cancel()
        cancelled_at = time.monotonic()
        [gone] = await llm.wait_for_disconnects(1, timeout_seconds=1)
    assert gone.body["model"] == "m" and llm.disconnects == 1
    [hung_up_at] = llm.disconnect_times()  # when the client hung up, not when it asked
    assert gone.at < cancelled_at <= hung_up_at


async def test_faults_and_auth(llm: FakeLLM) -> None:
    llm.fail_next(Fault.retry_after(1))
    llm.fail_next(Fault.server_error())
    async with tcp_client(llm) as client:
        with pytest.raises(openai.RateLimitError) as limited:
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert limited.value.response.headers["retry-after"] == "1"
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
        with pytest.raises(openai.InternalServerError, match="no scripted response"):
            await client.chat.completions.create(model="m", messages=MESSAGES)
    llm.fail_next(Fault.hang())
    async with openai.AsyncOpenAI(base_url=llm.base_url, api_key="wrong", max_retries=0, timeout=0.3) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
    async with tcp_client(llm).with_options(timeout=0.3) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
    await llm.wait_for_disconnects(1, timeout_seconds=1)  # the timed-out client hung up


async def test_anthropic_messages(llm: FakeLLM) -> None:
    llm.anthropic.enqueue(anthropic_text("bonjour"), anthropic_tool_use("spawn_subagent", {"task": "x"}))
    async with anthropic.AsyncAnthropic(base_url=llm.anthropic_base_url, api_key=KEY, max_retries=0) as client:
        text = await client.messages.create(model="claude-x", max_tokens=64, messages=ANTHROPIC_MESSAGES)
        tool = await client.messages.create(model="claude-x", max_tokens=64, messages=ANTHROPIC_MESSAGES)
    assert isinstance(text.content[0], TextBlock) and text.content[0].text == "bonjour"
    assert text.usage.input_tokens == 10 and text.model == "claude-x"
    assert tool.stop_reason == "tool_use" and isinstance(tool.content[0], ToolUseBlock)
    assert tool.content[0].input == {"task": "x"}
    headers = llm.requests("/v1/messages")[0].headers  # anthropic 2.x sends the key as a Bearer token
    assert KEY in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
