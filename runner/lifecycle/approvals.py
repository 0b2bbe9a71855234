"""SUBAGENT_APPROVAL=admins: a spawned run is recorded `queued` and marked as needing approval in one write, then
asked about; it waits on its status card, shown as awaiting approval, for a chat admin's (or ADMIN_USER_IDS')
Approve before it may join the queue. Anything else refuses it (Deny, no answer within
SUBAGENT_ASK_TIMEOUT_SECONDS, a question that could not be shown or ended), and the chat and the main agent are
told as for any refusal.

The decision is a stored question (core/store/questions.py) answered through the card's buttons; it is in the
store before it takes effect, so a restart resumes every wait and carries out a decision taken just before it
(a marked run whose approval question is not an Approve never enters the queue: `unapproved`; one the crash left
without a question is asked again). A cancel after an Approve whose run has not joined the queue yet still ends it.
A run awaiting approval counts against SUBAGENT_QUEUE_LIMIT and against its chat's share of it (half: one chat
cannot lock the others out), not the caps: it holds no slot; an approved one joins the queue and starts within
the caps. Scheduled runs are not asked again: their task was approved at its creation by an admin
(bot/schedules/book.py).
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
from runner.lifecycle.admission import chat_share, record_request

log = get_logger(__name__)

APPROVE, DENY = "Approve", "Deny"
OPTIONS = (APPROVE, DENY)  # the option's index is what a press names: 0 approves
MAX_TASK_SHOWN_CHARS = 300  # of the task, in the question: what the admin approves, not only its label


class Approvals:
    def __init__(
        self,
        settings: Settings,
        runs: RunStore,
        questions: Questions | None,
        delivery: Delivery,
        *,
        start: Callable[[RunRecord], None],
    ) -> None:
        self._settings = settings
        self._runs = runs
        self._questions = questions
        self._delivery = delivery
        self._start = start  # an approved run joins the queue and starts within the caps
        self._waits: dict[str, asyncio.Task[None]] = {}  # run id -> its wait for a decision, until carried out
        self._chat_of: dict[str, int] = {}  # run id -> its chat, while it waits
        self._queued: Callable[[int | None], int] = lambda chat_id: 0
        self._tell_refused: Callable[[int], None] = lambda chat_id: None
        self._count_refused: Callable[[RunStatus, str], None] = lambda status, reason: None

    def beside(
        self,
        queued: Callable[[int | None], int],
        *,
        tell: Callable[[int], None],
        count: Callable[[RunStatus, str], None],
    ) -> None:
        """The queue these runs join: `queued` counts its runs (of a chat; None: all). A run refused for a full
        queue is told as any refusal (`tell`, by chat) and counted (`count`)."""
        self._queued, self._tell_refused, self._count_refused = queued, tell, count

    def needed(self, request: SpawnRequest) -> bool:
        if self._settings.subagent_approval is not ApprovalMode.ADMINS or self._questions is None:
            return False
        return not (request.turn_id or "").startswith(SCHEDULED_TURN_PREFIX)

    def pending(self, chat_id: int | None = None) -> int:
        """Runs awaiting a decision (of a chat; None: all)."""
        return sum(1 for chat in self._chat_of.values() if chat_id in (None, chat))

    async def hold(self, chat_id: int, request: SpawnRequest, label: str) -> RequestOutcome:
        """Record the run as awaiting approval and ask; refused (as over a cap) when the queue, or the chat's share
        of it, is full."""
        limit = self._settings.subagent_queue_limit
        reason = None
        if self._queued(None) + self.pending() >= limit:
            reason = "too many runs wait already (SUBAGENT_QUEUE_LIMIT)"
        elif self._queued(chat_id) + self.pending(chat_id) >= chat_share(limit):
            reason = "this chat's runs fill its share of the queue (half of SUBAGENT_QUEUE_LIMIT)"
        status = RunStatus.REJECTED if reason is not None else RunStatus.QUEUED
        reserved = reason is None and request.request_id not in self._chat_of
        if reserved:  # counted from here, before any await: concurrent requests see it
            self._chat_of[request.request_id] = chat_id
        try:
            # Marked in the same write: a crash before the question is stored leaves a run the next start asks about.
            await record_request(
                self._runs, chat_id, request, label, status, reason=reason, needs_approval=reason is None
            )
        except BaseException as exc:
            if reserved:
                self._chat_of.pop(request.request_id, None)
            if isinstance(exc, DuplicateRun):
                return RequestOutcome.DUPLICATE
            raise
        if reason is not None:
            self._count_refused(status, reason)
            self._tell_refused(chat_id)
            return RequestOutcome.ACCEPTED
        try:
            question = await self._ask(request.request_id, chat_id, label, request.task)
        except Exception:
            self._chat_of.pop(request.request_id, None)
            log.exception("approval_not_asked", run_id=request.request_id)
            await self._refuse(request.request_id, chat_id, "its approval could not be asked")
            return RequestOutcome.ACCEPTED
        self._wait(question)
        return RequestOutcome.ACCEPTED

    async def _ask(self, run_id: str, chat_id: int, label: str, task: str) -> Question:
        assert self._questions is not None
        shown = " ".join(task.split())
        if len(shown) > MAX_TASK_SHOWN_CHARS:
            shown = shown[: MAX_TASK_SHOWN_CHARS - 1].rstrip() + "…"
        question = await self._questions.ask(
            NewQuestion(
                chat_id=chat_id,
                run_id=run_id,
                kind=QuestionKind.APPROVAL,
                text=f"Run {label} needs an admin's approval to start.\nTask: {shown}",
                options=OPTIONS,
                audience=Audience.ADMINS,
                expires_at=time.time() + self._settings.subagent_ask_timeout_seconds,
            ),
            # The buttons are on the run's status card; without cards, on a message of their own.
            show=not self._settings.status_card,
        )
        self._runs.changed(run_id)  # the card shows its buttons, now that the question exists
        log.info("run_awaiting_approval", run_id=run_id, chat_id=chat_id, question_id=question.id)
        return question

    async def unapproved(self, records: list[RunRecord]) -> set[str]:
        """Of these queued runs, those held back for approval: marked as needing it (or asked about, by a version
        that did not mark them), and not (yet) answered Approve."""
        if self._questions is None:
            return set()
        held = set()
        for record in records:
            asked = await self._questions.store.for_run(record.id, QuestionKind.APPROVAL)
            approved = bool(asked) and asked[-1].status is QuestionStatus.ANSWERED and asked[-1].option == 0
            if (record.needs_approval or asked) and not approved:
                held.add(record.id)
        return held

    async def restore(self, records: list[RunRecord]) -> None:
        """At start: every queued run held back for approval waits again, or has its stored decision carried out
        (an Approve taken just before the restart is in the queue already: `unapproved` let it through); one a
        crash left without a question is asked now."""
        assert self._questions is not None or not records
        by_id = {record.id: record for record in records}
        for run_id in await self.unapproved(records):
            assert self._questions is not None
            record = by_id[run_id]
            self._chat_of[run_id] = record.chat_id
            asked = await self._questions.store.for_run(run_id, QuestionKind.APPROVAL)
            try:
                question = asked[-1] if asked else await self._ask(run_id, record.chat_id, record.label, record.task)
            except Exception:
                self._chat_of.pop(run_id, None)
                log.exception("approval_not_asked", run_id=run_id)
                await self._refuse(run_id, record.chat_id, "its approval could not be asked")
                continue
            self._wait(question)

    def _wait(self, question: Question) -> None:
        assert question.run_id is not None
        run_id = question.run_id
        self._chat_of[run_id] = question.chat_id
        task = asyncio.create_task(self._decide(question), name=f"approval-{run_id}")
        self._waits[run_id] = task

        def done(_: asyncio.Task[None]) -> None:
            if self._waits.get(run_id) is task:
                del self._waits[run_id]
                self._chat_of.pop(run_id, None)

        task.add_done_callback(done)

    async def _decide(self, question: Question) -> None:
        """Carry out the decision: Approve starts the run (unless a cancel came first); anything else refuses it."""
        assert self._questions is not None and question.run_id is not None
        run_id, chat_id = question.run_id, question.chat_id
        try:
            closed = await self._questions.wait(question)
        except Exception:  # not CancelledError (a shutdown): the next start waits again
            log.exception("approval_failed", run_id=run_id)
            await self._refuse(run_id, chat_id, "its approval could not be decided")
            return
        if closed.status is QuestionStatus.ANSWERED and closed.option == 0:
            record = await self._runs.get(run_id)
            if record is not None and record.status == RunStatus.QUEUED:  # not cancelled meanwhile
                log.info("run_approved", run_id=run_id, by=closed.answered_by)
                self._runs.changed(run_id)
                self._start(record)
            return
        if closed.status is QuestionStatus.ANSWERED:
            why = f"denied by {(closed.answered_by_name or 'an admin')[:40]}"
        elif closed.status is QuestionStatus.EXPIRED:
            why = f"no admin approved it within {self._settings.subagent_ask_timeout_seconds:g} s"
        else:  # ended: it could not be shown, or its run was cancelled (then the run is final and nothing is sent)
            why = f"its approval question was closed ({(closed.detail or 'ended')[:120]})"
        await self._refuse(run_id, chat_id, why)

    async def _refuse(self, run_id: str, chat_id: int, why: str) -> None:
        try:
            if await self._runs.finish(run_id, RunStatus.REJECTED, error=f"not approved: {why}"):
                record = await self._runs.get(run_id)
                label = record.label if record is not None else run_id
                log.info("run_not_approved", run_id=run_id, chat_id=chat_id, reason=why)
                await self._delivery.notice(chat_id, f"Subagent {label} did not start: {why}.")
        except Exception:
            log.exception("approval_refusal_failed", run_id=run_id)

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
        """The runs awaiting approval (queued, their approval question open, or its Approve not yet carried out:
        a cancel right after the tap still ends it), of a chat (None: any), a run, a turn."""
        if self._questions is None:
            return []
        asked = [q.run_id for q in await self._questions.store.open_of(QuestionKind.APPROVAL) if q.run_id is not None]
        asked += [one for one in self._waits if one not in asked]
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
