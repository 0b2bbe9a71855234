"""Spawn requests over a cap wait here for a slot (SUBAGENT_QUEUE_LIMIT) instead of being refused.

A waiting run is recorded `queued` (as is one about to start), so a restart queues every queued run
again in the order they came and starts them within the caps; a cancel or a merge ends it in the store
and it never starts.
The next free slot goes round-robin across chats (the chat served longest ago first, then the oldest
request), so one chat's burst cannot starve the others; the per-chat cap still holds.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from core.delivery import Delivery
from core.logging import get_logger
from core.store.runs import RunRecord, RunStatus, RunStore
from runner.lifecycle.admission import chat_share
from runner.lifecycle.approvals import Approvals
from runner.lifecycle.rejections import RejectionNotices

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Waiting:
    run_id: str
    chat_id: int
    turn_id: str | None
    label: str
    arrival: int  # arrival order across all chats; ties between chats go to the older request


class RunQueue:
    """In memory: per chat, its waiting runs in arrival order; the store holds the same for restarts."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit  # read at each request: an operator may change SUBAGENT_QUEUE_LIMIT live
        self._chats: dict[int, deque[Waiting]] = {}
        self._arrivals = itertools.count()
        self._starts = itertools.count()
        self._served: dict[int, int] = {}  # chat id -> when it last got a slot (start order)

    def __len__(self) -> int:
        return sum(len(q) for q in self._chats.values())

    def __contains__(self, run_id: object) -> bool:
        return any(w.run_id == run_id for w in self.all())

    def has_room(self, chat_id: int) -> bool:
        """Room for one more of this chat: within the limit, and within the chat's share of it (half,
        rounded up), so one chat's burst cannot fill the queue and lock every other chat out."""
        limit = self._limit()
        return len(self) < limit and self.count(chat_id) < chat_share(limit)

    def count(self, chat_id: int | None = None) -> int:
        """Runs waiting, of a chat (None: all chats)."""
        return len(self) if chat_id is None else len(self._chats.get(chat_id, ()))

    def all(self) -> list[Waiting]:
        return sorted((w for q in self._chats.values() for w in q), key=lambda w: w.arrival)

    def add(self, run_id: str, chat_id: int, turn_id: str | None, label: str) -> int:
        """Queue a run; returns how many wait ahead of it (arrived earlier, all chats)."""
        ahead = len(self)
        entry = Waiting(run_id, chat_id, turn_id, label, next(self._arrivals))
        self._chats.setdefault(chat_id, deque()).append(entry)
        return ahead

    def remove(self, run_id: str) -> Waiting | None:
        for chat_id, queue in self._chats.items():
            for entry in queue:
                if entry.run_id == run_id:
                    queue.remove(entry)
                    if not queue:
                        del self._chats[chat_id]
                    return entry
        return None

    def started(self, chat_id: int) -> None:
        """A run of the chat took a slot without waiting: it counts as served for the rotation."""
        self._served[chat_id] = next(self._starts)

    def next(self, may_start: Callable[[int], bool]) -> Waiting | None:
        """Take the run that gets the free slot, or None when no waiting chat may start one now."""
        ready = [chat for chat in self._chats if may_start(chat)]
        if not ready:
            return None
        chat = min(ready, key=lambda c: (self._served.get(c, -1), self._chats[c][0].arrival))
        queue = self._chats[chat]
        entry = queue.popleft()
        if not queue:
            del self._chats[chat]
        self.started(chat)
        return entry


