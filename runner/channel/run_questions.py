"""A run's questions to its chat (`POST /run/ask`, the `ask_chat` tool): one at a time, SUBAGENT_MAX_QUESTIONS
in all, each stored before it is shown and answered back over the same channel.

The wait ends when the chat answers, when SUBAGENT_ASK_TIMEOUT_SECONDS pass (answered "no answer"), or when the
run is being stopped (cancel, merge, its time limit: the wait counts against it, as any other time of the run).
A retry with the same ask id (the connection broke, the bot restarted) waits for the same stored question, or
gets its answer at once if it came meanwhile; it is no new question and is not counted again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from container.protocol import MAX_ANSWER_CHARS, AskAnswer, AskQuestion
from core.logging import get_logger
from core.questions import Questions
from core.store.questions import Audience, NewQuestion, Question, QuestionKind, QuestionStatus
from runner.channel.channel_answers import ChannelRefused
from runner.runs.live_runs import LiveRun

log = get_logger(__name__)

TOO_MANY_STATUS = 429
BUSY_STATUS = 409
QUESTION_KINDS = (QuestionKind.ASK, QuestionKind.EGRESS)  # what counts against SUBAGENT_MAX_QUESTIONS


class RunAsking:
    """The questions of one live run, for its RunInbox."""

    def __init__(
        self,
        live: LiveRun,
        desk: Questions,
        *,
        reply_to: Callable[[], Awaitable[int | None]],
        timeout_seconds: Callable[[], float],
        max_questions: Callable[[], int],
        invalid: Callable[[int, str], None],
    ) -> None:
        self._live = live
        self._desk = desk
        self._reply_to = reply_to  # the platform message that asked for the run: the question replies to it
        self._timeout = timeout_seconds  # read at each question: the settings change live
        self._max = max_questions
        self._invalid = invalid
        self._waiting: dict[str, int] = {}  # ask id -> requests waiting for it (a retry may join the first)
        self._over_limit = 0

    async def ask(self, request: AskQuestion) -> AskAnswer:
        if any(ask_id != request.ask_id for ask_id in self._waiting):
            raise ChannelRefused(BUSY_STATUS, "one question at a time: wait for the answer to the last one")
        # Held from here, before any await: a second question meanwhile is refused.
        self._waiting[request.ask_id] = self._waiting.get(request.ask_id, 0) + 1
        try:
            question = await self._desk.store.by_ask_id(self._live.id, request.ask_id)
            if question is None:
                question = await self._new(request)
            closed = await self._desk.wait(question, self._live.stop_requested)
        finally:
            self._waiting[request.ask_id] -= 1
            if not self._waiting[request.ask_id]:
                del self._waiting[request.ask_id]
        return _answer(closed)

    async def _new(self, request: AskQuestion) -> Question:
        asked = [q for q in await self._desk.store.for_run(self._live.id) if q.kind in QUESTION_KINDS]
        limit = self._max()
        if len(asked) >= limit:
            self._over_limit += 1
            reason = f"this run has asked its {limit} questions (SUBAGENT_MAX_QUESTIONS); decide the rest yourself"
            if self._over_limit > 1:  # the tool stops asking once told: a run that goes on is not that loop
                self._invalid(TOO_MANY_STATUS, reason)
            raise ChannelRefused(TOO_MANY_STATUS, reason)
        return await self._desk.ask(
            NewQuestion(
                chat_id=self._live.chat_id,
                run_id=self._live.id,
                kind=QuestionKind.ASK,
                text=request.question,
                options=tuple(request.options),
                audience=Audience.ASKERS,
                expires_at=time.time() + self._timeout(),
                ask_id=request.ask_id,
            ),
            reply_to=await self._reply_to(),
        )


def _answer(question: Question) -> AskAnswer:
    if question.status is QuestionStatus.ANSWERED:
        return AskAnswer(
            outcome="answered",
            answer=(question.answer or "")[:MAX_ANSWER_CHARS],
            by=(question.answered_by_name or "")[:200],
        )
    if question.status is QuestionStatus.EXPIRED:
        return AskAnswer(outcome="no_answer", detail="nobody answered within SUBAGENT_ASK_TIMEOUT_SECONDS")
    return AskAnswer(outcome="ended", detail=(question.detail or "the question was closed")[:500])
