"""Hostile subagents in real containers (2/2): the budgets a run cannot get past.

A message flood, a token budget overrun, a workspace over quota, and results and errors far over their
limits, each from a real container on a real bot (see test_hostile_subagents.py for the setting and the
checks every attack owes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from container.protocol import MAX_ERROR_CHARS as WIRE_ERROR_CHARS
from container.protocol import MAX_RESULT_CHARS as WIRE_RESULT_CHARS
from container.protocol import MAX_RUN_BODY_BYTES
from core.store.runs import RunStatus
from runner.runs.outcome import MAX_ERROR_CHARS, MAX_RESULT_CHARS
from tests.harness import GROUP_ID
from tests.runner.hostile_llm import RUN_WAIT_SECONDS
from tests.runner.hostile_rig import (
    ANSWER_SECONDS,
    MAX_MESSAGES,
    MAX_TOKENS,
    POLL_SECONDS,
    QUOTA_MB,
    World,
    hostile_world,
    new_id,
)
from tests.runner.hostile_scripts import container_python

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

FLOOD_CHAT = GROUP_ID - 911
TOKENS_CHAT = GROUP_ID - 912
QUOTA_CHAT = GROUP_ID - 913
HUGE_CHAT = GROUP_ID - 914
BODIES_CHAT = GROUP_ID - 915

FLOOD_SIZE = 200
CUT_NOTE_CHARS = 60  # "\n… [N more characters cut]"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory, subagent_image: str) -> AsyncIterator[World]:
    async with hostile_world(
        tmp_path_factory.mktemp("hostile-budgets"), [FLOOD_CHAT, TOKENS_CHAT, QUOTA_CHAT, HUGE_CHAT, BODIES_CHAT]
    ) as w:
        yield w


FLOOD = r"""
statuses = {}
for i in range(ARGS["size"]):
    status, _ = call("POST", "/run/message", {"message_id": "flood-%04d" % i, "text": ARGS["text"] + " %d" % i})
    statuses[str(status)] = statuses.get(str(status), 0) + 1
