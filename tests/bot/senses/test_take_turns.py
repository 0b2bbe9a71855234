"""The transcription slots, taken by chats in turn: a slot freed goes to the waiting chat that holds fewest, so a
chat's flood delays its own notes and not another chat's; a waiter cancelled never loses a slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bot.senses.take_turns import TakeTurns

A, B = -1, -2


async def settled(condition: Callable[[], bool]) -> None:
    """Until `condition` holds, letting the other tasks run (no clock involved)."""
    for _ in range(1_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never settled")


class Jobs:
    def __init__(self, turns: TakeTurns) -> None:
        self.turns = turns
        self.started: list[str] = []
        self.done: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def add(self, chat: int, name: str) -> None:
        self.done[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(self._job(chat, name))

    async def _job(self, chat: int, name: str) -> None:
        async with self.turns.slot(chat):
            self.started.append(name)
            await self.done[name].wait()


async def test_a_freed_slot_goes_to_the_chat_that_holds_fewest() -> None:
    jobs = Jobs(TakeTurns(2))
    for n in range(1, 6):
        jobs.add(A, f"a{n}")  # a flood of one chat first
    jobs.add(B, "b1")
    await settled(lambda: jobs.started == ["a1", "a2"])
    jobs.done["a1"].set()
    await settled(lambda: len(jobs.started) == 3)
    assert jobs.started[2] == "b1"  # not a3: chat B holds none, chat A one
    jobs.done["a2"].set()
    await settled(lambda: len(jobs.started) == 4)
    assert jobs.started[3] == "a3"
    for event in jobs.done.values():
        event.set()
    await asyncio.gather(*jobs.tasks.values())
    assert jobs.started == ["a1", "a2", "b1", "a3", "a4", "a5"] and jobs.turns.held == {}


async def test_a_cancelled_waiter_gives_its_turn_on() -> None:
    jobs = Jobs(TakeTurns(1))
    jobs.add(A, "a1")
    jobs.add(B, "b1")
    jobs.add(A, "a2")
    await settled(lambda: jobs.started == ["a1"])
    jobs.tasks["b1"].cancel()
    jobs.done["a1"].set()
    await settled(lambda: jobs.started == ["a1", "a2"])
    jobs.done["a2"].set()
    await asyncio.gather(*jobs.tasks.values(), return_exceptions=True)
    assert jobs.tasks["b1"].cancelled() and jobs.turns.held == {}
