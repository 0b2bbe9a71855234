"""The live status card: one message per turn that spawned subagents, kept up to date by editing it.

The first run of a turn posts the card as a reply to the bot's answer of that turn; each state change
(queued, running, ended) edits it, at most once every STATUS_CARD_EDIT_INTERVAL_SECONDS per chat (a
group takes about 20 bot messages a minute), with the latest state always shown last; when every run
of the turn has ended it shows the final totals. Results still arrive as their own messages.

Each live (awaiting approval, queued or running) run has a Cancel button under the card, and the card a Cancel
all while more than one is live; an ended run's button goes with the edit that shows it ended (what a press does:
see bot/card_presses.py). A run awaiting approval (SUBAGENT_APPROVAL=admins) has Approve and Deny buttons, which
answer its stored question (bot/question_presses.py); a run that waits for the chat's answer to its question
says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.channels.base import CardChannel, CardGone
from bot.channels.buttons import CardAction, CardButton
from bot.schedules.firing import TASK_TURN_PREFIX as SCHEDULED_TURN_PREFIX
from core.logging import get_logger
from core.outbox import DeliveryError
from core.store.chat_files import size_text
from core.store.questions import Question, QuestionKind, QuestionStore
from core.store.runs import FINAL_STATUSES, LIVE_STATUSES, RunRecord, RunStatus, RunStore

log = get_logger(__name__)

STATUS_CARD_EDIT_INTERVAL_SECONDS = 3.0  # at most one card post or edit per chat this often
ANSWER_WAIT_SECONDS = 30.0  # a new card waits this long for its turn's answer to reply to
MAX_EDIT_ATTEMPTS = 3  # a card edit refused this often (429s, network) waits for the next change
MAX_REMEMBERED_ANSWERS = 200  # answers of recent turns kept for their cards to reply to (most turns spawn none)
MAX_BUTTON_LABEL_CHARS = 40  # "Cancel <label>": a phone shows about this much of a full-width button
MAX_APPROVAL_TASK_CHARS = 120  # of a run awaiting approval's task, on its card: enough to know what is approved


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(max(seconds, 0)), 60)
    return f"{minutes}:{secs:02d}"


def _tokens(run: RunRecord) -> int:
    return run.input_tokens + run.output_tokens


def render(
    runs: list[RunRecord], now: float, asking: frozenset[str] = frozenset(), approving: frozenset[str] = frozenset()
) -> str:
    """The card's text: one line per run (label, state, elapsed, tokens, bytes through the door if it used it),
    then the totals. `asking`: the runs that wait for the chat's answer to a question; `approving`: the queued
    runs that await an admin's approval."""
    lines = ["Subagents of this request:"]
    for run in runs:
        started = run.started_at or run.created_at
        end = run.finished_at or now
        state = str(run.status).replace("_", " ")
        if run.id in asking and run.status == RunStatus.RUNNING:
            state += ", waiting for an answer"
        elif run.id in approving and run.status == RunStatus.QUEUED:
            state = "awaiting approval"
        web = f", web {size_text(run.egress_bytes)}" if run.egress_connections else ""
        lines.append(f"• {run.label}: {state}, {_elapsed(end - started)}, {_tokens(run):,} tokens{web}")
        if state == "awaiting approval":  # what the admin approves, not only its label
            lines.append(f"  task: {_shortened(' '.join(run.task.split()), MAX_APPROVAL_TASK_CHARS)}")
    ended = [r for r in runs if r.status in FINAL_STATUSES]
    total = sum(_tokens(r) for r in runs)
    first = min(r.created_at for r in runs)
    last = max((r.finished_at or now) for r in runs)
    if len(ended) == len(runs):
        counts: dict[str, int] = {}
        for run in runs:
            counts[str(run.status)] = counts.get(str(run.status), 0) + 1
        summary = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in counts.items())
        lines.append(f"Done: {summary}; {total:,} tokens in {_elapsed(last - first)}.")
    else:
        running = sum(1 for r in runs if r.status == RunStatus.RUNNING)
        queued = sum(1 for r in runs if r.status == RunStatus.QUEUED)
        lines.append(f"Total: {running} running, {queued} queued, {len(ended)} ended; {total:,} tokens so far.")
    return "\n".join(lines)


