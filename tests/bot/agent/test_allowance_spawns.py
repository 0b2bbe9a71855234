"""A spawn is refused with the reason while the chat's or the bot's daily allowance is used up: the path
the main agent and scheduled tasks share (AllowanceCheckedSpawner), on real SQLite allowances."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from bot.agent.main_agent import MainAgent
from bot.agent.spawn_guard import AllowanceCheckedSpawner
from bot.ports.spawner import AllowanceRefused, SpawnRefused
from bot.turns.engine import Turn
from core.allowances import Allowances
from core.settings import load_settings
from core.store import ChatStore, MessageStore, NewMessage
from core.store.db import Database
from core.store.spend import SpendKind, SpendStore
from tests.bot.helpers import RecordingChannel, RecordingSpawner, make_delivery

CHAT = -100888


@pytest.fixture
async def allowances(db: Database) -> AsyncIterator[Allowances]:
    yield Allowances(load_settings(DATA_DIR="unused", CHAT_DAILY_TOKENS="1000", DAILY_TOKENS="5000"), SpendStore(db))


async def use(allowances: Allowances, chat_id: int, tokens: int) -> None:
    held = await allowances.reserve(chat_id, SpendKind.MAIN, tokens)
    await allowances.settle(held, tokens, 0, estimated=False)


async def test_a_spawn_is_refused_with_whose_allowance_is_used_up(allowances: Allowances) -> None:
    inner = RecordingSpawner()
    spawner = AllowanceCheckedSpawner(inner, allowances.left_for)
    assert await spawner.spawn(CHAT, "turn-1", "check", None, False) == inner.run_id  # allowance left: passes
    await use(allowances, CHAT, 1000)
    with pytest.raises(AllowanceRefused, match=r"^this chat's daily allowance of 1,000 tokens is used up") as caught:
        await spawner.spawn(CHAT, "turn-2", "check again", None, False)
    assert isinstance(caught.value, SpawnRefused)  # callers that know only the cap refusal still catch it
    assert await spawner.spawn(CHAT - 1, "turn-3", "elsewhere", None, False) == inner.run_id  # another chat's own
    for n in range(4):
        await use(allowances, CHAT - 2 - n, 1000)  # all chats together: 5,000 of 5,000
    with pytest.raises(AllowanceRefused, match=r"^the bot's daily allowance of 5,000 tokens is used up"):
        await spawner.spawn(CHAT - 1, "turn-4", "elsewhere again", None, False)
    assert [call[2] for call in inner.calls] == ["check", "elsewhere"]


async def test_a_turn_whose_spawn_is_refused_for_the_allowance_starts_no_run(
    db: Database, chats: ChatStore, messages: MessageStore, allowances: Allowances
) -> None:
    async def spends_then_spawns(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        call = ToolCallPart("spawn_subagent", {"task": "check the build"}, tool_call_id="c1")
        return ModelResponse(parts=[call], usage=RequestUsage(input_tokens=900, output_tokens=100))

    inner = RecordingSpawner()
    delivery = make_delivery(db, RecordingChannel(), "Crew")
    agent = MainAgent(
        lambda: FunctionModel(spends_then_spawns),
        messages,
        delivery,
        AllowanceCheckedSpawner(inner, allowances.left_for),
        assistant_name="Crew",
        history_window=20,
        timeout_seconds=10.0,
        allowances=allowances,
    )
    await chats.ensure(CHAT, "supergroup", "Team")
    row = await messages.add(NewMessage(chat_id=CHAT, sender_name="Alice", content="@crew check", is_trigger=True))
    await agent(Turn(id="turn-1", chat_id=CHAT, started_at=0.0, trigger_id=row))
    assert inner.calls == []
    (answer,) = [m for m in await messages.recent(CHAT, 10) if m.is_bot]
    assert answer.kind == "notice" and answer.content.startswith("This chat's daily allowance of 1,000 tokens")
