"""SUBAGENT_APPROVAL=admins: a spawned run is recorded `queued` with an approval question and waits on its status
card, shown as awaiting approval, for a chat admin's (or ADMIN_USER_IDS') Approve before it may join the queue;
Deny, or no answer within SUBAGENT_ASK_TIMEOUT_SECONDS, refuses it, and the chat and the main agent are told as
for any refusal.

The decision is a stored question (core/store/questions.py) answered through the card's buttons; it is in the
store before it takes effect, so a restart resumes every wait and carries out a decision taken just before it
(a queued run with an approval question that is not an Approve never enters the queue: `unapproved`).
A run awaiting approval counts against SUBAGENT_QUEUE_LIMIT (not the caps: it holds no slot); an approved one
joins the queue and starts within the caps. Scheduled runs are not asked again: their task was approved at its
creation by an admin (bot/schedules/book.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from container.protocol import SpawnRequest
from core.delivery import Delivery
from core.logging import get_logger
from core.questions import Questions
from core.setting_questions import ApprovalMode
from core.settings import Settings
from core.store.questions import Audience, NewQuestion, Question, QuestionKind, QuestionStatus
from core.store.runs import DuplicateRun, RunRecord, RunStatus, RunStore
from core.store.spend import SCHEDULED_TURN_PREFIX
from runner.ipc.batch import RequestOutcome
from runner.lifecycle.admission import record_request

log = get_logger(__name__)

APPROVE, DENY = "Approve", "Deny"
OPTIONS = (APPROVE, DENY)  # the option's index is what a press names: 0 approves


class Approvals:
    def __init__(
        self,
        settings: Settings,
        runs: RunStore,
        questions: Questions | None,
        delivery: Delivery,
        *,
        queued: Callable[[], int],
        start: Callable[[RunRecord], None],
    ) -> None:
        self._settings = settings
        self._runs = runs
        self._questions = questions
        self._delivery = delivery
        self._queued = queued  # runs waiting in the queue for a slot, all chats
        self._start = start  # an approved run joins the queue and starts within the caps
        self._waits: dict[str, asyncio.Task[None]] = {}  # run id -> its wait for a decision
        self._tell_refused: Callable[[int], None] = lambda chat_id: None
        self._count_refused: Callable[[RunStatus, str], None] = lambda status, reason: None

    def on_refused(self, tell: Callable[[int], None], count: Callable[[RunStatus, str], None]) -> None:
        """A run refused for a full queue is told as any refusal (`tell`, by chat) and counted (`count`)."""
        self._tell_refused, self._count_refused = tell, count

    def needed(self, request: SpawnRequest) -> bool:
        if self._settings.subagent_approval is not ApprovalMode.ADMINS or self._questions is None:
            return False
        return not (request.turn_id or "").startswith(SCHEDULED_TURN_PREFIX)

    def pending(self) -> int:
        return len(self._waits)

    async def hold(self, chat_id: int, request: SpawnRequest, label: str) -> RequestOutcome:
        """Record the run as awaiting approval and ask; refused (as over a cap) when the queue is full."""
        assert self._questions is not None
        full = self._queued() + self.pending() >= self._settings.subagent_queue_limit
        status = RunStatus.REJECTED
        reason = "too many runs wait already (SUBAGENT_QUEUE_LIMIT)" if full else None
        try:
            await record_request(
                self._runs, chat_id, request, label, status if full else RunStatus.QUEUED, reason=reason
            )
        except DuplicateRun:
            return RequestOutcome.DUPLICATE
        if reason is not None:
            self._count_refused(status, reason)
            self._tell_refused(chat_id)
            return RequestOutcome.ACCEPTED
        question = await self._questions.ask(
            NewQuestion(
                chat_id=chat_id,
                run_id=request.request_id,
                kind=QuestionKind.APPROVAL,
                text=f"Run {label} needs an admin's approval to start.",
                options=OPTIONS,
                audience=Audience.ADMINS,
                expires_at=time.time() + self._settings.subagent_ask_timeout_seconds,
            ),
            # The buttons are on the run's status card; without cards, on a message of their own.
            show=not self._settings.status_card,
        )
        self._runs.changed(request.request_id)  # the card shows its buttons, now that the question exists
        log.info("run_awaiting_approval", run_id=request.request_id, chat_id=chat_id, question_id=question.id)
        self._wait(question)
        return RequestOutcome.ACCEPTED

    async def unapproved(self, records: list[RunRecord]) -> set[str]:
        """Of these queued runs, those an approval question holds back: it is not (yet) answered Approve."""
        if self._questions is None:
            return set()
        held = set()
        for record in records:
            asked = await self._questions.store.for_run(record.id, QuestionKind.APPROVAL)
            if asked and not (asked[-1].status is QuestionStatus.ANSWERED and asked[-1].option == 0):
                held.add(record.id)
        return held

    async def restore(self, records: list[RunRecord]) -> None:
        """At start: every queued run held back for approval waits again, or has its stored decision carried out
        (an Approve taken just before the restart is in the queue already: `unapproved` let it through)."""
        for run_id in await self.unapproved(records):
            assert self._questions is not None
            self._wait((await self._questions.store.for_run(run_id, QuestionKind.APPROVAL))[-1])

    def _wait(self, question: Question) -> None:
        assert question.run_id is not None
        run_id = question.run_id
        task = asyncio.create_task(self._decide(question), name=f"approval-{run_id}")
        self._waits[run_id] = task
        task.add_done_callback(lambda _: self._waits.pop(run_id, None))

    async def _decide(self, question: Question) -> None:
        assert self._questions is not None and question.run_id is not None
        try:
            closed = await self._questions.wait(question)
            run_id, chat_id = question.run_id, question.chat_id
            if closed.status is QuestionStatus.ANSWERED and closed.option == 0:
                record = await self._runs.get(run_id)
                if record is not None and record.status == RunStatus.QUEUED:  # not cancelled meanwhile
                    log.info("run_approved", run_id=run_id, by=closed.answered_by)
                    self._runs.changed(run_id)
                    self._start(record)
                return
            if closed.status is QuestionStatus.ANSWERED:
                await self._refuse(run_id, chat_id, f"denied by {(closed.answered_by_name or 'an admin')[:40]}")
            elif closed.status is QuestionStatus.EXPIRED:
                seconds = self._settings.subagent_ask_timeout_seconds
                await self._refuse(run_id, chat_id, f"no admin approved it within {seconds:g} s")
        except Exception:
            log.exception("approval_failed", run_id=question.run_id)

    async def _refuse(self, run_id: str, chat_id: int, why: str) -> None:
        if await self._runs.finish(run_id, RunStatus.REJECTED, error=f"not approved: {why}"):
            record = await self._runs.get(run_id)
            label = record.label if record is not None else run_id
            log.info("run_not_approved", run_id=run_id, chat_id=chat_id, reason=why)
            await self._delivery.notice(chat_id, f"Subagent {label} did not start: {why}.")

    async def cancel(self, run_ids: list[str], reason: str) -> int:
        """Cancel runs that await approval (a cancel, a merge): recorded cancelled, their questions ended."""
        cancelled = 0
        for run_id in run_ids:
            if await self._runs.finish(run_id, RunStatus.CANCELLED, error=f"cancelled: {reason}"):
                cancelled += 1
                log.info("run_cancelled", run_id=run_id, reason=reason, awaiting_approval=True)
            if self._questions is not None:
                await self._questions.end_run(run_id, f"the run was cancelled ({reason})")
        return cancelled

    async def awaiting(
        self, chat_id: int | None, *, run_id: str | None = None, turn_id: str | None = None
    ) -> list[str]:
        """The runs awaiting approval (queued, their approval question open), of a chat (None: any), a run, a turn."""
        if self._questions is None:
            return []
        asked = [q.run_id for q in await self._questions.store.open_of(QuestionKind.APPROVAL) if q.run_id is not None]
        records = [record for one in asked if (record := await self._runs.get(one)) is not None]
        return [
            r.id
            for r in records
            if r.status == RunStatus.QUEUED
            and chat_id in (None, r.chat_id)
            and run_id in (None, r.id)
            and turn_id in (None, r.turn_id)
        ]

    async def close(self) -> None:
        tasks = list(self._waits.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
