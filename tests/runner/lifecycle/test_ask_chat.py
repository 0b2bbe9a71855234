"""ask_chat's host side without Docker: the real service and run channel on the in-memory runtime, a board that
records what the chat would see. One question at a time, SUBAGENT_MAX_QUESTIONS, the time-out, a cancel ending
the wait, a retry after a lost connection finding its stored answer, and bodies no agent sends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from container.channel import ChannelRefused, RunChannel
from container.protocol import ASK_PATH
from core.store.questions import Question, QuestionStatus
from core.store.runs import RunStatus
from tests.fakes.memory_runtime import MemoryContainer
from tests.runner.lifecycle_helpers import CHAT_ID, Rig, rig

pytestmark = [pytest.mark.timeout(60)]

Asked = asyncio.Queue[tuple[str, dict[str, object] | BaseException]]


class Board:
    """The chat's board as a test sees it: every question shown, every one settled."""

    def __init__(self) -> None:
        self.shown: asyncio.Queue[Question] = asyncio.Queue()
        self.settled: list[Question] = []
        self._next = 500

    async def show(self, question: Question, reply_to: int | None) -> int | None:
        self._next += 1
        await self.shown.put(question)
        return self._next

    async def settle(self, question: Question) -> None:
        self.settled.append(question)


def asking(questions: list[tuple[str, str, list[str]]], out: Asked, hold: asyncio.Event | None = None):  # type: ignore[no-untyped-def]
    """A container that asks each (ask id, question, options) in turn and reports what it got."""

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        for ask_id, text, options in questions:
            try:
                await out.put((ask_id, await channel.ask(ask_id, text, options)))
            except ChannelRefused as exc:
                await out.put((ask_id, exc))
        if hold is not None:
            await hold.wait()
        return 0

    return behaviour


async def answered_by_alice(r: Rig, question: Question, option: int = 0) -> None:
    outcome = await r.service.questions.answer(question.id, question.options[option], option, 1001, "Alice")
    assert outcome.counted


async def test_the_answer_goes_back_to_the_container_and_is_stored_first(tmp_path: Path) -> None:
    got: Asked = asyncio.Queue()
    board = Board()
    async with rig(tmp_path, asking([("ask-000001", "Which file?", ["a.txt", "b.txt"])], got)) as r:
        r.service.questions.show_on(board)
        run_id = await r.spawn("pick one")
        question = await asyncio.wait_for(board.shown.get(), 10)
        assert (question.run_id, question.text, question.options) == (run_id, "Which file?", ("a.txt", "b.txt"))
        await answered_by_alice(r, question, 1)
        _, answer = await asyncio.wait_for(got.get(), 10)
        assert answer == {"outcome": "answered", "answer": "b.txt", "by": "Alice", "detail": ""}
        stored = await r.service.questions.store.get(question.id)
        assert stored is not None and stored.answered_by == 1001 and stored.status is QuestionStatus.ANSWERED
        # A second answer does not count; the first one stays.
        late = await r.service.questions.answer(question.id, "a.txt", 0, 1002, "Bob")
        assert not late.counted and late.question.answer == "b.txt"


async def test_no_answer_in_time_says_so_and_closes_the_question(tmp_path: Path) -> None:
    got: Asked = asyncio.Queue()
    board = Board()
    async with rig(tmp_path, asking([("ask-000001", "Anyone?", [])], got), SUBAGENT_ASK_TIMEOUT_SECONDS=1) as r:
        r.service.questions.show_on(board)
        await r.spawn("ask and wait")
        question = await asyncio.wait_for(board.shown.get(), 10)
        _, answer = await asyncio.wait_for(got.get(), 10)
        assert isinstance(answer, dict) and answer["outcome"] == "no_answer"
        stored = await r.service.questions.store.get(question.id)
        assert stored is not None and stored.status is QuestionStatus.EXPIRED
        await r.until(lambda: any(q.id == question.id for q in board.settled))  # the chat sees it closed


async def test_questions_are_counted_per_run(tmp_path: Path) -> None:
    got: Asked = asyncio.Queue()
    questions = [(f"ask-00000{i}", f"question {i}", ["yes", "no"]) for i in range(4)]
    board = Board()
    async with rig(tmp_path, asking(questions, got), SUBAGENT_MAX_QUESTIONS=2) as r:
        r.service.questions.show_on(board)
        await r.spawn("ask a lot")
        for _ in range(2):
            await answered_by_alice(r, await asyncio.wait_for(board.shown.get(), 10))
            _, answer = await asyncio.wait_for(got.get(), 10)
            assert isinstance(answer, dict) and answer["outcome"] == "answered"
        for _ in range(2):
            _, refused = await asyncio.wait_for(got.get(), 10)
            assert isinstance(refused, ChannelRefused) and refused.status == 429
            assert "SUBAGENT_MAX_QUESTIONS" in str(refused)
        assert board.shown.empty()


