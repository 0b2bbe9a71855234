"""Answer a spawn early when the caps are already full, so a chat is never told a run started that the
task manager refuses a moment later. The manager still decides; this only refuses what it surely would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from bot.agent.main_agent import Spawner

# A request the manager has not picked up after this long is no longer counted here (it picks one up in
# milliseconds; its rescan runs every few seconds).
PICKUP_GRACE_SECONDS = 10.0


RETRY = "Try again when one finishes; /subagents lists them."


def _runs(count: int) -> str:
    return f"{count} subagent run" if count == 1 else f"{count} subagent runs"


class SpawnRefused(Exception):
    """The caps are full: the message says so and what to do, for the model to pass on."""


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._running = running
        self._picked_up = picked_up
        self._max_total = max_total  # callables: an operator may change the caps on the running bot
        self._max_per_chat = max_per_chat
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

    async def spawn(self, chat_id: int, turn_id: str, task: str, label: str | None, include_context: bool) -> str:
        async with self._lock:
            waiting = await self._not_picked_up()
            total = self._running(None) + len(waiting)
            in_chat = self._running(chat_id) + waiting.count(chat_id)
            max_total, max_per_chat = self._max_total(), self._max_per_chat()
            if total >= max_total:
                raise SpawnRefused(f"the limit of {_runs(max_total)} at once (all chats) is reached. {RETRY}")
            if in_chat >= max_per_chat:
                raise SpawnRefused(f"this chat's limit of {_runs(max_per_chat)} at once is reached. {RETRY}")
            run_id = await self._inner.spawn(chat_id, turn_id, task, label, include_context)
            self._written[run_id] = (chat_id, self._clock())
            return run_id
