"""The desk of questions the bot asks a chat: stores each one before it is shown, shows it through the chat's
board (buttons, or a reply asked for), takes the first answer and wakes whoever waits for it.

Who asks: a subagent's `ask_chat` (runner/channel/run_questions.py), its door to the web in SUBAGENT_EGRESS=ask
mode, the approval of a run, the allowance notice. Who answers: a press or a reply, checked on the chat side
(bot/question_presses.py) against the store, never against the button. Every decision is in the store
(core/store/questions.py) before it takes effect, so a waiter after a restart finds it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from core.logging import get_logger
from core.store.questions import NewQuestion, Question, QuestionStatus, QuestionStore

log = get_logger(__name__)

QUESTION_ID_BYTES = 9  # 12 characters of a button's 64 bytes; unguessable, though the store decides anyway
MAX_WAITERS = 10_000  # questions waited for at once, all runs: each run has at most one


class QuestionBoard(Protocol):
    """Where a chat sees a question: a message with a button per option (none: a reply answers it)."""

    async def show(self, question: Question, reply_to: int | None) -> int | None:
        """Post it; its platform message id, if the channel has one. Raises on failure."""

    async def settle(self, question: Question) -> None:
        """It is closed: show how (answered by whom, expired, ended) and take its buttons away."""


@dataclass(frozen=True, slots=True)
class AnswerOutcome:
    counted: bool  # the first answer: it decided the question
    question: Question  # as the store has it now (a later answer sees the first one's)


class Questions:
    def __init__(self, store: QuestionStore, on_run_changed: Callable[[str], None] = lambda run_id: None) -> None:
        self.store = store
        self._board: QuestionBoard | None = None
        self._on_run_changed = on_run_changed  # the status card shows a run that waits for an answer
        self._closed: dict[str, asyncio.Event] = {}  # question id -> set when it closes, while anyone waits
        self._waiters: dict[str, int] = {}  # question id -> waits on it now
        self._settles: set[asyncio.Task[None]] = set()

    def show_on(self, board: QuestionBoard) -> None:
        """The chat's board, once the channel is built (no board: questions are stored and time out)."""
        self._board = board

    async def ask(self, new: NewQuestion, reply_to: int | None = None, *, show: bool = True) -> Question:
        """Store the question, then show it (unless `show` is off: its buttons are elsewhere, on a status card);
        a retry (same run and ask id) gets the one stored before, shown again only if it never was. A question
        that cannot be shown is ended at once, so nobody waits for it."""
        question = await self.store.create(secrets.token_urlsafe(QUESTION_ID_BYTES), new)
        if not question.is_open or question.message_id is not None:
            return question
        if show and self._board is None:
            log.info("question_not_shown", question_id=question.id, reason="no board")
        elif show and self._board is not None:
            try:
                message_id = await self._board.show(question, reply_to)
            except Exception as exc:
                log.warning("question_not_shown", question_id=question.id, error=str(exc))
                await self.close(question.id, QuestionStatus.ENDED, f"it could not be shown in the chat: {exc}")
                return await self._reload(question.id)
            await self.store.set_message(question.id, message_id)
        log.info(
            "question_asked",
            question_id=question.id,
            chat_id=question.chat_id,
            run_id=question.run_id,
            kind=str(question.kind),
            options=len(question.options),
        )
        self._run_changed(question)
        return await self._reload(question.id)

    async def wait(self, question: Question, stop: asyncio.Event | None = None) -> Question:
        """Until it is answered, it expires (closed as such here), or `stop` is set (its run ends: closed as
        ended). Returns the question as closed; whichever came first is what the store kept."""
        if not question.is_open:
            return question
        if len(self._closed) >= MAX_WAITERS and question.id not in self._closed:
            await self.close(question.id, QuestionStatus.ENDED, "too many questions wait at once")
            return await self._reload(question.id)
        closed = self._closed.setdefault(question.id, asyncio.Event())
        self._waiters[question.id] = self._waiters.get(question.id, 0) + 1  # a retry may wait beside the first
        waits = [asyncio.ensure_future(closed.wait())]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            # The store may have closed it between the caller's read and this wait.
            current = await self._reload(question.id)
            if current.is_open:
                timeout = max(0.0, question.expires_at - time.time())
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            current = await self._reload(question.id)
            if current.is_open:
                stopped = stop is not None and stop.is_set()
                if stopped:
                    await self.close(question.id, QuestionStatus.ENDED, "its run ended")
                else:
                    await self.close(question.id, QuestionStatus.EXPIRED, "no answer in time")
                current = await self._reload(question.id)
        finally:
            # A cancelled waiter (its door closed, a shutdown) leaves no entry behind: MAX_WAITERS counts live ones.
            # Its question stays open in the store: a shutdown's is waited for again after the restart, and a run
            # that ended has its questions ended by the manager (end_run).
            for waiting in waits:
                waiting.cancel()
            self._waiters[question.id] -= 1
            if not self._waiters[question.id]:
                del self._waiters[question.id]
                self._closed.pop(question.id, None)
        return current

    async def answer(self, question_id: str, answer: str, option: int | None, by: int, by_name: str) -> AnswerOutcome:
        """Record an answer (the presser is checked by the caller): the first one counts and wakes the waiter."""
        counted = await self.store.answer(question_id, answer, option, by, by_name)
        question = await self._reload(question_id)
        if counted:
            log.info(
                "question_answered",
                question_id=question_id,
                chat_id=question.chat_id,
                run_id=question.run_id,
                kind=str(question.kind),
                option=option,
                answer=answer[:200],
                user_id=by,
            )
            self._wake(question)
        return AnswerOutcome(counted, question)

    async def close(self, question_id: str, status: QuestionStatus, detail: str) -> bool:
        """Close it without an answer (expired, ended); False if something closed it first."""
        closed = await self.store.close(question_id, status, detail)
        if closed:
            question = await self._reload(question_id)
            log.info(
                "question_closed",
                question_id=question_id,
                chat_id=question.chat_id,
                run_id=question.run_id,
                kind=str(question.kind),
                status=str(status),
                detail=detail,
            )
            self._wake(question)
        return closed

    async def end_run(self, run_id: str, detail: str) -> int:
        """The run ended: its open questions end too (nobody is left to take their answers)."""
        ended = 0
        for question in await self.store.for_run(run_id):
            if question.is_open and await self.close(question.id, QuestionStatus.ENDED, detail):
                ended += 1
        return ended

    async def _reload(self, question_id: str) -> Question:
        question = await self.store.get(question_id)
        assert question is not None, question_id
        return question

    def _wake(self, question: Question) -> None:
        event = self._closed.get(question.id)
        if event is not None:
            event.set()
        self._run_changed(question)
        if self._board is not None and question.message_id is not None:
            task = asyncio.create_task(self._settle(question), name=f"question-{question.id}")
            self._settles.add(task)
            task.add_done_callback(self._settles.discard)

    async def _settle(self, question: Question) -> None:
        assert self._board is not None
        try:
            await self._board.settle(question)
        except Exception as exc:  # the decision stands; the message only shows it
            log.info("question_not_settled", question_id=question.id, error=str(exc))

    def _run_changed(self, question: Question) -> None:
        if question.run_id is not None:
            with contextlib.suppress(Exception):
                self._on_run_changed(question.run_id)

    async def close_board(self) -> None:
        """Shutdown: the messages' last edits are finished or dropped (the store holds every decision)."""
        tasks = list(self._settles)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
