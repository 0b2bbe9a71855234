"""The daily allowances through LlmProxy, with FakeLLM as the provider and real SQLite: each call reserves
against its run's chat and kind, settles to the usage reported (estimated when none), releases when the
provider gave no answer; racing runs of one chat overspend by at most one call; a crash holds nothing."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from bot.schedules.firing import TASK_TURN_PREFIX
from container.protocol import TaskSpec
from core.allowances import tokens_of_bytes
from core.store.spend import SCHEDULED_TURN_PREFIX, SpendKind, run_spend_kind
from runner.channel.conversation_limits import ConversationLimits
from runner.channel.llm_allowance import ALLOWANCE_ERROR, Payer
from runner.channel.model_step import StepFailed, make_step
from runner.channel.run_endpoint import EXTRA_MODEL_STEPS
from tests.fakes.faults import Fault
from tests.fakes.llm_server import FakeLLM, openai_text
from tests.runner.allowance_rig import allowances_on, proxied
from tests.runner.llm_proxy_helpers import API_KEY, CHAT, MODEL, post

CHAT_ID, OTHER_CHAT_ID = -100, -200
MAX_TOKENS = 40  # each call's output cap
ASK = {**CHAT, "max_tokens": MAX_TOKENS}
FORWARDED = {**ASK, "model": MODEL}  # ASK as the provider gets it (the model pinned)
INPUT_HOLD = tokens_of_bytes(len(json.dumps(FORWARDED).encode()))  # held for what is forwarded: a token a byte
ESTIMATE = INPUT_HOLD + MAX_TOKENS  # a call's whole reservation


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(api_key=API_KEY) as llm:
        llm.openai.handle_with(lambda body: openai_text("done", prompt_tokens=10, completion_tokens=5))
        yield llm


async def test_a_runs_calls_are_counted_under_its_chat_and_kind(tmp_path: Path, fake_llm: FakeLLM) -> None:
    async with proxied(tmp_path, fake_llm) as rig:
        turn = await rig.open("run-turn01", Payer.of_run(CHAT_ID, "turn-1"))
        scheduled = await rig.open("run-task01", Payer.of_run(CHAT_ID, SCHEDULED_TURN_PREFIX + "abcd1234"))
        other = await rig.open("run-other1", Payer.of_run(OTHER_CHAT_ID, None))

        for socket in (turn, turn, scheduled, other):
            assert (await post(socket, "/v1/chat/completions", ASK))[0] == 200

        assert await rig.rows() == {
            (CHAT_ID, SpendKind.SUBAGENT): (20, 10, 2, 0),
            (CHAT_ID, SpendKind.SCHEDULED): (10, 5, 1, 0),
            (OTHER_CHAT_ID, SpendKind.SUBAGENT): (10, 5, 1, 0),
        }
        assert (await rig.allowances.status(CHAT_ID)).used == 45  # every kind of the chat's together
        assert (rig.counted(SpendKind.SUBAGENT, "input"), rig.counted(SpendKind.SUBAGENT, "output")) == (30, 15)
        assert (rig.counted(SpendKind.SCHEDULED, "input"), rig.counted(SpendKind.SCHEDULED, "output")) == (10, 5)
        assert rig.counted(SpendKind.MAIN, "input") == 0


def test_the_scheduled_prefix_is_the_one_scheduled_tasks_give_their_runs() -> None:
    assert TASK_TURN_PREFIX == SCHEDULED_TURN_PREFIX
    assert run_spend_kind(TASK_TURN_PREFIX + "x") is SpendKind.SCHEDULED
    assert run_spend_kind("turn-abc") is SpendKind.SUBAGENT and run_spend_kind(None) is SpendKind.SUBAGENT


async def test_a_provider_that_reports_no_usage_is_counted_estimated(tmp_path: Path, fake_llm: FakeLLM) -> None:
    answer = openai_text("a" * 200)
    del answer["usage"]
    fake_llm.openai.enqueue(answer)
    async with proxied(tmp_path, fake_llm) as rig:
        socket = await rig.open("run-nousage", Payer.of_run(CHAT_ID, None))
        status, body = await post(socket, "/v1/chat/completions", ASK)
        rows = await rig.rows()
        counted = rig.counted(SpendKind.SUBAGENT, "input")

    assert status == 200 and "usage" not in body
    ((key, (input_tokens, output_tokens, calls, estimated)),) = rows.items()
    assert key == (CHAT_ID, SpendKind.SUBAGENT) and (calls, estimated) == (1, 1)
    # Input from the size of what was forwarded (what was held for it); output from the answer's size, at most its cap.
    assert input_tokens == INPUT_HOLD
    assert 0 < output_tokens <= MAX_TOKENS
    assert counted == INPUT_HOLD


async def test_a_call_the_provider_did_not_answer_releases_its_hold(tmp_path: Path, fake_llm: FakeLLM) -> None:
    async with proxied(tmp_path, fake_llm, CHAT_DAILY_TOKENS=str(ESTIMATE)) as made:
        socket = await made.open("run-failing", Payer.of_run(CHAT_ID, None))
        fake_llm.fail_next(Fault.server_error())
        assert (await post(socket, "/v1/chat/completions", ASK))[0] == 500
        # Nothing counted, nothing held: the whole allowance is there for the next call.
        assert await made.rows() == {} and made.counted(SpendKind.SUBAGENT, "input") == 0
        assert (await post(socket, "/v1/chat/completions", ASK))[0] == 200


@pytest.mark.parametrize("setting", ["CHAT_DAILY_TOKENS", "DAILY_TOKENS"])
@pytest.mark.parametrize(("allowance", "admitted"), [(10 * ESTIMATE, 10), (10 * ESTIMATE + ESTIMATE // 2, 11)])
async def test_fifty_racing_calls_of_several_runs_spend_at_most_the_allowance_plus_one_call(
    tmp_path: Path, fake_llm: FakeLLM, setting: str, allowance: int, admitted: int
) -> None:
    """Five runs at once, ten calls each: of one chat against its allowance, or of two chats (two bots' worth
    of spawns) against the bot's, racing for the last tokens of the day."""

    async def provider(body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0, 0.02))
        # It uses all it may: the prompt as estimated, the whole output cap.
        return openai_text("done", prompt_tokens=INPUT_HOLD, completion_tokens=body["max_tokens"])

    fake_llm.openai.handle_with(provider)
    chats = [CHAT_ID] if setting == "CHAT_DAILY_TOKENS" else [CHAT_ID, OTHER_CHAT_ID]
    async with proxied(tmp_path, fake_llm, **{setting: str(allowance)}) as made:
        runs = [f"run-race{n:02d}" for n in range(5)]
        sockets = [await made.open(run, Payer.of_run(chats[n % len(chats)], None)) for n, run in enumerate(runs)]

        answers = await asyncio.gather(
            *(post(sockets[n % len(sockets)], "/v1/chat/completions", ASK) for n in range(50))
        )

        statuses = [status for status, _ in answers]
        status = await made.allowances.status(CHAT_ID)
        used = status.used if setting == "CHAT_DAILY_TOKENS" else status.bot_used
        overshoot = used - allowance
        print(f"{setting}={allowance}, one call {ESTIMATE}: used {used}, overshoot {overshoot}")
        assert allowance <= used <= allowance + ESTIMATE  # the rule
        assert statuses.count(200) == admitted and statuses.count(429) == 50 - admitted
        assert overshoot == (0 if admitted == 10 else ESTIMATE - ESTIMATE // 2)
        refused = [body for status, body in answers if status == 429]
        assert {body["error"]["type"] for body in refused} == {ALLOWANCE_ERROR}
        whose = "this chat's" if setting == "CHAT_DAILY_TOKENS" else "the bot's"
        assert f"{whose} daily allowance of {allowance:,} tokens is used up" in refused[0]["error"]["message"]
        # Each run with a refused call is told to stop, once, whichever of its calls was refused first.
        told = [run_id for run_id, _ in made.told.runs]
        assert told and len(told) == len(set(told)) and set(told) <= set(runs)
        assert await made.allowances.left_for(CHAT_ID) is not None


NOTES = {
    "plain": ["words and more words " * 100] * 10,  # the review's: ten of 2,000 characters
    "dense": ["字" * 2_000] * 8 + ["🙂" * 2_000] * 2,  # a token a character or more
}


@pytest.mark.parametrize("notes", NOTES.values(), ids=NOTES.keys())
async def test_sixteen_tiny_calls_with_the_chats_follow_ups_overshoot_by_at_most_one_call(
    tmp_path: Path, fake_llm: FakeLLM, notes: list[str]
) -> None:
    """The review's race: 16 tiny calls of one run at once (its connection cap), each carrying the chat's ten
    follow-ups. Held for the container's body alone (81 tokens each), all 16 were admitted against 50,000 and
    used 80,624. The provider here bills the most a call can cost: a token a byte of its text as UTF-8."""

    async def provider(body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0, 0.02))
        billed = tokens_of_bytes(len(json.dumps(body, ensure_ascii=False).encode()))
        return openai_text("done", prompt_tokens=billed, completion_tokens=body["max_tokens"])

    fake_llm.openai.handle_with(provider)
    allowance = 50_000
    async with proxied(tmp_path, fake_llm, CHAT_DAILY_TOKENS=str(allowance)) as made:
        made.gate.notes.extend(notes)
        socket = await made.open("run-followups", Payer.of_run(CHAT_ID, None))

        answers = await asyncio.gather(*(post(socket, "/v1/chat/completions", ASK) for _ in range(16)))

        forwarded = fake_llm.requests("/v1/chat/completions")
        used = (await made.allowances.status(CHAT_ID)).used
    one_call = max(call.body["max_tokens"] + tokens_of_bytes(len(call.raw_body)) for call in forwarded)
    print(f"16 calls with follow-ups: admitted {len(forwarded)}, used {used} of {allowance}, one call {one_call}")
    assert all(call.body["messages"][-1]["content"].count(notes[-1]) == notes.count(notes[-1]) for call in forwarded)
    assert used <= allowance + one_call
    assert [status for status, _ in answers].count(200) == len(forwarded) < 16


