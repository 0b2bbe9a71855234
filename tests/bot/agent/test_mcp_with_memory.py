"""The main agent's toolsets together (issue 40 merged over streaming and memory): a turn offers the model its
own tools, the memory tools and the chat's MCP tools at once, streamed or not, and an MCP tool's result reaches
a streamed answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bot.agent.deps import TurnDeps
from bot.agent.llm_agent import build_llm_agent
from bot.agent.main_agent import MainAgent
from bot.agent.mcp_tools import turn_toolset
from bot.agent.memory import Memory, MemoryLimits
from bot.agent.streamed_turn import run_turn_streamed
from core.mcp_client import CallStatus
from core.store import Database
from core.store.history import HistoryIndex
from core.store.notes import NoteStore
from tests.bot.agent.test_main_agent import CHAT, NAME, Env, env, new_turn, tool_returns
from tests.bot.agent.test_mcp_tools import ToolCaller, servers

__all__ = ["env", "servers"]  # the fixtures, shared with test_main_agent.py and test_mcp_tools.py

LIMITS = MemoryLimits(max_notes=50, max_member_notes=20, note_chars=500, prompt_chars=6000, search_results=10)
MEMORY_TOOLS = {"remember", "remember_about", "forget", "search_history"}


async def test_a_turn_offers_the_memory_tools_and_the_chats_mcp_tools_together(
    env: Env, servers: Any, db: Database
) -> None:
    hub, counted = servers
    model = ToolCaller(("notes__echo", {"text": "hello"}))
    agent = MainAgent(
        lambda: FunctionModel(model),
        env.messages,
        env.delivery,
        env.spawner,
        assistant_name=NAME,
        history_window=50,
        timeout_seconds=60.0,
        memory=Memory(NoteStore(db), HistoryIndex(db), LIMITS),
        mcp=hub,
    )
    await env.say("@crew echo hello", trigger=True)

    await agent(new_turn())

    assert {"spawn_subagent", "notes__echo", *MEMORY_TOOLS} <= set(model.tool_names)
    assert model.returns and model.returns[0].endswith("\nhello")
    assert counted == [("notes", "echo", CallStatus.OK)]


async def test_a_streamed_turn_calls_an_mcp_tool_beside_the_memory_tools(env: Env, servers: Any, db: Database) -> None:
    hub, counted = servers
    seen: list[str] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        seen[:] = [tool.name for tool in info.function_tools]
        returned = tool_returns(messages)
        if not returned:
            yield {0: DeltaToolCall(name="notes__echo", json_args='{"text": "from the server"}', tool_call_id="c1")}
            return
        yield "echoed: "
        yield str(returned[0].content).rsplit("\n", 1)[-1]

    agent = build_llm_agent(
        FunctionModel(stream_function=stream),
        assistant_name=NAME,
        can_spawn=True,
        with_desk=False,
        can_schedule=False,
        can_remember=True,
    )
    toolset = await turn_toolset(hub, CHAT)
    assert toolset is not None
    memory = Memory(NoteStore(db), HistoryIndex(db), LIMITS)
    deps = TurnDeps(chat_id=CHAT, turn=new_turn(), spawner=env.spawner, memory=memory)
    shown: list[str] = []

    answer = await run_turn_streamed(agent, "echo something", deps, shown.append, toolsets=[toolset])

    assert {"spawn_subagent", "notes__echo", *MEMORY_TOOLS} <= set(seen)
    assert answer == "echoed: from the server" and shown[-1] == answer
    assert counted == [("notes", "echo", CallStatus.OK)]
