"""MainAgent: the model sees the stored history; replies, apologies and spawn calls go where they should."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.main_agent import APOLOGY, MainAgent
from bot.agent.prompt import LATEST_MARKER
from bot.turns.engine import Turn
from core.store import ChatStore, MessageStore, NewMessage, StoredMessage
from core.store.db import Database
from tests.bot.helpers import RecordingChannel, RecordingSpawner, make_delivery

CHAT = -100555
NAME = "Crew"

ModelFunction = Callable[[list[ModelMessage], AgentInfo], Awaitable[ModelResponse]]


def prompt_of(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    raise AssertionError("no user prompt in the request")


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


class ScriptedModel:
    """The LLM edge: records what each request showed the model, answers with `reply` (or a callable)."""

    def __init__(self, reply: str = "Sure, here you go.") -> None:
        self.reply = reply
        self.requests: list[list[ModelMessage]] = []
        self.infos: list[AgentInfo] = []

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        self.infos.append(info)
        return ModelResponse(parts=[TextPart(self.reply)])

    @property
    def prompt(self) -> str:
        return prompt_of(self.requests[0])


class Env:
    def __init__(self, db: Database, chats: ChatStore, messages: MessageStore) -> None:
        self.chats = chats
        self.messages = messages
        self.channel = RecordingChannel()
        self.delivery = make_delivery(db, self.channel, NAME)
        self.spawner = RecordingSpawner()
        self._next_platform_id = 1

    async def say(self, text: str, *, sender: str = "Alice", trigger: bool = False) -> None:
        await self.chats.ensure(CHAT, "supergroup", "Team")
        self._next_platform_id += 1
        await self.messages.add(
            NewMessage(
                chat_id=CHAT,
                sender_name=sender,
                content=text,
                sender_id=len(sender),
                platform_message_id=self._next_platform_id,
                is_trigger=trigger,
            )
        )

    def agent(
        self,
        model: ModelFunction,
        *,
        with_spawner: bool = True,
        history_window: int = 50,
        timeout_seconds: float = 10.0,
        abilities: Callable[[], str] | None = None,
    ) -> MainAgent:
        return MainAgent(
            lambda: FunctionModel(model),
            self.messages,
            self.delivery,
            self.spawner if with_spawner else None,
            assistant_name=NAME,
            history_window=history_window,
            timeout_seconds=timeout_seconds,
            abilities=abilities,
        )

    async def stored(self) -> list[StoredMessage]:
        return await self.messages.recent(CHAT, 1000)


@pytest.fixture
def env(db: Database, chats: ChatStore, messages: MessageStore) -> Env:
    return Env(db, chats, messages)


def new_turn(turn_id: str = "turn-1") -> Turn:
    return Turn(id=turn_id, chat_id=CHAT, started_at=0.0)


async def test_model_sees_group_messages_bot_replies_and_subagent_results(env: Env) -> None:
    await env.say("we should check the build logs", sender="Bob")
    await env.delivery.post(CHAT, "Earlier answer from me.")
    await env.messages.add(
        NewMessage(
            chat_id=CHAT,
            sender_name="[Subagent]",
            content="[Task: x]\nresult",
            is_bot=True,
            kind="subagent",
        )
    )
    await env.say("@crew what did the subagent find?", trigger=True)
    model = ScriptedModel()

    await env.agent(model)(new_turn())

    prompt = model.prompt
    assert "Bob: we should check the build logs" in prompt
    assert f"{NAME} (you): Earlier answer from me." in prompt
    assert "[Subagent]: [Task: x]\nresult" in prompt
    assert f"{LATEST_MARKER}Alice:\n@crew what did the subagent find?" in prompt
    assert prompt.index("build logs") < prompt.index("Earlier answer") < prompt.index("[Task: x]")
    assert model.infos[0].instructions is not None
    assert NAME in model.infos[0].instructions


async def test_each_turn_is_told_what_subagents_can_do_as_it_is_then(env: Env) -> None:
    said = ["Subagents have no network."]
    await env.say("@crew fetch the page", trigger=True)
    model = ScriptedModel()
    agent = env.agent(model, abilities=lambda: said[-1])

    await agent(new_turn("turn-a"))
    said.append("Subagents can reach only these hosts over HTTP(S): pypi.org.")
    await env.say("@crew and now?", trigger=True)
    await agent(new_turn("turn-b"))

    prompts = [prompt_of(request) for request in model.requests]
    assert prompts[0].startswith("Subagents have no network.\n\n")
    assert prompts[1].startswith("Subagents can reach only these hosts over HTTP(S): pypi.org.")
    # Without subagents there is nothing to tell.
    lone = ScriptedModel()
    await env.agent(lone, with_spawner=False, abilities=lambda: said[-1])(new_turn("turn-c"))
    assert "Subagents can reach" not in lone.prompt


async def test_reply_is_stored_as_the_bots_and_sent_with_prefix(env: Env) -> None:
    await env.say("@crew hi", trigger=True)
    turn = new_turn()

    await env.agent(ScriptedModel("  Hello there!  "))(turn)

    assert env.channel.sent == [(CHAT, "Crew: Hello there!")]
    last = (await env.stored())[-1]
    assert (last.content, last.is_bot, last.is_trigger, last.kind) == ("Hello there!", True, False, "reply")
    assert last.sender_name == NAME
    assert turn.delivering  # begin_delivery was called before sending


async def test_the_next_turn_sees_this_turns_reply(env: Env) -> None:
    await env.say("@crew first question", trigger=True)
    await env.agent(ScriptedModel("first answer"))(new_turn("a"))
    await env.say("@crew second question", trigger=True)
    model = ScriptedModel()

    await env.agent(model)(new_turn("b"))

    assert f"{NAME} (you): first answer" in model.prompt
    assert f"{LATEST_MARKER}Alice:\n@crew second question" in model.prompt


async def test_model_error_sends_and_stores_an_apology(env: Env) -> None:
    await env.say("@crew hi", trigger=True)

    async def broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("upstream 500")

    await env.agent(broken)(new_turn())

    assert env.channel.sent == [(CHAT, f"Crew: {APOLOGY}")]
    last = (await env.stored())[-1]
    assert (last.content, last.is_bot, last.kind) == (APOLOGY, True, "notice")


async def test_slow_model_times_out_with_an_apology(env: Env) -> None:
    await env.say("@crew hi", trigger=True)
    never = asyncio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await never.wait()
        return ModelResponse(parts=[TextPart("too late")])

    await asyncio.wait_for(env.agent(slow, timeout_seconds=0.05)(new_turn()), 5)

    assert env.channel.texts(CHAT) == [f"Crew: {APOLOGY}"]


async def test_empty_answer_is_replaced(env: Env) -> None:
    await env.say("@crew hi", trigger=True)

    await env.agent(ScriptedModel("   "))(new_turn())

    assert env.channel.texts(CHAT) == ["Crew: (no answer)"]


async def test_spawn_subagent_reaches_the_spawner_and_the_result_reaches_the_model(env: Env) -> None:
    await env.say("@crew run the tests in the background", trigger=True)
    seen: list[list[ModelMessage]] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        if len(seen) == 1:
            assert [tool.name for tool in info.function_tools] == ["spawn_subagent"]
            args = {"task": "Run pytest and report failures", "label": "tests", "include_context": True}
            return ModelResponse(parts=[ToolCallPart("spawn_subagent", args, tool_call_id="call-1")])
        returned = tool_returns(messages)
        return ModelResponse(parts=[TextPart(f"Started it. ({returned[-1].content})")])

    turn = new_turn("turn-spawn")
    await env.agent(model)(turn)

    assert env.spawner.calls == [(CHAT, "turn-spawn", "Run pytest and report failures", "tests", True)]
    returned = tool_returns(seen[1])
    assert len(returned) == 1
    assert returned[0].tool_name == "spawn_subagent"
    assert "run-abc123" in str(returned[0].content)
    assert "(tests)" in str(returned[0].content)
    assert env.channel.texts(CHAT)[0].startswith("Crew: Started it. (Started subagent run run-abc123")


async def test_spawn_defaults_for_label_and_context(env: Env) -> None:
    await env.say("@crew do it", trigger=True)

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not tool_returns(messages):
            return ModelResponse(parts=[ToolCallPart("spawn_subagent", {"task": "echo hi"}, tool_call_id="c")])
        return ModelResponse(parts=[TextPart("ok")])

    await env.agent(model)(new_turn())

    assert env.spawner.calls == [(CHAT, "turn-1", "echo hi", None, False)]


async def test_spawner_failure_is_reported_to_the_model(env: Env) -> None:
    await env.say("@crew start something", trigger=True)
    env.spawner.error = RuntimeError("all slots busy")
    seen: list[list[ModelMessage]] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        if len(seen) == 1:
            return ModelResponse(parts=[ToolCallPart("spawn_subagent", {"task": "x"}, tool_call_id="c")])
        return ModelResponse(parts=[TextPart("Could not start it, sorry.")])

    await env.agent(model)(new_turn())

    returned = tool_returns(seen[1])
    assert len(returned) == 1
    assert "Could not start the subagent: all slots busy" in str(returned[0].content)
    assert env.channel.texts(CHAT) == ["Crew: Could not start it, sorry."]


async def test_without_a_spawner_the_model_gets_no_tool(env: Env) -> None:
    await env.say("@crew hi", trigger=True)
    model = ScriptedModel()

    await env.agent(model, with_spawner=False)(new_turn())

    assert model.infos[0].function_tools == []
    assert "spawn_subagent" not in (model.infos[0].instructions or "")


async def test_a_model_that_loops_on_tools_is_cut_off_with_an_apology(env: Env) -> None:
    await env.say("@crew hi", trigger=True)
    calls = 0

    async def looping(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        return ModelResponse(parts=[ToolCallPart("spawn_subagent", {"task": f"t{calls}"}, tool_call_id=f"c{calls}")])

    await env.agent(looping)(new_turn())

    assert calls <= 8
    assert env.channel.texts(CHAT) == [f"Crew: {APOLOGY}"]


async def test_prompt_window_is_bounded_by_history_window(env: Env) -> None:
    for i in range(30):
        await env.say(f"message number {i:02d}", sender="Bob")
    await env.say("@crew summarise", trigger=True)
    model = ScriptedModel()

    await env.agent(model, history_window=5)(new_turn())

    prompt = model.prompt
    shown = [i for i in range(30) if f"message number {i:02d}" in prompt]
    assert shown == [26, 27, 28, 29]
    assert "@crew summarise" in prompt


async def test_cancelled_turn_sends_nothing(env: Env) -> None:
    await env.say("@crew hi", trigger=True)
    entered = asyncio.Event()

    async def waiting(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    task = asyncio.create_task(env.agent(waiting)(new_turn()))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.channel.sent == []
    assert all(not m.is_bot for m in await env.stored())


async def test_a_turn_answers_its_own_trigger_and_never_sees_a_later_one(env: Env) -> None:
    await env.say("@crew first question", trigger=True)
    (first,) = [m for m in await env.stored() if m.is_trigger]
    await env.say("@crew a later question", trigger=True)  # stored while the turn was starting
    model = ScriptedModel()
    turn = Turn(id="turn-1", chat_id=CHAT, started_at=0.0, trigger_id=first.id)

    await env.agent(model)(turn)

    assert "first question" in model.prompt.partition(LATEST_MARKER)[2]
    assert "later question" not in model.prompt


async def test_the_llm_agent_is_built_once_on_first_use(env: Env) -> None:
    """Not at construction (the bot starts without the LLM stack); two first turns at once build it once."""
    built: list[FunctionModel] = []

    def build() -> FunctionModel:
        built.append(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("hi")])))
        return built[-1]

    agent = MainAgent(
        build, env.messages, env.delivery, None, assistant_name=NAME, history_window=50, timeout_seconds=10.0
    )
    assert built == []
    first, second = await asyncio.gather(agent.llm_agent(), agent.llm_agent())
    assert first is second and len(built) == 1
    assert first.model is built[0]
