"""POST /run/model under attack: what a container's step can make the host do beyond one bounded LLM call.

The conversation is the container's (an LLM following strangers' instructions wrote it), so nothing in it may
stall the host's event loop, which serves every chat and every other run.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic_ai.direct import model_request

from container.protocol import CHANNEL_SOCKET_FILE, TaskSpec
from runner.channel import model_step
from runner.channel.conversation_limits import ConversationLimits
from tests.container.scripted_llm import ScriptedLLM, TextReply

TASK = TaskSpec(run_id="run-review1", task="t", label="l", max_steps=2)
# The long conversation below is far past what a 2-step run may send: these tests are about threads, not caps.
LONG_RUN = ConversationLimits(max_messages=10_000, max_parts=10_000)
TOOLS: list[dict[str, Any]] = [
    {"name": "bash", "description": "Run a command.", "parameters": {"type": "object", "properties": {}}}
]


def long_conversation(calls: int) -> list[dict[str, Any]]:
    """A prompt and `calls` tool calls with their returns: about 190 bytes a call, well inside 8 MiB."""
    messages: list[dict[str, Any]] = [{"kind": "request", "parts": [{"part_kind": "user-prompt", "content": "go"}]}]
    for index in range(calls):
        call = {"part_kind": "tool-call", "tool_name": "bash", "args": {"c": "x"}, "tool_call_id": f"c{index}"}
        done = {"part_kind": "tool-return", "tool_name": "bash", "tool_call_id": f"c{index}", "content": "ok"}
        messages += [{"kind": "response", "parts": [call]}, {"kind": "request", "parts": [done]}]
    return messages


async def test_a_long_conversation_is_parsed_and_sent_off_the_hosts_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4,000 calls is a 0.8 MB body; its validation and the provider SDK's typed transform of the request took
    # about 2 s of CPU (15 s for a full 8 MiB body), which on the host's loop would stall every chat and run.
    # So both must run on other threads: the test records where they ran rather than timing the loop.
    body = json.dumps({"messages": long_conversation(4_000), "tools": TOOLS}).encode()
    threads: dict[str, int] = {}
    parse = model_step.parse_step

    def recorded_parse(raw: bytes, limits: ConversationLimits) -> Any:
        threads["parse"] = threading.get_ident()
        return parse(raw, limits)

    async def recorded_request(*args: Any, **kwargs: Any) -> Any:
        threads["request"] = threading.get_ident()
        return await model_request(*args, **kwargs)

    monkeypatch.setattr(model_step, "parse_step", recorded_parse)
    monkeypatch.setattr(model_step, "model_request", recorded_request)
    async with ScriptedLLM(tmp_path / CHANNEL_SOCKET_FILE, [TextReply("done")], task=TASK) as host:
        answer = await model_step.make_step(TASK, host.socket_path, body, LONG_RUN)

    assert [part["content"] for part in json.loads(answer)["response"]["parts"]] == ["done"]
    assert len(host.requests[0]["messages"]) == 1 + 2 * 4_000
    loop_thread = threading.get_ident()
    assert set(threads) == {"parse", "request"}
    assert loop_thread not in threads.values(), "the step's CPU work ran on the host's event loop"


async def test_a_cancelled_step_stops_its_call(tmp_path: Path) -> None:
    # The step runs on a thread of its own: cancelling the host's handler (the run closed) must end that
    # thread's call too, not leave it waiting on the LLM for its 600 s timeout.
    arrived = asyncio.Event()

    async def slow_llm(request: web.Request) -> web.Response:
        arrived.set()
        await asyncio.sleep(60)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow_llm)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    socket_path = tmp_path / CHANNEL_SOCKET_FILE
    await web.UnixSite(runner, str(socket_path)).start()
    try:
        body = json.dumps({"messages": long_conversation(1), "tools": TOOLS}).encode()
        step = asyncio.create_task(model_step.make_step(TASK, socket_path, body, LONG_RUN))
        await asyncio.wait_for(arrived.wait(), 10)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        steps = [thread for thread in threading.enumerate() if thread.name == "model-step"]
        for thread in steps:
            await asyncio.to_thread(thread.join, 5)
        assert not [thread for thread in steps if thread.is_alive()]
    finally:
        await runner.cleanup()