async def test_one_question_at_a_time_and_a_retry_waits_for_the_same_one(tmp_path: Path) -> None:
    started = asyncio.Event()
    hold = asyncio.Event()
    channels: list[RunChannel] = []

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        channels.append(channel)
        started.set()
        await hold.wait()
        return 0

    board = Board()
    async with rig(tmp_path, behaviour) as r:
        r.service.questions.show_on(board)
        await r.spawn("ask twice at once")
        await asyncio.wait_for(started.wait(), 10)
        channel = channels[0]
        first = asyncio.create_task(channel.ask("ask-000001", "First?", ["x"]))
        question = await asyncio.wait_for(board.shown.get(), 10)
        with pytest.raises(ChannelRefused) as second:
            await channel.ask("ask-000002", "Second?", ["y"])
        assert second.value.status == 409
        retry = asyncio.create_task(channel.ask("ask-000001", "First?", ["x"]))  # the same id: the same question
        await asyncio.sleep(0.1)
        assert board.shown.empty()
        await answered_by_alice(r, question)
        assert (await asyncio.wait_for(first, 10))["answer"] == "x"
        assert (await asyncio.wait_for(retry, 10))["answer"] == "x"
        # Asked again after the answer (a restart lost the first answer): the stored one, at once.
        assert (await channel.ask("ask-000001", "First?", ["x"]))["answer"] == "x"
        assert board.shown.empty()
        hold.set()


async def test_a_cancel_ends_the_wait_and_a_late_answer_counts_for_nothing(tmp_path: Path) -> None:
    got: Asked = asyncio.Queue()
    board = Board()
    async with rig(tmp_path, asking([("ask-000001", "Wait for me?", ["ok"])], got)) as r:
        r.service.questions.show_on(board)
        run_id = await r.spawn("ask then be cancelled")
        question = await asyncio.wait_for(board.shown.get(), 10)
        assert await r.service.manager.cancel_run(CHAT_ID, run_id) == RunStatus.CANCELLED
        await r.settled()
        stored = await r.service.questions.store.get(question.id)
        assert stored is not None and stored.status is QuestionStatus.ENDED and stored.detail == "its run ended"
        late = await r.service.questions.answer(question.id, "ok", 0, 1001, "Alice")
        assert not late.counted


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"ask_id": "ask-000001", "question": "x" * 100_000, "options": []}, "at most 1000 characters"),
        ({"ask_id": "ask-000001", "question": "which?", "options": [str(i) for i in range(1_000)]}, "values"),
        ({"ask_id": "ask-000001", "question": "which?", "options": [str(i) for i in range(9)]}, "at most 8 items"),
        ({"ask_id": "ask-000001", "question": "which?", "options": ["y" * 61]}, "at most 60 characters"),
        ({"ask_id": "no", "question": "which?", "options": []}, "pattern"),
    ],
)
async def test_questions_no_agent_sends_are_refused_unasked(tmp_path: Path, body: dict[str, object], why: str) -> None:
    started = asyncio.Event()
    hold = asyncio.Event()
    channels: list[RunChannel] = []

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        channels.append(channel)
        started.set()
        await hold.wait()
        return 0

    board = Board()
    async with rig(tmp_path, behaviour) as r:
        r.service.questions.show_on(board)
        await r.spawn("hostile")
        await asyncio.wait_for(started.wait(), 10)
        status, answer = await channels[0]._request("POST", ASK_PATH, json.dumps(body).encode())
        assert status in (400, 413) and why in json.loads(answer)["detail"]
        assert board.shown.empty()
        hold.set()


async def test_ten_thousand_questions_stop_the_run_after_a_few(tmp_path: Path) -> None:
    """A container that is not the agent's loop (which stops asking once told) keeps asking past the limit: its
    refusals count as invalid, and the run is stopped after a few; nothing is stored or shown."""
    refusals: list[int] = []

    async def flood(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        for index in range(10_000):
            try:
                await channel.ask(f"ask-{index:06d}", "again?", ["yes"])
            except ChannelRefused as exc:
                refusals.append(exc.status or 0)
        return 0

    board = Board()
    async with rig(tmp_path, flood, SUBAGENT_MAX_QUESTIONS=0) as r:
        r.service.questions.show_on(board)
        run_id = await r.spawn("flood")
        assert await r.until_status(run_id, RunStatus.FAILED) == RunStatus.FAILED
        await r.settled()
        assert await r.service.questions.store.for_run(run_id) == []
    assert 1 <= len(refusals) < 10
    assert board.shown.empty()
