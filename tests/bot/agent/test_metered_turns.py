"""Main-agent turns against the daily allowances, on real SQLite: every model request is counted under the
turn's chat and kind, estimated (and marked so) when the provider reports no usage, admitted only while
allowance is left; a chat with none left gets a one-line notice and no model call; a burst of 50 turns
spends at most the allowance plus one call."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

from bot.agent.main_agent import UNANNOUNCED, MainAgent
from bot.agent.metered import OUTPUT_CAP_TOKENS, request_size
from bot.turns.engine import Turn
from core.allowances import Allowances, Reservation, tokens_of_bytes
from core.settings import load_settings
from core.store import ChatStore, MessageStore, NewMessage, StoredMessage
from core.store.db import Database
from core.store.spend import Spend, SpendKind, SpendStore
from tests.bot.helpers import RecordingChannel, RecordingSpawner, make_delivery

CHAT = -100777
NAME = "Crew"
SPENT = "This chat's daily allowance of {n:,} tokens is used up for today; it resets at 00:00 (UTC)."


def chars_of(messages: list[ModelMessage], info: AgentInfo) -> int:
    """The request's size as the metering sees it (messages, instructions, tool definitions)."""
    parameters = ModelRequestParameters(function_tools=info.function_tools, output_tools=info.output_tools)
    return request_size(messages, parameters)


@dataclass
class Provider:
    """The LLM edge: answers `reply`, reporting `usage(messages, info)` (None: no usage at all); `spawn`
    makes the first request of a turn call the spawn tool; `delay` is each request's latency."""

    reply: str = "Sure."
    usage: Callable[[list[ModelMessage], AgentInfo], RequestUsage | None] = lambda m, i: RequestUsage(
        input_tokens=120, output_tokens=30
    )
    spawn: bool = False
    delay: Callable[[], float] = lambda: 0.0
    calls: int = 0
    reported: list[RequestUsage] = field(default_factory=list)

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        await asyncio.sleep(self.delay())
        returned = any(isinstance(p, ToolReturnPart) for p in messages[-1].parts)
        parts: list[TextPart | ToolCallPart] = [TextPart(self.reply)]
        if self.spawn and not returned:
            parts = [ToolCallPart("spawn_subagent", {"task": "check the build"}, tool_call_id="c1")]
        usage = self.usage(messages, info)
        self.reported.append(usage or RequestUsage())
        return ModelResponse(parts=list(parts), usage=usage or RequestUsage(unmeasured_requests=1))


class SpyAllowances(Allowances):
    """The real allowances, also noting each model request's estimate (left_for's 1-token probes aside)."""

    estimates: list[int]

    async def reserve(self, chat_id: int, kind: SpendKind, estimate: int) -> Reservation:
        if estimate > 1:
            self.estimates.append(estimate)
        return await super().reserve(chat_id, kind, estimate)


class Env:
    def __init__(self, db: Database, chats: ChatStore, messages: MessageStore, **settings: str) -> None:
        self.db, self.chats, self.messages = db, chats, messages
        self.delivery = make_delivery(db, RecordingChannel(), NAME)
        self.spawner = RecordingSpawner()
        self.allowances = SpyAllowances(load_settings(DATA_DIR="unused", **settings), SpendStore(db))
        self.allowances.estimates = []

    def agent(
        self,
        provider: Provider,
        *,
        model_settings: ModelSettings | None = None,
        announcements: Callable[[int], Awaitable[str | None]] | None = None,
        metered: bool = True,
        timeout_seconds: float = 10.0,
    ) -> MainAgent:
        return MainAgent(
            lambda: FunctionModel(provider, settings=model_settings),
            self.messages,
            self.delivery,
            self.spawner,
            assistant_name=NAME,
            history_window=50,
            timeout_seconds=timeout_seconds,
            announcements=announcements,
            allowances=self.allowances if metered else None,
        )

    async def ask(self, text: str, chat_id: int = CHAT) -> Turn:
        """A member's mention, stored; the turn that answers it."""
        await self.chats.ensure(chat_id, "supergroup", "Team")
        row_id = await self.messages.add(
            NewMessage(chat_id=chat_id, sender_name="Alice", content=text, sender_id=5, is_trigger=True)
        )
        return Turn(id=f"turn-{row_id}", chat_id=chat_id, started_at=0.0, trigger_id=row_id)

    async def spend(self, chat_id: int = CHAT) -> dict[SpendKind, Spend]:
        today = self.allowances.today()
        return {row.kind: row.spend for row in await SpendStore(self.db).rows(today, chat_id)}

    async def bot_said(self, chat_id: int = CHAT) -> list[StoredMessage]:
        return [m for m in await self.messages.recent(chat_id, 1000) if m.is_bot]