report("flood", statuses)
"""


async def test_a_message_flood_gets_its_budget_and_is_stopped(world: World) -> None:
    # A run told its messages are used up is told once; the tool then stops asking (container/tools.py). One
    # that goes on is not that tool: its third repeat stops it (it could repeat them for its whole life).
    chat = await world.chat(FLOOD_CHAT)
    marker = new_id("flood")
    text = new_id("flood message")
    flood = container_python(FLOOD, size=FLOOD_SIZE, text=text)
    run_id = await world.spawn(chat, f"{marker}\n{flood}\n$ echo never reached", "flood")

    def flood_sent() -> list[str]:
        return [m.plain_text for m in world.tg.sent_messages(FLOOD_CHAT) if text in m.plain_text]

    record = await world.wait_final(run_id)
    await world.bystander_answers()

    assert record.status == "failed"
    assert record.error == "sent 3 invalid requests on its channel and was stopped"
    assert world.tool_reports(marker) == {}  # stopped before its script could report
    assert record.messages_sent == MAX_MESSAGES
    await world.assert_one_outcome(chat, record)
    await world.tg.wait_until(
        lambda: flood_sent() if len(flood_sent()) >= MAX_MESSAGES else None, timeout_seconds=ANSWER_SECONDS
    )
    assert flood_sent() == [f"Crew: {text} {i}" for i in range(MAX_MESSAGES)]  # none more, none late
    stored = [m for m in await world.messages.recent(FLOOD_CHAT, 500) if m.kind == "progress"]
    assert len(stored) == MAX_MESSAGES
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()


# The reviewer's reproduction: model steps of 8 MB of `{}` (2.8 million objects each). On the host that was
# 28 s of one thread holding the GIL and 4.7 GB per step; now each is refused at its first 64 KB.
REPRODUCTION = r"""
size = 8 * 1024 * 1024 - 100
body = b'{"messages":[' + b"{}," * ((size - 40) // 3) + b'{}],"tools":[]}'
report("reproduction", [call("POST", "/run/model", body)[0] for _ in range(4)])
"""


async def test_the_reviewers_reproduction_is_refused_unread_and_stops_the_run(world: World) -> None:
    chat = await world.chat(BODIES_CHAT)
    marker = new_id("bodies")
    run_id = await world.spawn(chat, f"{marker}\n{container_python(REPRODUCTION)}\n$ echo never reached", "bodies")
    record = await world.wait_final(run_id)
    await world.bystander_answers()

    assert record.status == "failed"
    assert record.error == "sent 3 invalid requests on its channel and was stopped"
    assert world.tool_reports(marker) == {}  # stopped before its script could report, or the agent go on
    outcome = await world.assert_one_outcome(chat, record)
    assert "invalid requests" in outcome
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()


# After the first call (which reports far more tokens than the budget), the container calls the LLM itself.
SPEND_MORE = r"""
body = {"model": "m", "messages": [{"role": "user", "content": ARGS["marker"]}]}
statuses = [call("POST", "/v1/chat/completions", body)[0] for _ in range(10)]
report("spend_more", statuses)
"""


async def test_a_token_budget_overrun_ends_the_run_and_no_call_gets_through_after(world: World) -> None:
    chat = await world.chat(TOKENS_CHAT)
    marker, direct = new_id("spender"), new_id("direct")
    task = f"{marker}\nspend: {5 * MAX_TOKENS}\n{container_python(SPEND_MORE, marker=direct)}\n$ echo never reached"
    run_id = await world.spawn(chat, task, "spender")
    record = await world.wait_final(run_id)
    await world.bystander_answers()

    assert record.status == "failed"
    # The host's reason, not whatever the agent made of its refused call: the run was stopped for it.
    assert record.error == f"used its token budget of {MAX_TOKENS} tokens (SUBAGENT_MAX_TOKENS) and was stopped"
    assert record.llm_requests == 1 and record.input_tokens == 5 * MAX_TOKENS
    # The first call went through (nobody knows its cost before the answer); nothing after it did.
    assert len(world.calls_of(marker)) == 1
    assert world.calls_of(direct) == []
    outcome = await world.assert_one_outcome(chat, record)
    assert "SUBAGENT_MAX_TOKENS" in outcome
    await world.assert_no_secret_for_next_run(chat)  # the next run has a budget of its own
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()


async def test_a_workspace_over_quota_stops_the_run_and_refuses_the_next(world: World) -> None:
    chat = await world.chat(QUOTA_CHAT)
    marker = new_id("fill")
    size = (QUOTA_MB + 3) * 1024 * 1024
    task = f"{marker}\n$ head -c {size} /dev/urandom > /workspace/fill.bin && echo wrote\n$ sleep 100"
    run_id = await world.spawn(chat, task, "filler")
    # The agent asks for its second command once the file is written: from then on it is over quota, and the
    # quota check (every 5 s) may stop it any moment.
    async with asyncio.timeout(RUN_WAIT_SECONDS):
        while True:
            record = await world.record(run_id)
            if len(world.calls_of(marker)) >= 2 or (
                record is not None and record.status not in (RunStatus.QUEUED, RunStatus.RUNNING)
            ):
                break
            await asyncio.sleep(POLL_SECONDS)
    await world.bystander_answers()
    record = await world.wait_final(run_id)

    assert record.status == "failed"
    assert record.error is not None and "WORKSPACE_QUOTA_MB" in record.error, record.error
    assert "/workspace clear" in record.error
    assert record.started_at is not None and record.finished_at is not None
    assert record.finished_at - record.started_at < 60  # stopped, not left to sleep its 100 s
    assert "/workspace clear" in await world.assert_one_outcome(chat, record)

    # While the workspace is over quota, the chat's next run is refused before a container starts.
    refused_marker = new_id("next")
    refused = await world.wait_final(await world.spawn(chat, f"{refused_marker}\n$ echo hi", "next"))
    assert refused.status == "failed" and refused.started_at is None and refused.container_id is None
    assert refused.error is not None and "/workspace clear" in refused.error
    assert world.calls_of(refused_marker) == []
    await world.assert_one_outcome(chat, refused)
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()


# Results and errors over every limit, posted straight to the run socket; then one the host takes.
OVERSIZED = r"""
kind = ARGS["kind"]
field = "result" if kind == "completed" else "error"
wire = ARGS["wire_chars"]
statuses = {
    "over_body_limit": call("POST", "/run/result", {"status": kind, field: "x" * ARGS["body_bytes"]})[0],
    "over_field_limit": call("POST", "/run/result", {"status": kind, field: "y" * (wire + 1)})[0],
    "at_field_limit": call("POST", "/run/result", {"status": kind, field: ("z-line\n" * wire)[:wire]})[0],
    "second": call("POST", "/run/result", {"status": "completed", "result": "a second result"})[0],
}
report("oversized", statuses)
"""


async def test_huge_results_and_errors_are_refused_or_cut(world: World) -> None:
    chat = await world.chat(HUGE_CHAT)
    for kind, label, wire_chars, kept_chars in (
        ("completed", "huge-result", WIRE_RESULT_CHARS, MAX_RESULT_CHARS),
        ("failed", "huge-error", WIRE_ERROR_CHARS, MAX_ERROR_CHARS),
    ):
        key = new_id("hold")
        script = container_python(OVERSIZED, kind=kind, wire_chars=wire_chars, body_bytes=MAX_RUN_BODY_BYTES + 1)
        run_id = await world.spawn(chat, f"hold: {key}\n{script}", label)
        await world.script.wait_held(key)
        # Not asserted to be still running: a run that has reported is stopped 10 s later if it lingers.
        await world.bystander_answers()
        world.script.release(key)
        record = await world.wait_final(run_id)

        facts = world.tool_reports(key)["oversized"]
        # Over the body limit: 413, or the host hangs up before reading the body (status 0).
        assert facts["over_body_limit"] in (413, 0), facts
        assert facts["over_field_limit"] == 400 and facts["at_field_limit"] == 200, facts
        assert facts["second"] == 409, facts  # the first result counts, and the agent's own comes too late
        assert record.status == kind
        outcome = await world.assert_one_outcome(chat, record)
        heading = f"[Task: {label}]\n" + ("" if kind == "completed" else "Failed: ")
        assert outcome.startswith(heading + "z-line\n")
        assert len(outcome) <= len(heading) + kept_chars + CUT_NOTE_CHARS, len(outcome)
        assert "more characters cut]" in outcome

    # A model whose answer is far over the wire limit: its run still reports, cut.
    answer_chars = 150_000
    record = await world.wait_final(await world.spawn(chat, f"answer chars: {answer_chars}\n$ echo ready", "long"))
    assert record.status == "completed", record.error
    outcome = await world.assert_one_outcome(chat, record)
    assert len(outcome) <= len("[Task: long]\n") + MAX_RESULT_CHARS + CUT_NOTE_CHARS, len(outcome)

    await world.assert_no_secret_for_next_run(chat)
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()
