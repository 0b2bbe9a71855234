"""A run's result without Docker: sent once as a [Subagent] message, as soon as it is reported (before
the container's exit is seen), one outcome when a cancel or a stop races it, refused the second time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from container.channel import ChannelRefused, RunChannel
from container.task import RunResult
from core.store.runs import FollowUp, RunStatus
from tests.fakes.memory_runtime import MemoryContainer
from tests.runner.lifecycle_helpers import CHAT_ID, completing, forever, reports_then_hangs, rig

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("both_backends")]


async def test_a_result_arrives_once_as_a_subagent_message(tmp_path: Path) -> None:
    async with rig(tmp_path, completing()) as r:
        run_id = await r.spawn("count the stars")
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        await r.until(lambda: any("count the stars" in t for t in r.texts()))
        await r.settled()
        results = [t for t in r.texts() if "[Task: count the stars]" in t]
        assert results == ["Crew: [Task: count the stars]\nall done: count the stars"]
        assert r.runtime.removed, "the container is removed after its result is collected"


async def test_cancel_racing_a_reported_result_records_one_outcome(tmp_path: Path) -> None:
    reported = asyncio.Event()
    async with rig(tmp_path, reports_then_hangs("too late", reported)) as r:
        run_id = await r.spawn("race")
        await asyncio.wait_for(reported.wait(), 5)
        answered = await r.service.manager.cancel_run(CHAT_ID, run_id)
        await r.settled()
        final = await r.status(run_id)
        # Whichever came first is the one outcome, and the chat hears exactly that one.
        assert answered == final and final in {RunStatus.CANCELLED, RunStatus.COMPLETED}
        results = [t for t in r.texts() if "too late" in t]
        assert len(results) == (1 if final == RunStatus.COMPLETED else 0)
        assert r.runtime.running_count() == 0


async def test_a_reported_result_is_sent_before_the_container_exits(tmp_path: Path) -> None:
    exit_now = asyncio.Event()

    async def report_then_linger(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await channel.report(RunResult(status="completed", result="ready early"))
        await exit_now.wait()  # the engine is slow to see it exit
        return 0

    async with rig(tmp_path, report_then_linger) as r:
        run_id = await r.spawn("early")
        await r.until(lambda: any("ready early" in t for t in r.texts()))
        assert await r.status(run_id) == RunStatus.COMPLETED
        # The chat has its answer: it no longer shows typing for this run, though the run has not ended.
        await r.until(lambda: r.typing.holders(CHAT_ID) == 0)
        assert r.runtime.running_count() == 1, "sent, and typing gone, while its container still runs"
        ended = asyncio.create_task(r.service.wait_ended(CHAT_ID))
        await asyncio.sleep(0.1)
        assert not ended.done(), "its container has not exited yet"
        # A follow-up for it now would be lost: it is told the run is not running.
        assert r.service.send_to_run(CHAT_ID, run_id, "also do X") is FollowUp.NOT_RUNNING
        # A cancel now (a follow-up in the chat) stops the container but cannot take the result back.
        assert await r.service.manager.cancel_run(CHAT_ID, run_id) == RunStatus.COMPLETED
        exit_now.set()
        await asyncio.wait_for(ended, 5)
        assert not r.service.live.all()
        assert await r.status(run_id) == RunStatus.COMPLETED
        assert len([t for t in r.texts() if "ready early" in t]) == 1
        assert r.runtime.running_count() == 0


@pytest.mark.usefixtures("quick_engine_retries")
async def test_a_result_reported_after_a_stop_was_asked_for_does_not_count(tmp_path: Path) -> None:
    asked = asyncio.Event()
    accepted = asyncio.Event()

    async def report_while_stopping(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await asked.wait()
        await channel.report(RunResult(status="completed", result="after the stop"))
        accepted.set()
        await asyncio.Event().wait()
        return None

    async with rig(tmp_path, report_while_stopping) as r:
        run_id = await r.spawn("budget")
        await r.until(lambda: r.runtime.running_count() == 1)
        r.runtime.set_engine_down(True)  # the kill waits: the container gets to report meanwhile
        await r.service.manager.on_budget_exhausted(run_id)  # a stop, not a cancel: the channel still answers
        asked.set()
        await asyncio.wait_for(accepted.wait(), 5)
        await asyncio.sleep(0.1)
        assert await r.status(run_id) == RunStatus.RUNNING, "the stop asked for first decides, at the exit"
        r.runtime.set_engine_down(False)
        assert await r.until_status(run_id, RunStatus.FAILED, RunStatus.COMPLETED) == RunStatus.FAILED
        await r.settled()
        assert not any("after the stop" in t for t in r.texts())


async def test_a_container_that_reports_but_does_not_exit_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("runner.lifecycle.supervisor.RESULT_GRACE_SECONDS", 0.1)
    async with rig(tmp_path, reports_then_hangs("done but lingering")) as r:
        run_id = await r.spawn("linger")
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        await r.settled()
        assert r.runtime.running_count() == 0


async def test_a_second_result_is_refused(tmp_path: Path) -> None:
    second: list[str] = []

    async def twice(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await channel.report(RunResult(status="completed", result="first"))
        try:
            await channel.report(RunResult(status="completed", result="second"))
        except ChannelRefused as exc:
            second.append(str(exc))
        return 0

    async with rig(tmp_path, twice) as r:
        run_id = await r.spawn("twice")
        await r.until_status(run_id, RunStatus.COMPLETED)
        await r.settled()
        assert second == ["this run has reported its result already"]
        record = await r.service.runs.get(run_id)
        assert record is not None and record.result == "first"


@pytest.mark.usefixtures("quick_engine_retries")
async def test_waiting_for_a_chat_to_end_its_runs_skips_a_cancelled_one_the_engine_cannot_stop(tmp_path: Path) -> None:
    # The chat has its cancel: its container is stopped for sure, but the engine may be away for long.
    started = asyncio.Event()
    async with rig(tmp_path, forever(started)) as r:
        run_id = await r.spawn("long")
        await asyncio.wait_for(started.wait(), 5)
        r.runtime.set_engine_down(True)
        assert await r.service.manager.cancel_run(CHAT_ID, run_id) == RunStatus.CANCELLED
        assert r.typing.holders(CHAT_ID) == 0
        await asyncio.wait_for(r.service.wait_ended(CHAT_ID), 5)
        assert r.runtime.running_count() == 1, "its container could not be stopped yet"
        r.runtime.set_engine_down(False)
        await r.settled()
        assert r.runtime.running_count() == 0
