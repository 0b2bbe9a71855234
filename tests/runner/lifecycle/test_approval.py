"""SUBAGENT_APPROVAL=admins on the in-memory runtime: a run awaits an admin's decision, stored before it takes
effect; Approve starts it within the caps, Deny or no answer refuses it (the chat is told), a cancel or a merge
ends it, the queue limit counts it, and a restart keeps both the wait and a decision taken just before."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from container.protocol import SpawnRequest
from core.store.questions import Question, QuestionKind, QuestionStatus
from core.store.runs import RunStatus
from runner.ipc.batch import RequestOutcome
from runner.lifecycle.approvals import MAX_TASK_SHOWN_CHARS
from tests.runner.lifecycle_helpers import CHAT_ID, OTHER_CHAT_ID, Rig, completing, rig

pytestmark = [pytest.mark.timeout(60)]

ADMIN = 42


async def approval_of(r: Rig, run_id: str):  # type: ignore[no-untyped-def]
    [question] = await r.service.questions.store.for_run(run_id, QuestionKind.APPROVAL)
    return question


async def test_a_run_starts_only_once_an_admin_approves(tmp_path: Path) -> None:
    async with rig(tmp_path, completing("done"), SUBAGENT_APPROVAL="admins") as r:
        run_id = await r.spawn("risky work", turn_id="turn-1")
        assert await r.service.manager.approvals.awaiting(CHAT_ID) == [run_id]
        await asyncio.sleep(0.2)
        assert len(r.runtime.started_specs) == 0  # nothing runs before the decision
        question = await approval_of(r, run_id)
        assert question.options == ("Approve", "Deny") and question.is_open
        outcome = await r.service.questions.answer(question.id, "Approve", 0, ADMIN, "Root")
        assert outcome.counted
        assert await r.until_status(run_id, RunStatus.COMPLETED) == RunStatus.COMPLETED
        assert len(r.runtime.started_specs) == 1
        stored = await approval_of(r, run_id)
        assert (stored.status, stored.answered_by, stored.answer) == (QuestionStatus.ANSWERED, ADMIN, "Approve")


async def test_deny_refuses_it_and_tells_the_chat(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins") as r:
        run_id = await r.spawn("risky work")
        question = await approval_of(r, run_id)
        await r.service.questions.answer(question.id, "Deny", 1, ADMIN, "Root")
        assert await r.until_status(run_id, RunStatus.REJECTED) == RunStatus.REJECTED
        record = await r.service.runs.get(run_id)
        assert record is not None and record.error == "not approved: denied by Root"
        await r.until(lambda: any("did not start: denied by Root" in text for text in r.texts()))
        assert len(r.runtime.started_specs) == 0
        # A second admin's tap comes too late: the first counted.
        late = await r.service.questions.answer(question.id, "Approve", 0, ADMIN + 1, "Other")
        assert not late.counted
        assert await r.status(run_id) == RunStatus.REJECTED


async def test_no_answer_in_time_refuses_it(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins", SUBAGENT_ASK_TIMEOUT_SECONDS=1) as r:
        run_id = await r.spawn("risky work")
        assert await r.until_status(run_id, RunStatus.REJECTED) == RunStatus.REJECTED
        record = await r.service.runs.get(run_id)
        assert record is not None and record.error is not None and "no admin approved it within 1 s" in record.error
        assert (await approval_of(r, run_id)).status is QuestionStatus.EXPIRED


async def test_a_cancel_or_a_merge_ends_the_wait(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins") as r:
        one = await r.spawn("first", turn_id="turn-1")
        two = await r.spawn("second", turn_id="turn-2")
        assert await r.service.manager.cancel_run(CHAT_ID, one) == RunStatus.CANCELLED
        assert await r.service.manager.cancel_turn("turn-2", "turn aborted (merge)") == 1
        for run_id in (one, two):
            assert await r.status(run_id) == RunStatus.CANCELLED
            question = await approval_of(r, run_id)
            assert question.status is QuestionStatus.ENDED
            assert not (await r.service.questions.answer(question.id, "Approve", 0, ADMIN, "Root")).counted
        await asyncio.sleep(0.1)
        assert len(r.runtime.started_specs) == 0


async def test_runs_awaiting_approval_count_against_the_queue_limit(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins", SUBAGENT_QUEUE_LIMIT=1) as r:
        first = await r.spawn("first")
        second = await r.spawn("second")
        assert await r.service.manager.approvals.awaiting(CHAT_ID) == [first]
        assert await r.status(second) == RunStatus.REJECTED
        assert await r.service.questions.store.for_run(second) == []


async def test_scheduled_runs_are_not_asked_again(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins") as r:
        run_id = await r.spawn("every morning", turn_id="task-abc123-1")
        assert await r.until_status(run_id, RunStatus.COMPLETED) == RunStatus.COMPLETED


async def test_a_restart_keeps_the_wait_and_a_decision_taken_before_it(tmp_path: Path) -> None:
    waiting_id, decided_id = secrets.token_hex(6), secrets.token_hex(6)
    # A process records two runs awaiting approval; one is approved in the store just before it stops (its
    # decision stored, not yet carried out).
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins") as before:
        for run_id in (waiting_id, decided_id):
            request = SpawnRequest(request_id=run_id, task=f"work {run_id}")
            assert await before.service.manager.on_request(CHAT_ID, request) is RequestOutcome.ACCEPTED
        question = await approval_of(before, decided_id)
        assert await before.service.questions.store.answer(question.id, "Approve", 0, ADMIN, "Root")
    async with rig(tmp_path, completing("done"), SUBAGENT_APPROVAL="admins") as r:
        assert await r.until_status(decided_id, RunStatus.COMPLETED) == RunStatus.COMPLETED
        assert await r.service.manager.approvals.awaiting(CHAT_ID) == [waiting_id]
        question = await approval_of(r, waiting_id)
        await r.service.questions.answer(question.id, "Approve", 0, ADMIN, "Root")
        assert await r.until_status(waiting_id, RunStatus.COMPLETED) == RunStatus.COMPLETED


class Crash(BaseException):
    """The process dies here (a kill, a power cut): nothing after this point of the request runs."""


async def test_a_crash_before_the_question_is_asked_never_lets_the_run_start_unapproved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = secrets.token_hex(6)
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins") as before:

        async def crash(*args: object, **kwargs: object) -> None:
            raise Crash

        monkeypatch.setattr(before.service.questions, "ask", crash)
        with pytest.raises(Crash):
            await before.service.manager.on_request(CHAT_ID, SpawnRequest(request_id=run_id, task="rm -rf things"))
        monkeypatch.undo()
        assert await before.status(run_id) == RunStatus.QUEUED  # recorded, and no question was stored
        assert await before.service.questions.store.for_run(run_id) == []
    async with rig(tmp_path, completing("done"), SUBAGENT_APPROVAL="admins") as r:
        await asyncio.sleep(0.3)
        assert await r.status(run_id) == RunStatus.QUEUED and not r.runtime.started_specs
        question = await approval_of(r, run_id)  # asked again at the start
        assert question.is_open and "rm -rf things" in question.text
        await r.service.questions.answer(question.id, "Approve", 0, ADMIN, "Root")
        assert await r.until_status(run_id, RunStatus.COMPLETED) == RunStatus.COMPLETED


class UnshowableBoard:
    """A chat that cannot show the question (Telegram refuses, the chat is gone)."""

    async def show(self, question: Question, reply_to: int | None) -> int | None:
        raise RuntimeError("Too Many Requests: retry after 5")

    async def settle(self, question: Question) -> None:
        return None


async def test_an_approval_question_that_ends_unanswered_refuses_the_run(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins", STATUS_CARD="false") as r:
        r.service.questions.show_on(UnshowableBoard())
        run_id = await r.spawn("risky work", turn_id="turn-1")
        assert await r.until_status(run_id, RunStatus.REJECTED) == RunStatus.REJECTED
        assert (await approval_of(r, run_id)).status is QuestionStatus.ENDED
        await r.until(lambda: any("did not start: its approval question was closed" in t for t in r.texts()))
        assert not r.runtime.started_specs and r.service.manager.approvals.pending() == 0


async def test_one_chat_cannot_fill_the_queue_with_runs_awaiting_approval(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins", SUBAGENT_QUEUE_LIMIT=4) as r:
        mine = [await r.spawn(f"a{i}", turn_id=f"turn-{i}") for i in range(4)]
        other = await r.spawn("the other chat's work", chat_id=OTHER_CHAT_ID, turn_id="turn-x")
        assert [await r.status(run_id) for run_id in mine] == [RunStatus.QUEUED] * 2 + [RunStatus.REJECTED] * 2
        record = await r.service.runs.get(mine[2])
        assert record is not None and "share of the queue" in (record.error or "")
        assert await r.status(other) == RunStatus.QUEUED
        assert await r.service.manager.approvals.awaiting(OTHER_CHAT_ID) == [other]


async def test_a_cancel_right_after_the_approve_still_ends_the_run(tmp_path: Path) -> None:
    async with rig(tmp_path, completing("done"), SUBAGENT_APPROVAL="admins") as r:
        run_id = await r.spawn("x", turn_id="turn-1")
        question = await approval_of(r, run_id)
        await r.service.questions.answer(question.id, "Approve", 0, ADMIN, "Root")
        assert await r.service.manager.cancel_turn("turn-1", "turn aborted (stop)") == 1
        assert await r.status(run_id) == RunStatus.CANCELLED
        await asyncio.sleep(0.3)
        assert await r.status(run_id) == RunStatus.CANCELLED and not r.runtime.started_specs


async def test_the_question_shows_the_task_bounded(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), SUBAGENT_APPROVAL="admins") as r:
        run_id = await r.spawn("delete\nthe  old builds " + "x" * 5_000)
        question = await approval_of(r, run_id)
        assert "Task: delete the old builds xxx" in question.text
        assert len(question.text) < MAX_TASK_SHOWN_CHARS + 100 and question.text.endswith("…")