async def test_a_refused_call_is_not_retried_by_the_sdks(tmp_path: Path, fake_llm: FakeLLM) -> None:
    async with proxied(tmp_path, fake_llm, CHAT_DAILY_TOKENS="15") as made:
        socket = await made.open("run-spent1", Payer.of_run(CHAT_ID, None))
        assert (await post(socket, "/v1/chat/completions", ASK))[0] == 200  # holds what is left, uses 15
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as session,
            session.post("http://llm/v1/chat/completions", json=ASK) as response,
        ):
            assert response.status == 429 and response.headers["x-should-retry"] == "false"
        assert made.told.runs == [("run-spent1", made.told.runs[0][1])]
        assert "resets at 00:00 (UTC)" in made.told.runs[0][1]
        assert len(fake_llm.requests()) == 1  # the refused one never reached the provider


async def test_after_a_crash_nothing_is_held_and_only_what_was_recorded_counts(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    allowance = 10 * ESTIMATE
    async with proxied(tmp_path, fake_llm, CHAT_DAILY_TOKENS=str(allowance)) as made:
        socket = await made.open("run-crash01", Payer.of_run(CHAT_ID, None))
        assert (await post(socket, "/v1/chat/completions", ASK))[0] == 200  # recorded: 15
        fake_llm.fail_next(Fault.hang())
        in_flight = asyncio.create_task(post(socket, "/v1/chat/completions", {**ASK, "max_tokens": 10**6}))
        await fake_llm.wait_for_requests(2)
        assert await made.allowances.left_for(CHAT_ID) is not None  # the call in flight holds all that is left

        # The process dies here: its holds were in memory only. A new one reads what was recorded.
        after = allowances_on(made.stores, CHAT_DAILY_TOKENS=str(allowance))
        status = await after.status(CHAT_ID)
        assert status.used == 15
        held = await after.reserve(CHAT_ID, SpendKind.MAIN, allowance)
        assert held.tokens == allowance - 15  # nothing of the dead call, nor of the dead reservation, is held
        in_flight.cancel()
        await asyncio.gather(in_flight, return_exceptions=True)


async def test_a_model_step_over_the_allowance_fails_once_with_the_reason(tmp_path: Path, fake_llm: FakeLLM) -> None:
    """The run API's model step is made by the host on the run's own socket: the same step, no SDK retry."""
    spec = TaskSpec(run_id="run-steps1", task="t", label="l")
    limits = ConversationLimits.for_task(spec, EXTRA_MODEL_STEPS)
    step = json.dumps({"messages": [{"kind": "request", "parts": [{"part_kind": "user-prompt", "content": "hi"}]}]})
    async with proxied(tmp_path, fake_llm, CHAT_DAILY_TOKENS="15") as made:
        socket = await made.open(spec.run_id, Payer.of_run(CHAT_ID, SCHEDULED_TURN_PREFIX + "t1"))
        await make_step(spec, socket, step.encode(), limits)  # the last of the allowance: used 15
        with structlog.testing.capture_logs() as logs, pytest.raises(StepFailed) as refused:
            await make_step(spec, socket, step.encode(), limits)

        assert refused.value.status == 429
        assert refused.value.reason.startswith(
            "the LLM answered HTTP 429: this chat's daily allowance of 15 tokens is used up for today; it resets at"
        )
        calls = [entry for entry in logs if entry["event"] == "llm_call"]
        assert [entry["error"] for entry in calls] == [ALLOWANCE_ERROR]  # asked once: the SDK did not retry
        assert [run_id for run_id, _ in made.told.runs] == [spec.run_id]
        assert (await made.rows()) == {(CHAT_ID, SpendKind.SCHEDULED): (10, 5, 1, 0)}


async def test_a_call_whose_allowance_cannot_be_checked_is_not_forwarded(
    tmp_path: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with proxied(tmp_path, fake_llm, CHAT_DAILY_TOKENS="1000") as made:
        socket = await made.open("run-nostore", Payer.of_run(CHAT_ID, None))

        async def broken(chat_id: int, kind: SpendKind, estimate: int) -> None:
            raise RuntimeError("database is locked")

        monkeypatch.setattr(made.allowances, "reserve", broken)
        status, body = await post(socket, "/v1/chat/completions", ASK)

        assert (status, body["error"]["type"]) == (503, "allowance_unavailable")
        assert fake_llm.requests() == [] and made.told.runs == []  # not forwarded, and the run goes on


async def test_a_streamed_call_settles_to_the_usage_of_its_last_event(tmp_path: Path, fake_llm: FakeLLM) -> None:
    async with proxied(tmp_path, fake_llm, CHAT_DAILY_TOKENS="1000") as made:
        socket = await made.open("run-stream1", Payer.of_run(CHAT_ID, None))
        status, body = await post(socket, "/v1/chat/completions", {**ASK, "stream": True})

        assert status == 200 and "data: [DONE]" in body
        assert await made.rows() == {(CHAT_ID, SpendKind.SUBAGENT): (10, 5, 1, 0)}
        assert (await made.allowances.status(CHAT_ID)).used == 15  # its hold released: only the use counts
        held = await made.allowances.reserve(CHAT_ID, SpendKind.MAIN, 1000)
        assert held.tokens == 1000 - 15