def buttons(runs: list[RunRecord], approvals: dict[str, Question] | None = None) -> list[CardButton]:
    """The card's buttons: Approve and Deny for each run awaiting approval (its open question in `approvals`),
    Cancel for each live run, in the card's order, then Cancel all when more than one is live; none once every
    run has ended."""
    live = [run for run in runs if run.status in LIVE_STATUSES]
    shown = []
    for run in live:
        question = (approvals or {}).get(run.id)
        if question is not None and run.status == RunStatus.QUEUED:
            shown += [
                CardButton(
                    CardAction.ANSWER, question.id, _shortened(f"{option} {run.label}", MAX_BUTTON_LABEL_CHARS), i
                )
                for i, option in enumerate(question.options)
            ]
    shown += [
        CardButton(CardAction.CANCEL, run.id, _shortened(f"Cancel {run.label}", MAX_BUTTON_LABEL_CHARS)) for run in live
    ]
    if len(live) > 1:
        shown.append(CardButton(CardAction.CANCEL_ALL, live[0].id, "Cancel all"))
    return shown


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


@dataclass(slots=True)
class _Card:
    chat_id: int
    turn_id: str
    message_id: int | None = None
    shown: tuple[str, tuple[CardButton, ...]] | None = None


class StatusCards:
    """Fed by `run_changed(run_id)` (the run store's watcher) and `answered(turn_id, message_id)` (the main
    agent); edits through the channel, one worker per chat so the throttle holds per chat."""

    def __init__(
        self,
        channel: CardChannel,
        runs: RunStore,
        *,
        interval_seconds: float = STATUS_CARD_EDIT_INTERVAL_SECONDS,
        answer_wait_seconds: float = ANSWER_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        questions: QuestionStore | None = None,
    ) -> None:
        self._channel = channel
        self._runs = runs
        self._questions = questions  # approvals' buttons and runs waiting for an answer
        self._interval = interval_seconds
        self._answer_wait = answer_wait_seconds
        self._clock = clock
        self._cards: dict[str, _Card] = {}  # by turn id, while any run of the turn is live
        self._dirty: dict[int, set[str]] = {}  # chat id -> turns whose card must be shown again
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._last_edit: dict[int, float] = {}  # chat id -> its card's last post or edit, within the interval
        self._answers: dict[str, asyncio.Future[int | None]] = {}
        self._lookups: set[asyncio.Task[None]] = set()

    def run_changed(self, run_id: str) -> None:
        task = asyncio.create_task(self._touch(run_id), name=f"card-{run_id}")
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    def answered(self, turn_id: str, message_id: int | None) -> None:
        """The turn's answer is out (its platform id, if the channel has one): the card replies to it."""
        future = self._answer(turn_id)
        if not future.done():
            future.set_result(message_id)

    def _answer(self, turn_id: str) -> asyncio.Future[int | None]:
        if turn_id not in self._answers:
            self._answers[turn_id] = asyncio.get_running_loop().create_future()
            while len(self._answers) > MAX_REMEMBERED_ANSWERS:
                oldest = next(iter(self._answers))
                self._answers.pop(oldest).cancel()
        return self._answers[turn_id]

    async def _touch(self, run_id: str) -> None:
        run = await self._runs.get(run_id)
        if run is None or run.turn_id is None or run.turn_id.startswith(SCHEDULED_TURN_PREFIX):
            return  # a scheduled run (every fire shares its task's turn id) or one with no turn has no card
        self._cards.setdefault(run.turn_id, _Card(run.chat_id, run.turn_id))
        self._dirty.setdefault(run.chat_id, set()).add(run.turn_id)
        if run.chat_id not in self._workers:
            self._workers[run.chat_id] = asyncio.create_task(self._work(run.chat_id), name=f"cards-{run.chat_id}")

    async def _work(self, chat_id: int) -> None:
        try:
            while turns := self._dirty.pop(chat_id, set()):
                for turn_id in sorted(turns):
                    card = self._cards.get(turn_id)
                    if card is not None:
                        await self._show(card)
        except Exception:
            log.exception("status_card_failed", chat_id=chat_id)
        finally:
            del self._workers[chat_id]

    async def _wait_turn(self, chat_id: int) -> None:
        """The throttle: the card's next post or edit in this chat comes no sooner than the interval."""
        last = self._last_edit.get(chat_id)
        if last is not None:
            await asyncio.sleep(max(0.0, last + self._interval - self._clock()))

    def _edited(self, chat_id: int) -> None:
        """Noted for the throttle; chats whose interval has passed are forgotten (they would wait for nothing), so
        only the chats edited within the last interval are held, not every chat that ever had a card."""
        now = self._clock()
        for stale in [c for c, at in self._last_edit.items() if at + self._interval <= now]:
            del self._last_edit[stale]
        self._last_edit[chat_id] = now

    async def _show(self, card: _Card) -> None:
        if card.message_id is None and card.shown is None:
            # The card replies to the turn's answer, which goes out after the spawn call returned.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._answer_wait):
                    await asyncio.shield(self._answer(card.turn_id))
        await self._wait_turn(card.chat_id)
        runs = await self._runs.for_turn(card.turn_id)
        if not runs:
            return
        asking, approvals = await self._questions_of(runs)
        view = render(runs, time.time(), asking, frozenset(approvals)), tuple(buttons(runs, approvals))
        done = all(r.status in FINAL_STATUSES for r in runs)
        if view != card.shown and await self._send(card, *view):
            card.shown = view
        if done:
            self._cards.pop(card.turn_id, None)
            self._answers.pop(card.turn_id, None)

    async def _questions_of(self, runs: list[RunRecord]) -> tuple[frozenset[str], dict[str, Question]]:
        if self._questions is None:
            return frozenset(), {}
        asking = await self._questions.waiting_runs([r.id for r in runs if r.status == RunStatus.RUNNING])
        approvals: dict[str, Question] = {}
        for run in runs:
            if run.status == RunStatus.QUEUED:
                open_ones = [q for q in await self._questions.for_run(run.id, QuestionKind.APPROVAL) if q.is_open]
                if open_ones:
                    approvals[run.id] = open_ones[-1]
        return frozenset(asking), approvals

    async def _send(self, card: _Card, text: str, shown: tuple[CardButton, ...]) -> bool:
        for _ in range(MAX_EDIT_ATTEMPTS):
            self._edited(card.chat_id)
            try:
                if card.message_id is None:
                    reply_to = self._reply_to(card)
                    card.message_id = await self._channel.post_card(card.chat_id, text, reply_to, shown)
                else:
                    await self._channel.edit_card(card.chat_id, card.message_id, text, shown)
                return True
            except CardGone:
                log.info("status_card_gone", chat_id=card.chat_id, turn_id=card.turn_id)
                card.message_id = None  # someone deleted it: the next attempt posts a new card
            except DeliveryError as exc:
                log.warning("status_card_not_sent", chat_id=card.chat_id, error=str(exc))
                if exc.permanent:
                    return False
                await asyncio.sleep(exc.retry_after_seconds or self._interval)
        return False

    def _reply_to(self, card: _Card) -> int | None:
        future = self._answers.get(card.turn_id)
        return future.result() if future is not None and future.done() and not future.cancelled() else None

    async def close(self) -> None:
        tasks = [*self._lookups, *self._workers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
