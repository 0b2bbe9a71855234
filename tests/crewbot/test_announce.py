"""Announce mode through the whole app (real store, outbox, engine and main agent with a FunctionModel,
the real subagent service on the in-memory container runtime): a finished run's result becomes a turn;
the chat gets the main agent's words, or nothing for the skip marker; the raw result is stored."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.announce import SKIP_MARKER
from bot.agent.offline import prompt_text
from container.channel import RunChannel
from container.protocol import SpawnRequest
from container.task import RunResult
from core.delivery import Delivery
from core.store.runs import RunStatus
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.app import App
from crewbot.serve import ObservedSubagents, unguarded
from runner.service import SubagentService
from tests.bot.helpers import RecordingChannel
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import GROUP_ID, make_settings
from tests.runner.lifecycle_helpers import socket_of

pytestmark = pytest.mark.timeout(60)

WAIT_SECONDS = 10.0


async def completing(container: MemoryContainer) -> int | None:
    async with RunChannel(socket_of(container)) as channel:
        task = await channel.task()
        await channel.report(RunResult(status="completed", result=f"raw output of {task.task}"))
    return 0


def announcing_model(prompts: list[str]) -> FunctionModel:
    """Says the result in its own words, or the skip marker for a run it need not mention."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = prompt_text(messages)
        prompts.append(prompt)
        if "housekeeping" in prompt:
            return ModelResponse(parts=[TextPart(SKIP_MARKER)])
        return ModelResponse(parts=[TextPart("Good news: the report is done, 42 pages.")])

    return FunctionModel(respond)


@asynccontextmanager
async def announcing_app(tmp_path: Path, prompts: list[str]) -> AsyncIterator[tuple[App, SubagentService]]:
    settings = make_settings(tmp_path / "data", SUBAGENT_RESULT_MODE="announce")
    stores = await Stores.open(settings)
    await stores.chats.ensure(GROUP_ID, "group", "Demo")
    runtime = MemoryRuntime(on_start=completing)
    built: list[SubagentService] = []

    def factory(delivery: Delivery, typing: TypingIndicator) -> ObservedSubagents:
        built.append(SubagentService(settings, stores, delivery, typing, runtime))
        return unguarded(settings, stores, built[0])

    app = App(settings, RecordingChannel(), stores, factory, model=announcing_model(prompts))
    await app.start()
    try:
        yield app, built[0]
    finally:
        await app.stop()
        await runtime.stop_behaviours()


async def until(check: Callable[[], object]) -> None:
    async with asyncio.timeout(WAIT_SECONDS):
        while True:  # the store has no change events
            if check():
                return
            await asyncio.sleep(0.02)


async def run_to_end(service: SubagentService, task: str) -> str:
    run_id = secrets.token_hex(6)
    await service.manager.on_request(GROUP_ID, SpawnRequest(request_id=run_id, task=task))
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            record = await service.runs.get(run_id)
            if record is not None and record.status == RunStatus.COMPLETED:
                return run_id
            await asyncio.sleep(0.02)


async def test_the_main_agent_tells_the_result_in_its_own_words(tmp_path: Path) -> None:
    prompts: list[str] = []
    async with announcing_app(tmp_path, prompts) as (app, service):
        channel = app.channel
        assert isinstance(channel, RecordingChannel)
        await run_to_end(service, "the report")
        await until(lambda: channel.texts(GROUP_ID))
        await app.wait_quiet(GROUP_ID)
        assert channel.texts(GROUP_ID) == ["Crew: Good news: the report is done, 42 pages."]
        # The turn was handed the result; the raw result is stored for the next prompt, not sent.
        assert any("raw output of the report" in p and "completed" in p for p in prompts)
        stored = await app.stores.messages.recent(GROUP_ID, 10)
        assert any(m.sender_name == "[Subagent]" and "raw output of the report" in m.content for m in stored)


async def test_the_skip_marker_sends_nothing(tmp_path: Path) -> None:
    prompts: list[str] = []
    async with announcing_app(tmp_path, prompts) as (app, service):
        channel = app.channel
        assert isinstance(channel, RecordingChannel)
        await run_to_end(service, "housekeeping")
        await until(lambda: bool(prompts))
        await app.wait_quiet(GROUP_ID)
        assert channel.texts(GROUP_ID) == []
        stored = await app.stores.messages.recent(GROUP_ID, 10)
        assert [m.content for m in stored if m.sender_name == "[Subagent]"] == [
            "[Task: housekeeping]\nraw output of housekeeping"
        ]
