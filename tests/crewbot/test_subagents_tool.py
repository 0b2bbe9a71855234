"""The main agent's `subagents` tool from the model's side: a FunctionModel calls it against the real
subagent service (real store, real run channels and LLM proxy, the in-memory container runtime) whose
containers call a fake OpenAI-compatible provider through their run socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.main_agent import MainAgent
from bot.turns.engine import Turn
from container.channel import RunChannel
from core.store.messages import NewMessage
from core.store.runs import RunStatus
from crewbot.serve import runs_view
from tests.fakes.llm_replies import openai_text
from tests.fakes.llm_server import FakeLLM
from tests.fakes.memory_runtime import MemoryContainer
from tests.runner.lifecycle_helpers import CHAT_ID, OTHER_CHAT_ID, Rig, rig, socket_of

pytestmark = pytest.mark.timeout(60)


class Steps:
    """A container that makes one LLM call, says how it is going, then makes its next call when the test
    lets it, and then works until it is killed."""

    def __init__(self) -> None:
        self.first_call_done = asyncio.Event()
        self.next_step = asyncio.Event()

    async def behaviour(self, channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        transport = httpx2.AsyncHTTPTransport(uds=str(socket_of(container)))
        async with httpx2.AsyncClient(transport=transport, base_url="http://llm", timeout=10) as llm:
            body = {"model": "any", "messages": [{"role": "user", "content": f"work on: {task.task}"}]}
            assert (await llm.post("/v1/chat/completions", json=body)).status_code == 200
            await channel.send_message("message-1", "Report: 2 of 5 sections written")
            self.first_call_done.set()
            await self.next_step.wait()
            await llm.post("/v1/chat/completions", json=body)
        await asyncio.Event().wait()
        return None


def tool_calls(*calls: dict[str, Any]) -> tuple[FunctionModel, list[str]]:
    """A model that calls the tool once per turn with the next arguments, then answers with what it got."""
    returned: list[str] = []
    pending = list(calls)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        for part in last.parts:
            if isinstance(part, ToolReturnPart):
                returned.append(str(part.content))
                return ModelResponse(parts=[TextPart(str(part.content))])
        return ModelResponse(parts=[ToolCallPart("subagents", pending.pop(0))])

    return FunctionModel(respond), returned


OPERATOR = 4242  # the one admin: only an admin's request may cancel a run (tests/crewbot/test_agent_authority.py)


async def is_operator(chat_id: int, user_id: int) -> bool:
    return user_id == OPERATOR


def agent_for(r: Rig, model: FunctionModel) -> MainAgent:
    return MainAgent(
        lambda: model,
        r.stores.messages,
        r.delivery,
        r.service.spawner,
        assistant_name="Crew",
        history_window=20,
        timeout_seconds=10,
        desk=runs_view(r.settings, r.stores, r.service),
        is_admin=is_operator,
    )


async def test_list_status_send_and_cancel_reflect_and_steer_a_real_run(tmp_path: Path) -> None:
    steps = Steps()
    async with FakeLLM() as llm:
        llm.openai.handle_with(lambda body: openai_text("working on it"))
        async with rig(
            tmp_path, steps.behaviour, LLM_PROVIDER="openai", LLM_BASE_URL=llm.base_url, LLM_API_KEY="k", LLM_MODEL="m"
        ) as r:
            run_id = await r.spawn("the quarterly report")
            other = await r.spawn("another chat's job", chat_id=OTHER_CHAT_ID)
            await asyncio.wait_for(steps.first_call_done.wait(), 10)
            await r.until_status(run_id, RunStatus.RUNNING)
            model, returned = tool_calls(
                {"action": "list"},
                {"action": "status", "run_id": run_id},
                {"action": "send", "run_id": run_id, "text": "Skip the appendix."},
                {"action": "status", "run_id": other},
                {"action": "cancel", "run_id": run_id},
            )
            agent = agent_for(r, model)
            for n in range(4):
                await agent(Turn(id=f"turn-{n}", chat_id=CHAT_ID, started_at=0.0))

            listed, status, sent, foreign = returned
            assert run_id in listed and "running" in listed and "the quarterly report" in listed
            assert other not in listed  # only this chat's runs
            assert "running" in status and "Report: 2 of 5 sections written" in status
            assert sent.startswith(f"Sent to run {run_id}")
            assert foreign == f"This chat has no run {other}."

            # The follow-up reached the subagent's next LLM request, as its last user message.
            await llm.wait_for_requests(2, 10, path="/v1/chat/completions")
            before = len(llm.requests("/v1/chat/completions"))
            steps.next_step.set()
            await llm.wait_for_requests(before + 2, 10, path="/v1/chat/completions")  # both runs
            mine = [q for q in llm.requests("/v1/chat/completions") if "the quarterly report" in json.dumps(q.body)]
            assert "Skip the appendix." not in json.dumps(mine[0].body)
            last_message = mine[-1].body["messages"][-1]
            assert last_message["role"] == "user" and "Skip the appendix." in last_message["content"]

            asked = await r.stores.messages.add(
                NewMessage(chat_id=CHAT_ID, sender_name="Op", sender_id=OPERATOR, content="stop it", is_trigger=True)
            )
            await agent(Turn(id="turn-4", chat_id=CHAT_ID, started_at=0.0, trigger_id=asked))
            assert returned[-1] == f"Run {run_id} is cancelled."
            assert await r.status(run_id) == RunStatus.CANCELLED
            record = await r.service.runs.get(run_id)
            assert record is not None and record.container_id in r.runtime.kills  # killed, not just marked
            await r.service.manager.cancel_run(OTHER_CHAT_ID, other)
            await r.settled()