@pytest.fixture
def env(db: Database, chats: ChatStore, messages: MessageStore) -> Env:
    return Env(db, chats, messages)


async def test_a_turns_tokens_are_counted_under_its_chat_and_kind(env: Env) -> None:
    provider = Provider(spawn=True)  # two model requests: the spawn call, then the answer
    agent = env.agent(provider)
    await agent(await env.ask("@crew check the build"))
    assert (await env.spend())[SpendKind.MAIN] == Spend(input_tokens=240, output_tokens=60, calls=2)

    async def finished(chat_id: int) -> str:
        return "Subagent runs have finished: run r1 (build): completed."

    announcing = env.agent(Provider(), announcements=finished)
    await announcing(Turn(id="announce-1", chat_id=CHAT, started_at=0.0))  # no message asked: an announcement
    spend = await env.spend()
    assert spend[SpendKind.ANNOUNCE] == Spend(input_tokens=120, output_tokens=30, calls=1)
    assert spend[SpendKind.MAIN].calls == 2
    assert await env.spend(CHAT - 1) == {}  # another chat spent nothing


async def test_a_provider_reporting_no_usage_is_counted_estimated_from_the_request_size(env: Env) -> None:
    sizes: list[int] = []

    def no_usage(messages: list[ModelMessage], info: AgentInfo) -> None:
        sizes.append(chars_of(messages, info))
        return None

    provider = Provider(reply="x" * 300, usage=no_usage)
    await env.agent(provider)(await env.ask("@crew hello"))
    (size,) = sizes
    assert (await env.spend())[SpendKind.MAIN] == Spend(
        input_tokens=tokens_of_bytes(size), output_tokens=tokens_of_bytes(300), calls=1, estimated_calls=1
    )
    (said,) = await env.bot_said()
    assert (said.kind, said.content) == ("reply", "x" * 300)


async def test_each_request_reserves_its_size_plus_its_output_cap(env: Env) -> None:
    sizes: list[int] = []

    def sized(messages: list[ModelMessage], info: AgentInfo) -> RequestUsage:
        sizes.append(chars_of(messages, info))
        return RequestUsage(input_tokens=10, output_tokens=10)

    await env.agent(Provider(usage=sized))(await env.ask("@crew one"))
    await env.agent(Provider(usage=sized), model_settings={"max_tokens": 256})(await env.ask("@crew two"))
    assert env.allowances.estimates == [
        tokens_of_bytes(sizes[0]) + OUTPUT_CAP_TOKENS,
        tokens_of_bytes(sizes[1]) + 256,
    ]


async def test_a_chat_out_of_allowance_gets_a_one_line_notice_and_no_model_call(db: Database, env: Env) -> None:
    env = Env(env.db, env.chats, env.messages, CHAT_DAILY_TOKENS="1000")
    held = await env.allowances.reserve(CHAT, SpendKind.SUBAGENT, 1000)  # its subagents used it all
    await env.allowances.settle(held, 900, 100, estimated=False)
    provider = Provider()
    turn = await env.ask("@crew are you there?")
    await env.agent(provider)(turn)

    assert provider.calls == 0
    (notice,) = await env.bot_said()
    assert (notice.kind, notice.content) == ("notice", SPENT.format(n=1000))
    asked = [m for m in await env.messages.recent(CHAT, 100) if not m.is_bot]
    assert [(m.id, m.content) for m in asked] == [(turn.trigger_id, "@crew are you there?")]  # kept in history

    async def finished(chat_id: int) -> str:  # an announcement turn: its runs stay waiting, not taken
        raise AssertionError("the runs are told at the next turn that is let in")

    await env.agent(provider, announcements=finished)(Turn(id="announce-1", chat_id=CHAT, started_at=0.0))
    assert (await env.bot_said())[-1].content == f"{SPENT.format(n=1000)} {UNANNOUNCED}"
    assert provider.calls == 0


