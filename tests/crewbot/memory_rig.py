"""The memory tests' rig: real PTB against the fake Bot API, the real store on a SQLite file, the real engine,
main agent, commands and subagent service (on the in-memory container runtime, whose container hands back a
session holding the notes it was handed), and a scripted model that calls the memory tools the test plans."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.memory import Memory, MemoryLimits
from bot.agent.offline import prompt_text
from bot.channels.telegram import TelegramChannel
from container.channel import RunChannel
from container.task import RunResult
from core.delivery import Delivery
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.app import App
from crewbot.serve import ObservedSubagents, unguarded
from runner.service import SubagentService
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, POLL_TIMEOUT_SECONDS, make_settings
from tests.runner.lifecycle_helpers import socket_of

ADMIN, ALICE, BOB, MALLORY = 7001, 7002, 7003, 7004
WAIT_SECONDS = 30.0  # a ceiling, not a pause: a loaded CI machine took over 10 s to answer /forgetme once
MONDAY = datetime(2026, 11, 23, 18, 5, tzinfo=UTC).timestamp()


@dataclass
class Script:
    """Each turn makes the calls the test planned (all at once), then answers with what the tools returned."""

    plans: list[list[tuple[str, dict[str, Any]]]] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    held: asyncio.Event | None = None  # set: the first request is set aside (thinking) until cancelled

    async def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if self.held is not None and not self.held.is_set():
            self.held.set()
            await asyncio.Event().wait()  # only a cancel (the merge) ends it
        results = [str(p.content) for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if results:
            self.returned.extend(results)
            return ModelResponse(parts=[TextPart(" | ".join(results))])
        self.prompts.append(prompt_text(messages))
        calls = self.plans.pop(0) if self.plans else []
        if not calls:
            return ModelResponse(parts=[TextPart("noted")])
        return ModelResponse(parts=[ToolCallPart(n, a, tool_call_id=f"c{i}") for i, (n, a) in enumerate(calls)])


@dataclass
class Rig:
    app: App
    tg: FakeTelegram
    script: Script
    tasks: list[str]  # what subagents were given
    sent: int = 0

    def say(self, user_id: int, name: str, text: str) -> None:
        self.tg.push_message(GROUP_ID, f"@{self.tg.bot_username} {text}", user_id=user_id, first_name=name)

    def command(self, user_id: int, name: str, text: str) -> None:
        self.tg.push_message(GROUP_ID, text, user_id=user_id, first_name=name)

    async def next_reply(self) -> str:
        self.sent += 1
        sent = await self.tg.wait_for_messages(GROUP_ID, self.sent, WAIT_SECONDS)
        return sent[self.sent - 1].plain_text

    async def stored(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        async with self.app.stores.db.conn.execute(sql, params) as cursor:
            return [tuple(row) for row in await cursor.fetchall()]

    def raw_bytes(self) -> bytes:
        path = self.app.stores.db.path
        wal = Path(f"{path}-wal")
        return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def proposes_a_note(container: MemoryContainer, tasks: list[str]) -> int:
    async with RunChannel(socket_of(container)) as channel:
        task = await channel.task()
        tasks.append(f"{task.task}\n\n{task.notes}")
        # Its session, as the in-container agent hands it back: the task and the notes, each a prompt part.
        asked = ModelRequest(parts=[UserPromptPart(task.task), UserPromptPart(task.notes)])
        answered = ModelResponse(parts=[TextPart("Picnic planned.")])
        await channel.save_session(ModelMessagesTypeAdapter.dump_json([asked, answered]))
        await channel.report(RunResult(status="completed", result="Picnic planned.\n[remember] picnic moved to Sunday"))
    return 0


@asynccontextmanager
async def rig(tmp_path: Path, **settings: Any) -> AsyncIterator[Rig]:
    script, tasks = Script(), list[str]()
    async with FakeTelegram() as tg:
        tg.add_chat(GROUP_ID, title="crew")
        tg.set_chat_admins(GROUP_ID, [ADMIN])
        config = make_settings(tmp_path / "data", tg, **settings)
        stores = await Stores.open(config)
        await stores.chats.ensure(GROUP_ID, "group", "crew")
        runtime = MemoryRuntime(on_start=lambda container: proposes_a_note(container, tasks))

        def factory(delivery: Delivery, typing: TypingIndicator) -> ObservedSubagents:
            memory = Memory(stores.notes, stores.history, MemoryLimits.from_settings(config))
            service = SubagentService(config, stores, delivery, typing, runtime, chat_notes=memory.subagent_notes)
            return unguarded(config, stores, service)

        assert config.telegram_bot_token is not None
        channel = TelegramChannel(
            config.telegram_bot_token.get_secret_value(), tg.base_url, poll_timeout_seconds=POLL_TIMEOUT_SECONDS
        )
        app = App(config, channel, stores, factory, model=FunctionModel(script.respond))
        await app.start()
        try:
            yield Rig(app, tg, script, tasks)
        finally:
            await app.stop()
            await runtime.stop_behaviours()
