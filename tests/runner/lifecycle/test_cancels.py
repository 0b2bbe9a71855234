"""A cancel's order (runner/lifecycle/cancels.py): the kill is asked before anything is awaited, the engine
gets one kill per container, and recording the cancel comes after (a failure there leaves the kill standing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.store.runs import RunStatus
from tests.runner.lifecycle_helpers import CHAT_ID, forever, rig

pytestmark = pytest.mark.timeout(60)


async def test_a_merge_cancel_asks_the_engine_for_one_kill_before_it_records_anything(tmp_path: Path) -> None:
    started = asyncio.Event()
    async with rig(tmp_path, forever(started)) as r:
        run_id = await r.spawn("long", turn_id="turn-1")
        await asyncio.wait_for(started.wait(), 5)
        record = await r.service.runs.get(run_id)
        assert record is not None and record.container_id is not None
        finish = r.service.runs.finish
        kills_when_recorded: list[list[str]] = []

        async def recording_finish(*args: object, **kwargs: object) -> bool:
            kills_when_recorded.append(list(r.runtime.kills))
            return await finish(*args, **kwargs)  # type: ignore[arg-type]

        r.service.runs.finish = recording_finish  # type: ignore[method-assign]
        assert await r.service.manager.cancel_turn("turn-1", "turn aborted (merge)") == 1
        await r.settled()
        # The cancel and the supervisor's stop shared one kill, asked before the outcome was written.
        assert kills_when_recorded[0] == [record.container_id]
        assert r.runtime.kills == [record.container_id]
        assert await r.status(run_id) == RunStatus.CANCELLED


async def test_the_container_is_killed_even_when_recording_the_cancel_fails(tmp_path: Path) -> None:
    started = asyncio.Event()
    async with rig(tmp_path, forever(started)) as r:
        run_id = await r.spawn("long")
        await asyncio.wait_for(started.wait(), 5)
        finish = r.service.runs.finish

        async def failing_finish(*args: object, **kwargs: object) -> bool:
            raise OSError("disk full")

        r.service.runs.finish = failing_finish  # type: ignore[method-assign]
        with pytest.raises(OSError, match="disk full"):
            await r.service.manager.cancel_run(CHAT_ID, run_id)
        await r.until(lambda: r.runtime.running_count() == 0)
        r.service.runs.finish = finish  # type: ignore[method-assign]
        await r.settled()
        assert len(r.runtime.kills) == 1


@pytest.mark.usefixtures("both_backends")
async def test_a_cancel_racing_the_start_kills_the_container_as_its_start_returns(tmp_path: Path) -> None:
    async with rig(tmp_path, forever()) as r:
        r.runtime.hold_starts()
        run_id = await r.spawn("late", turn_id="turn-1")
        await r.until(lambda: r.runtime.held_starts == 1)  # the engine is creating its container
        assert await r.service.manager.cancel_turn("turn-1", "turn aborted (merge)") == 1
        assert await r.status(run_id) == RunStatus.CANCELLED
        r.runtime.release_starts()
        await r.settled()
        assert r.runtime.running_count() == 0
        assert r.runtime.max_running <= 1 and r.runtime.removed
