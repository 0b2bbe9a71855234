"""The per-chat turn engine: one turn at a time per chat, chats in parallel, abort-and-merge in the window.

A triggering message stored for a chat calls `notify`. With no turn in flight a turn starts. If a turn
is in flight and started less than MERGE_WINDOW_SECONDS ago (and has not begun delivering its reply),
it is aborted (its task cancelled, which closes its LLM request) and a new turn starts: its prompt is
built from the store, so it sees both messages. Later messages wait and are answered by the next turn.
At most MAX_CONCURRENT_TURNS turns run at once, all chats together: a chat over it waits (typing shown) and
its messages meanwhile are answered by one turn.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import structlog

from core.logging import get_logger
from core.setting_turns import DEFAULT_MAX_CONCURRENT_TURNS
from core.store.turns import TurnStatus
from core.typing_indicator import TypingIndicator

log = get_logger(__name__)

# The turn after an aborted one starts once the abort's cascade is done (its subagents' containers stopped,
# the engine answering in well under a second), at most this much later: its prompt then sees them cancelled,
# and it does not take the host's CPU from the engine while the engine kills them (bench/cancel.py).
CASCADE_WAIT_SECONDS = 1.0


class AbortReason(StrEnum):
    """Why a turn was aborted: what becomes of its streamed words and which of its runs are cancelled."""

    MERGE = "merge"  # a follow-up inside the merge window: the words stay, the merged answer goes into them
    STOP = "stop"  # /stop: the chat's runs are all cancelled
    STOP_BUTTON = "stop_button"  # a Stop press: its runs are cancelled as MERGE_CANCEL_SCOPE says


@dataclass(slots=True)
class Turn:
    """One main-agent turn of a chat; the agent calls `begin_delivery` before sending its reply."""

    id: str
    chat_id: int
    started_at: float  # monotonic seconds
    delivering: bool = False
    aborted: bool = False
    # The newest triggering message (store row id) it answers: its prompt ends there, so a trigger that
    # arrives while it runs gets a turn of its own and is never answered twice. None: no message asked
    # (an announcement): the prompt holds everything, and the answer replies to nothing.
    trigger_id: int | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    abort_reason: AbortReason | None = None  # once aborted: a streamed answer is kept or marked stopped
    stopped_by: str | None = None  # who pressed Stop (or sent /stop), for the mark on the answer
    cascade: asyncio.Task[None] | None = field(default=None, repr=False)  # once aborted: cancelling its runs

    def begin_delivery(self) -> None:
        """From here on the reply goes out whole: a merge no longer aborts this turn."""
        self.delivering = True


class TurnRunner(Protocol):
    async def __call__(self, turn: Turn) -> None: ...


class TurnLifecycle(Protocol):
    """Persistence and side effects around turns (the store's turn table, cascading subagent cancel)."""

    async def turn_started(self, turn: Turn) -> None: ...

    async def turn_ended(self, turn: Turn, status: TurnStatus) -> None: ...

    async def turn_aborted(self, turn: Turn, reason: AbortReason) -> None: ...


@dataclass(slots=True)
class _ChatState:
    pending: bool = False
    trigger_id: int | None = None  # the newest trigger notified
    unbounded: bool = False  # a notify without a message (an announcement): the next turn sees everything
    asked: bool = False  # a member's message waits: the next turn answers it (and carries any announcement)
    worker: asyncio.Task[None] | None = None
    turn: Turn | None = None
    slot_wait: asyncio.Task[bool] | None = None  # while the chat waits for a turn slot: /stop ends the wait

    def drop_waiting(self) -> None:
        """/stop or a Stop press: what waited for the next turn is dropped, and a wait for a slot ends."""
        self.pending = self.unbounded = self.asked = False
        if self.slot_wait is not None:
            self.slot_wait.cancel()


class ChatEngine:
    def __init__(
        self,
        run_turn: TurnRunner,
        lifecycle: TurnLifecycle,
        typing: TypingIndicator,
        merge_window_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        max_concurrent_turns: int = DEFAULT_MAX_CONCURRENT_TURNS,
    ) -> None:
        self._run_turn = run_turn
        self._lifecycle = lifecycle
        self._typing = typing
        self._merge_window_seconds = merge_window_seconds
        self._clock = clock
        self._turn_slots = asyncio.Semaphore(max_concurrent_turns)
        self._chats: dict[int, _ChatState] = {}
        self._closing = False
        self._background: set[asyncio.Task[None]] = set()

    def notify(self, chat_id: int, trigger_id: int | None = None, *, merge: bool = True) -> None:
        """A triggering message for `chat_id` is in the store (row `trigger_id`). `merge=False` (a
        subagent's result to announce) never aborts the turn in flight: it is answered by the next turn."""
        if self._closing:
            return
        state = self._chats.setdefault(chat_id, _ChatState())
        state.pending = True
        if trigger_id is not None:
            state.trigger_id = max(trigger_id, state.trigger_id or trigger_id)
            state.asked = True
        else:
            state.unbounded = True
        turn = state.turn
        if merge and turn is not None and not turn.delivering and not turn.aborted:
            age = self._clock() - turn.started_at
            if age < self._merge_window_seconds:
                log.info("turn_merge_abort", chat_id=chat_id, turn_id=turn.id, age_seconds=round(age, 3))
                self._abort(turn)
        if state.worker is None or state.worker.done():
            # Typing starts the moment a triggering message arrives and lasts until the last turn ends.
            self._typing.acquire(chat_id)
            state.worker = asyncio.create_task(self._work(chat_id, state), name=f"chat-{chat_id}")

    def active_chats(self) -> int:
        """How many chats have a turn running or waiting (the engine keeps no state for the others)."""
        return len(self._chats)

    def turn_counts(self) -> tuple[int, int]:
        """(turns running, chats waiting for a turn slot): a chat over MAX_CONCURRENT_TURNS has no turn yet."""
        running = sum(1 for state in self._chats.values() if state.turn is not None)
        waiting = sum(1 for state in self._chats.values() if state.turn is None and state.pending)
        return running, waiting

    def idle(self, chat_id: int) -> bool:
        state = self._chats.get(chat_id)
        return state is None or state.worker is None or state.worker.done()

    def waiting(self, chat_id: int) -> bool:
        """Whether a notified message waits for the chat's next turn."""
        state = self._chats.get(chat_id)
        return state is not None and state.pending

    def current_turn(self, chat_id: int) -> Turn | None:
        state = self._chats.get(chat_id)
        return state.turn if state else None

    def stop_turn(
        self, chat_id: int, by: str | None = None, turn_id: str | None = None, reason: AbortReason = AbortReason.STOP
    ) -> Turn | None:
        """/stop or a Stop button (`turn_id`: only that turn): abort the in-flight turn (whatever its age)
        and drop what was waiting. A button does nothing once the turn's answer is complete and being
        delivered (`delivering`): nothing is left to stop, and its cascade would cancel the subagents the
        answer has just told of; /stop keeps its meaning (the chat's subagents too)."""
        state = self._chats.get(chat_id)
        if state is not None and state.turn is None and turn_id is None:
            state.drop_waiting()  # /stop while the chat waits for a turn slot
        if state is None or state.turn is None or state.turn.aborted:
            return None
        if turn_id is not None and (state.turn.id != turn_id or state.turn.delivering):
            return None
        state.drop_waiting()
        turn = state.turn
        turn.stopped_by = by
        self._abort(turn, reason=reason)
        return turn

    def _abort(self, turn: Turn, reason: AbortReason = AbortReason.MERGE) -> None:
        turn.aborted = True
        turn.abort_reason = reason
        if turn.task is not None:
            turn.task.cancel()
        # The cascade runs as its own task so the caller (the inbound path) never waits on Docker.
        cascade = asyncio.create_task(self._lifecycle.turn_aborted(turn, reason), name=f"abort-{turn.id}")
        turn.cascade = cascade
        self._background.add(cascade)
        cascade.add_done_callback(self._background.discard)

    async def _work(self, chat_id: int, state: _ChatState) -> None:
        holding = False  # a turn slot
        try:
            while state.pending and not self._closing:
                # Taken only now, so a message that came while the chat waited is in this turn's prompt.
                if not holding and not await self._take_slot(chat_id, state):
                    continue  # /stop dropped what waited (unless a message came since)
                holding = True
                if not state.pending or self._closing:
                    break
                # A member's message makes the turn theirs (streamed, a reply to it, never skipped); an
                # announcement waiting with it is still handed to that turn (bot/agent/main_agent.py).
                bound = state.trigger_id if state.asked or not state.unbounded else None
                state.pending = state.unbounded = state.asked = False
                turn = Turn(id=secrets.token_hex(6), chat_id=chat_id, started_at=self._clock(), trigger_id=bound)
                state.turn = turn
                try:
                    with structlog.contextvars.bound_contextvars(chat_id=chat_id, turn_id=turn.id):
                        await self._run_one(turn)
                finally:
                    state.turn = None
                # A merge's turn follows at once in the same slot: its words stay on screen with their Stop.
                if not (turn.aborted and state.pending):
                    self._turn_slots.release()
                    holding = False
                if turn.cascade is not None and state.pending:
                    await asyncio.wait([turn.cascade], timeout=CASCADE_WAIT_SECONDS)
        finally:
            if holding:
                self._turn_slots.release()
            self._typing.release(chat_id)
            # A chat is held in memory only while it has a turn: a bot in thousands of quiet chats stays small.
            if self._chats.get(chat_id) is state and not state.pending:
                del self._chats[chat_id]

    async def _take_slot(self, chat_id: int, state: _ChatState) -> bool:
        """Wait for a turn slot (MAX_CONCURRENT_TURNS); False when /stop ended the wait first."""
        if not self._turn_slots.locked():
            await self._turn_slots.acquire()  # free: taken without waiting
            return True
        log.info("turn_waits_for_slot", chat_id=chat_id)
        state.slot_wait = asyncio.ensure_future(self._turn_slots.acquire())
        try:
            await state.slot_wait  # a slot granted as it is cancelled is given back by the semaphore
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # the worker itself (shutdown)
                raise
            return False
        finally:
            state.slot_wait = None
        return True

    async def _run_one(self, turn: Turn) -> None:
        status = TurnStatus.COMPLETED
        await self._lifecycle.turn_started(turn)
        if turn.aborted:  # a merge landed while the turn was being recorded: it never runs
            await self._lifecycle.turn_ended(turn, TurnStatus.ABORTED)
            return
        turn.task = asyncio.create_task(self._run_turn(turn), name=f"turn-{turn.id}")
        try:
            await asyncio.shield(turn.task)
        except asyncio.CancelledError:
            if not turn.aborted:  # the engine itself is being cancelled (shutdown)
                turn.task.cancel()
                raise
            status = TurnStatus.ABORTED
        except Exception:
            log.exception("turn_failed")
            status = TurnStatus.FAILED
        await self._lifecycle.turn_ended(turn, TurnStatus.ABORTED if turn.aborted else status)

    async def close(self) -> None:
        """Stop taking turns and cancel in-flight ones (shutdown; not an abort, so no cascade)."""
        self._closing = True
        workers = [s.worker for s in self._chats.values() if s.worker is not None]
        for state in self._chats.values():
            if state.turn is not None and state.turn.task is not None:
                state.turn.task.cancel()
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, *self._background, return_exceptions=True)