async def test_allowance_used_up_during_a_turn_ends_it_with_the_notice(env: Env) -> None:
    env = Env(env.db, env.chats, env.messages, CHAT_DAILY_TOKENS="3000")
    # The first request (the spawn call) uses the whole allowance; the second is refused before it is sent.
    provider = Provider(spawn=True, usage=lambda m, i: RequestUsage(input_tokens=2800, output_tokens=200))
    await env.agent(provider)(await env.ask("@crew check the build"))
    assert provider.calls == 1 and len(env.spawner.calls) == 1
    (notice,) = await env.bot_said()
    assert (notice.kind, notice.content) == ("notice", SPENT.format(n=3000))
    assert (await env.spend())[SpendKind.MAIN] == Spend(input_tokens=2800, output_tokens=200, calls=1)


async def test_a_request_cut_off_in_flight_is_counted_at_its_input_estimate_and_frees_its_hold(env: Env) -> None:
    env = Env(env.db, env.chats, env.messages, CHAT_DAILY_TOKENS="100000")
    sizes: list[int] = []

    def sized(messages: list[ModelMessage], info: AgentInfo) -> RequestUsage:
        sizes.append(chars_of(messages, info))
        return RequestUsage(input_tokens=10, output_tokens=10)

    provider = Provider(usage=sized, delay=lambda: 30.0)  # never answers within the turn's timeout
    await env.agent(provider, timeout_seconds=0.2)(await env.ask("@crew slow"))
    (apology,) = await env.bot_said()
    assert apology.kind == "notice" and apology.content.startswith("Sorry")
    spend = (await env.spend())[SpendKind.MAIN]
    assert spend.calls == spend.estimated_calls == 1 and spend.output_tokens == 0 and spend.input_tokens > 0
    held = await env.allowances.reserve(CHAT, SpendKind.MAIN, 100000 - spend.input_tokens)
    assert held.tokens == 100000 - spend.input_tokens  # nothing is still held by the cut-off request


def realistic(messages: list[ModelMessage], info: AgentInfo) -> RequestUsage:
    """What a provider reports: about 4 characters a token in, a short answer out."""
    return RequestUsage(input_tokens=-(-chars_of(messages, info) // 4), output_tokens=60)


@pytest.mark.parametrize("spread", [False, True], ids=["all-at-once", "spread-over-200ms"])
@pytest.mark.parametrize("whose", ["CHAT_DAILY_TOKENS", "DAILY_TOKENS"])
async def test_a_burst_of_fifty_turns_spends_at_most_the_allowance_plus_one_call(
    env: Env, whose: str, spread: bool
) -> None:
    """50 turns race on an allowance covering 10 calls (one chat's, or the bot's over 50 chats)."""
    probe = Provider(usage=realistic)
    await env.agent(probe, metered=False)(await env.ask("@crew go", chat_id=CHAT - 1))  # one call's size
    call = probe.reported[0].input_tokens + probe.reported[0].output_tokens
    allowance = 10 * call
    env = Env(env.db, env.chats, env.messages, **{whose: str(allowance)})
    provider = Provider(usage=realistic, delay=lambda: random.uniform(0, 0.02))
    agent = env.agent(provider, model_settings={"max_tokens": 100})
    chats = [CHAT] * 50 if whose == "CHAT_DAILY_TOKENS" else [CHAT + n for n in range(50)]
    turns = [await env.ask("@crew go", chat_id=chat) for chat in chats]

    async def one(turn: Turn) -> None:
        await asyncio.sleep(random.uniform(0, 0.2) if spread else 0)
        await agent(turn)

    await asyncio.gather(*(one(turn) for turn in turns))
    spent = sum(u.input_tokens + u.output_tokens for u in provider.reported)
    largest = max(u.input_tokens + u.output_tokens for u in provider.reported)
    status = await env.allowances.status(CHAT)
    assert spent == (status.used if whose == "CHAT_DAILY_TOKENS" else status.bot_used)
    assert spent <= allowance + largest, (spent, allowance, provider.calls)
    answers = [m for chat in set(chats) for m in await env.bot_said(chat)]
    assert len(answers) == 50 and sum(m.kind == "reply" for m in answers) == provider.calls
    print(f"\n{whose} spread={spread}: {provider.calls} of 50 admitted, spent {spent:,} of {allowance:,} ({call}/call)")
