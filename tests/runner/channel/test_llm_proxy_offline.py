"""The offline model behind LlmProxy, end to end with the clients that reach it: the OpenAI client and a
pydantic-ai agent, as the host's model step is (tool calls, follow-ups, streaming, structured output)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import BaseModel
from pydantic_ai import Agent, models
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from core.settings import LLMProvider
from runner.channel.llm_upstream import UpstreamConfig
from tests.runner.llm_proxy_helpers import RUN, ProxyFactory, Sink


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


async def test_offline_end_to_end_with_a_pydantic_ai_agent(
    make_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """pydantic-ai over the OpenAI client, as the host's model step uses them, against the offline model."""
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
