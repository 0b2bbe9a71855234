"""Answer a spawn early when the caps and the queue are already full, so a chat is never told a run was
accepted that the task manager refuses a moment later. The manager still decides; this only refuses what
it surely would: over a cap a request waits in the queue (SUBAGENT_QUEUE_LIMIT) while it has room.

And refuse a spawn outright when the chat's or the bot's daily LLM allowance is used up: the run could
make no LLM call (the main agent's and scheduled tasks' spawns share this path)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from bot.ports.spawner import AllowanceRefused, Spawner, SpawnRefused
from core.logging import get_logger

log = get_logger(__name__)

# A request the manager has not picked up after this long is no longer counted here (it picks one up in
# milliseconds; its rescan runs every few seconds).
PICKUP_GRACE_SECONDS = 10.0


RETRY = "Try again when one finishes; /subagents lists them."
QUEUE_FULL = "and the queue of {limit} waiting requests is full"


def _runs(count: int) -> str:
    return f"{count} subagent run" if count == 1 else f"{count} subagent runs"


class CapCheckedSpawner:
    """A `Spawner` that checks the caps before writing the request.

    `running(chat_id)` is the number of runs holding a slot (None: all chats), as the manager counts them;
    `picked_up(run_id)` says whether the manager has seen a request. Requests this process wrote and the
    manager has not picked up yet count too, so several spawns in one turn cannot all pass.
    """

    def __init__(
        self,
        inner: Spawner,
        running: Callable[[int | None], int],
        picked_up: Callable[[str], Awaitable[bool]],
        *,
        max_total: Callable[[], int],
        max_per_chat: Callable[[], int],
        queued: Callable[[], int] = lambda: 0,
        queue_limit: Callable[[], int] = lambda: 0,
        on_refused: Callable[[bool], None] = lambda chat_cap: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._running = running
        self._picked_up = picked_up
        self._max_total = max_total  # callables: an operator may change the caps on the running bot
        self._max_per_chat = max_per_chat
        self._queued = queued  # requests waiting in the manager's queue for a slot
        self._queue_limit = queue_limit  # live too: SUBAGENT_QUEUE_LIMIT
        self._on_refused = on_refused  # told of each refusal (True: the chat's cap), for the operator's counts
        self._clock = clock
        self._written: dict[str, tuple[int, float]] = {}  # run id -> (chat id, when written)
        # A model may call the tool several times at once: check and write one spawn at a time.
        self._lock = asyncio.Lock()

    async def _not_picked_up(self) -> list[int]:
        """Chat ids of the requests written here that the manager has not seen yet."""
        now = self._clock()
        for run_id, (_, written_at) in list(self._written.items()):
            if now - written_at > PICKUP_GRACE_SECONDS or await self._picked_up(run_id):
                self._written.pop(run_id, None)
        return [chat for chat, _ in self._written.values()]

    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        async with self._lock:
            waiting = await self._not_picked_up()
            total = self._running(None) + len(waiting)
            in_chat = self._running(chat_id) + waiting.count(chat_id)
            max_total, max_per_chat, queue_limit = self._max_total(), self._max_per_chat(), self._queue_limit()
            # Requests written here beyond the free slots will wait in the queue: they take its room too.
            overflow = max(0, total - max_total) + max(0, in_chat - max_per_chat)
            queue_full = self._queued() + overflow >= queue_limit
            full = f" {QUEUE_FULL.format(limit=queue_limit)}" if queue_limit else ""
            if queue_full and (total >= max_total or in_chat >= max_per_chat):
                log.info("spawn_refused", chat_id=chat_id, running=self._running(None), not_picked_up=len(waiting))
            if total >= max_total and queue_full:
                self._on_refused(False)
                raise SpawnRefused(f"the limit of {_runs(max_total)} at once (all chats) is reached{full}. {RETRY}")
            if in_chat >= max_per_chat and queue_full:
                self._on_refused(True)
                raise SpawnRefused(f"this chat's limit of {_runs(max_per_chat)} at once is reached{full}. {RETRY}")
            run_id = await self._inner.spawn(chat_id, turn_id, task, label, include_context, files)
            self._written[run_id] = (chat_id, self._clock())
            return run_id


class AllowanceCheckedSpawner:
    """A `Spawner` that refuses (AllowanceRefused, with the reason) while `spent(chat_id)` says nothing is
    left of the chat's or the bot's allowance today (core.allowances.Allowances.left_for)."""

    def __init__(self, inner: Spawner, spent: Callable[[int], Awaitable[str | None]]) -> None:
        self._inner = inner
        self._spent = spent

    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        reason = await self._spent(chat_id)
        if reason is not None:
            log.info("spawn_refused_allowance", chat_id=chat_id, turn_id=turn_id)
            raise AllowanceRefused(reason)
        return await self._inner.spawn(chat_id, turn_id, task, label, include_context, files)