class WaitingRuns:
    """The queue with its records and notices; `start` is the manager's: it takes the slot at once."""

    def __init__(
        self,
        limit: Callable[[], int],
        *,
        runs: RunStore,
        delivery: Delivery,
        may_start: Callable[[int], bool],
        start: Callable[[Waiting], None],
        on_cancelled: Callable[[RunStatus, str], None] = lambda status, reason: None,
        approvals: Approvals | None = None,
    ) -> None:
        self._queue = RunQueue(limit)
        self._approvals = approvals  # runs not queued yet, awaiting an admin's approval: cancelled with the rest
        self._runs = runs
        self._delivery = delivery
        self._may_start = may_start
        self._start = start
        self._on_cancelled = on_cancelled  # counted like a run cancelled before it started
        # Queued requests of one chat that arrive together are told in one message, like refusals.
        self._notices = RejectionNotices(self._tell)
        self._first_ahead: dict[int, int] = {}

    def has_room(self, chat_id: int) -> bool:
        return self._queue.has_room(chat_id)

    def count(self, chat_id: int | None = None) -> int:
        return self._queue.count(chat_id)

    def __len__(self) -> int:
        return len(self._queue)

    def started(self, chat_id: int) -> None:
        self._queue.started(chat_id)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._queue

    def ahead_of(self, run_id: str) -> int | None:
        """How many wait ahead of a waiting run (None: it is not waiting)."""
        waiting = self._queue.all()
        for position, entry in enumerate(waiting):
            if entry.run_id == run_id:
                return position
        return None

    def add(self, run_id: str, chat_id: int, turn_id: str | None, label: str, *, notify: bool = True) -> None:
        """Queue a run recorded `queued` and waiting; the chat is told its place (unless `notify` is off: an
        approved run, which may start at once)."""
        ahead = self._queue.add(run_id, chat_id, turn_id, label)
        log.info("run_waiting", run_id=run_id, chat_id=chat_id, ahead=ahead)
        if notify:
            self._first_ahead.setdefault(chat_id, ahead)
            self._notices.add(chat_id)

    def restore(self, records: Iterable[RunRecord]) -> None:
        """At start: the runs that waited before the restart wait again, in their order."""
        for record in records:
            if record.status == RunStatus.QUEUED and record.id not in self._queue:
                self._queue.add(record.id, record.chat_id, record.turn_id, record.label)

    def drain(self) -> None:
        """Start waiting runs while slots are free (synchronous: each start takes its slot before the next check)."""
        while (entry := self._queue.next(self._may_start)) is not None:
            log.info("run_leaves_queue", run_id=entry.run_id, chat_id=entry.chat_id)
            self._start(entry)

    def _take(self, matches: Callable[[Waiting], bool]) -> list[Waiting]:
        """Out of the queue at once (no await): none of them can take a slot that a cancel's kill frees."""
        return [entry for entry in self._queue.all() if matches(entry) and self._queue.remove(entry.run_id) is not None]

    async def _cancel(self, matches: Callable[[Waiting], bool], reason: str, unapproved: Awaitable[int]) -> int:
        """The waiting runs that match, then those awaiting approval (one approved meanwhile joins the queue:
        it is taken too)."""
        entries = self._take(matches)
        count = await unapproved
        entries += self._take(matches)
        for entry in entries:
            if await self._runs.finish(entry.run_id, RunStatus.CANCELLED, error=f"cancelled: {reason}"):
                count += 1
                self._on_cancelled(RunStatus.CANCELLED, reason)
                log.info("run_cancelled", run_id=entry.run_id, reason=reason, waiting=True)
        return count

    async def cancel_run(self, chat_id: int, run_id: str, reason: str) -> bool:
        return bool(
            await self._cancel(
                lambda w: w.run_id == run_id and w.chat_id == chat_id,
                reason,
                self._unapproved(reason, chat_id, run_id=run_id),
            )
        )

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        return await self._cancel(lambda w: w.chat_id == chat_id, reason, self._unapproved(reason, chat_id))

    async def cancel_turn(self, turn_id: str, reason: str) -> int:
        unapproved = self._unapproved(reason, None, turn_id=turn_id)
        return await self._cancel(lambda w: w.turn_id == turn_id, reason, unapproved)

    async def _unapproved(
        self, reason: str, chat_id: int | None, *, run_id: str | None = None, turn_id: str | None = None
    ) -> int:
        if self._approvals is None:
            return 0
        return await self._approvals.cancel(
            await self._approvals.awaiting(chat_id, run_id=run_id, turn_id=turn_id), reason
        )

    async def _tell(self, chat_id: int, count: int) -> None:
        ahead = self._first_ahead.pop(chat_id, 0)
        if count == 1:
            text = f"All subagent slots are busy: your task is queued, {ahead} ahead; it starts when a slot frees."
        else:
            text = f"All subagent slots are busy: {count} tasks are queued, {ahead} ahead; they start as slots free."
        await self._delivery.notice(chat_id, text)

    async def close(self) -> None:
        await self._notices.close()
        if self._approvals is not None:
            await self._approvals.close()
