"""The desk of questions on a real store: a waiter that is cancelled (its run's door closed, a shutdown) leaves
nothing behind, so the bound on waiters counts live ones only, and a second waiter of the same question (a retry)
is still woken by its answer."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.questions import Questions
from core.store.db import Database
from core.store.questions import Audience, NewQuestion, Question, QuestionKind, QuestionStatus, QuestionStore

pytestmark = pytest.mark.timeout(30)

LATER_SECONDS = 300.0


def new(chat_id: int, run_id: str, kind: QuestionKind = QuestionKind.EGRESS) -> NewQuestion:
    return NewQuestion(chat_id, run_id, kind, "may I?", ("yes", "no"), Audience.ADMINS, time.time() + LATER_SECONDS)


async def cancelled_wait(desk: Questions, question: Question) -> None:
    waiting = asyncio.ensure_future(desk.wait(question))
    await asyncio.sleep(0.05)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


async def test_cancelled_waiters_do_not_use_up_the_bound(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("core.questions.MAX_WAITERS", 1)
    desk = Questions(QuestionStore(db))
    for run in range(3):  # three runs' doors closed while their questions were open
        await cancelled_wait(desk, await desk.ask(new(1, f"run{run}"), show=False))

    other = await desk.ask(new(2, "another-chats-run", QuestionKind.ASK), show=False)
    waiting = asyncio.ensure_future(desk.wait(other))
    await asyncio.sleep(0.05)
    await desk.answer(other.id, "yes", 0, 42, "Ada")
    answered = await asyncio.wait_for(waiting, 5)

    assert (answered.status, answered.answer) == (QuestionStatus.ANSWERED, "yes")


async def test_a_retry_waiting_beside_a_cancelled_waiter_gets_the_answer(db: Database) -> None:
    desk = Questions(QuestionStore(db))
    question = await desk.ask(new(1, "run1", QuestionKind.ASK), show=False)
    retry = asyncio.ensure_future(desk.wait(question))
    await cancelled_wait(desk, question)  # the first request's connection broke

    await desk.answer(question.id, "no", 1, 42, "Ada")

    assert (await asyncio.wait_for(retry, 5)).answer == "no"  # woken, not left to wait out its 300 s
