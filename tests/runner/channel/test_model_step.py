"""POST /run/model: the host makes a subagent's model steps. The conversation is the container's, so it
is hostile input: a file by URL (which pydantic-ai would fetch on the host), a part the agent never
writes, or no history at all is refused before any LLM call; steps come one at a time and are counted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from container.channel import ChannelRefused, RunChannel
from container.protocol import CHANNEL_SOCKET_FILE, TaskSpec
from runner.channel import model_step
from runner.channel.conversation_limits import ConversationLimits
from runner.channel.run_api import ChannelRefused as HostRefusal
from runner.channel.run_endpoint import EXTRA_MODEL_STEPS, RunInbox
from runner.runs.live_runs import LiveRun
from tests.container.scripted_llm import ScriptedLLM, TextReply

TASK = TaskSpec(run_id="run-step01", task="t", label="l", max_steps=2)
TOOLS: list[dict[str, Any]] = [
    {"name": "bash", "description": "Run a command.", "parameters": {"type": "object", "properties": {}}}
]


def prompt(content: Any) -> dict[str, Any]:
    return {"kind": "request", "parts": [{"part_kind": "user-prompt", "content": content}], "instructions": "be brief"}


@pytest.fixture
async def host(tmp_path: Path) -> Any:
    async with ScriptedLLM(tmp_path / CHANNEL_SOCKET_FILE, [TextReply("hello")], task=TASK) as host:
        yield host


async def step(host: ScriptedLLM, messages: list[Any], tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    return await RunChannel(host.socket_path).model_step({"messages": messages, "tools": tools})


async def test_a_step_is_answered_with_the_models_response(host: ScriptedLLM) -> None:
    response = await step(host, [prompt("say hello")])

    assert [(p["part_kind"], p["content"]) for p in response["parts"]] == [("text", "hello")]
    assert response["usage"]["input_tokens"] > 0
    (request,) = host.requests  # the provider's request the host built, with our tools and instructions
    assert request["messages"][0] == {"role": "system", "content": "be brief"}
    assert [tool["function"]["name"] for tool in request["tools"]] == ["bash"]


@pytest.mark.parametrize(
    "content",
    [
        [{"kind": "image-url", "url": "http://169.254.169.254/latest/meta-data/"}],
        ["look:", {"kind": "document-url", "url": "http://127.0.0.1:2375/containers/json"}],
    ],
)
async def test_a_file_by_url_is_refused_before_any_fetch_or_call(host: ScriptedLLM, content: Any) -> None:
    with pytest.raises(ChannelRefused, match=r"files by URL .* are not fetched by the host"):
        await step(host, [prompt(content)])
    assert host.requests == []


async def test_a_file_by_url_inside_a_tool_return_is_refused(host: ScriptedLLM) -> None:
    messages = [
        prompt("go"),
        {
            "kind": "response",
            "parts": [{"part_kind": "tool-call", "tool_name": "bash", "args": {}, "tool_call_id": "c"}],
        },
        {
            "kind": "request",
            "parts": [
                {
                    "part_kind": "tool-return",
                    "tool_name": "bash",
                    "tool_call_id": "c",
                    "content": [{"kind": "audio-url", "url": "http://10.0.0.1/x.mp3"}],
                }
            ],
        },
    ]
    with pytest.raises(ChannelRefused, match="files by URL"):
        await step(host, messages)
    assert host.requests == []


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        (
            [{"kind": "response", "parts": [{"part_kind": "builtin-tool-call", "tool_name": "web_search"}]}],
            "may not hold",
        ),
        ([{"kind": "request", "parts": [{"part_kind": "text", "content": "x"}]}], "may not hold"),
        ([{"kind": "request", "parts": [{"part_kind": "user-prompt"}]}], "not a valid model step"),
        ([], "not a valid model step: messages"),
    ],
)
async def test_a_conversation_the_agent_never_writes_is_refused(
    host: ScriptedLLM, messages: list[Any], reason: str
) -> None:
    with pytest.raises(ChannelRefused, match=reason):
        await step(host, messages)
    assert host.requests == []


async def test_an_oversized_tool_schema_is_refused(host: ScriptedLLM) -> None:
    schema = {"type": "object", "description": "x" * 10_000}
    with pytest.raises(ChannelRefused, match="over 8000 characters"):
        await step(host, [prompt("hi")], [{"name": "big", "description": "", "parameters": schema}])
    assert host.requests == []


async def test_steps_come_one_at_a_time_and_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    release = asyncio.Event()
    made: list[bytes] = []

    async def slow_step(spec: TaskSpec, socket_path: Path, body: bytes, limits: ConversationLimits) -> bytes:
        made.append(body)
        await release.wait()
        return b"{}"

    monkeypatch.setattr(model_step, "make_step", slow_step)
    live = LiveRun(id=TASK.run_id, chat_id=1, turn_id=None, label="l")
    inbox = RunInbox(
        live,
        TASK,
        socket_path=Path("/unused"),
        runs=cast(Any, None),
        delivery=cast(Any, None),
        max_messages=1,
        session_max_messages=10,
        files=cast(Any, None),  # these runs never reach their files
    )
    first = asyncio.create_task(inbox.model_step(b"1"))
    await asyncio.sleep(0)
    with pytest.raises(HostRefusal, match="one model step at a time") as busy:
        await inbox.model_step(b"2")
    assert busy.value.status == 409
    release.set()
    assert await first == b"{}"

    for _ in range(TASK.max_steps + EXTRA_MODEL_STEPS - 1):
        await inbox.model_step(b"n")
    with pytest.raises(HostRefusal, match="asked for 7 model steps") as spent:
        await inbox.model_step(b"over")
    assert spent.value.status == 429
    assert len(made) == TASK.max_steps + EXTRA_MODEL_STEPS

    live.cancelled = True
    with pytest.raises(HostRefusal, match="cancelled or finished"):
        await inbox.model_step(b"late")
