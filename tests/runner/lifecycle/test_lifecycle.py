"""The run lifecycle without Docker: caps, cancels, stops that the engine does not confirm, budgets,
sessions, quotas and recovery, each through the real run channel (results: test_lifecycle_results)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from container.channel import ChannelRefused, RunChannel
from container.task import RunResult
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID, LABEL_INSTANCE, LABEL_RUN_ID, RuntimeUnavailable
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.runner.lifecycle_helpers import CHAT_ID, OTHER_CHAT_ID, Prepare, completing, forever, rig

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("both_backends")]


async def test_cap_holds_under_concurrent_requests(tmp_path: Path) -> None:
    async with rig(tmp_path, forever(), MAX_CONCURRENT_SUBAGENTS=2, SUBAGENT_QUEUE_LIMIT=0) as r:
        run_ids = await asyncio.gather(*(r.spawn(f"job {i}") for i in range(6)))
        statuses = [await r.status(run_id) for run_id in run_ids]
        assert statuses.count(RunStatus.REJECTED) == 4
        await r.until(lambda: r.runtime.running_count() == 2)
        assert r.runtime.max_running == 2


@pytest.mark.usefixtures("quick_engine_retries")
async def test_a_cancelled_run_holds_its_slot_until_the_kill_is_confirmed(tmp_path: Path) -> None:
    started = asyncio.Event()
    async with rig(tmp_path, forever(started), MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=0) as r:
        run_id = await r.spawn("stubborn")
        await asyncio.wait_for(started.wait(), 5)
        r.runtime.set_engine_down(True)
        assert await r.service.manager.cancel_run(CHAT_ID, run_id) == RunStatus.CANCELLED
        # The engine did not confirm the kill: the container may still run, so it still counts.
        assert r.service.live.count() == 1
        refused = await r.spawn("next")
        assert await r.status(refused) == RunStatus.REJECTED
        r.runtime.set_engine_down(False)
        await r.settled()
        assert r.runtime.running_count() == 0
        assert r.service.live.count() == 0


@pytest.mark.usefixtures("quick_engine_retries")
async def test_a_timed_out_container_whose_kill_failed_is_killed_and_removed_later(tmp_path: Path) -> None:
    started = asyncio.Event()
    async with rig(tmp_path, forever(started), SUBAGENT_TIMEOUT_SECONDS=0.5) as r:
        run_id = await r.spawn("slow")
        await asyncio.wait_for(started.wait(), 5)
        r.runtime.set_engine_down(True)
        await asyncio.sleep(0.8)  # past the time limit while the engine is away
        assert r.service.live.count() == 1
        r.runtime.set_engine_down(False)
        assert await r.until_status(run_id, RunStatus.TIMED_OUT, RunStatus.FAILED) == RunStatus.TIMED_OUT
        await r.settled()
        assert r.runtime.running_count() == 0
        assert r.runtime.removed


async def test_progress_messages_beyond_the_budget_are_refused(tmp_path: Path) -> None:
    answers: list[str] = []

    async def chatty(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        for index in range(3):
            try:
                answers.append(await channel.send_message(f"msg-{index:04d}", "hi"))
            except ChannelRefused as exc:
                answers.append(f"refused: {exc}")
        # A retry of an accepted message is not a second message; a retry of a refused one is refused again (and
        # counts against the run: more than a few stop it, tests/runner/channel/test_run_endpoint.py).
        answers.append(await channel.send_message("msg-0000", "hi"))
        try:
            answers.append(await channel.send_message("msg-0002", "hi"))
        except ChannelRefused as exc:
            answers.append(f"refused: {exc}")
        await channel.report(RunResult(status="completed", result="ok"))
        return 0

    async with rig(tmp_path, chatty, SUBAGENT_MAX_MESSAGES=2) as r:
        run_id = await r.spawn("chatter")
        await r.until_status(run_id, RunStatus.COMPLETED)
        await r.settled()
        assert answers[:2] == ["sent", "sent"]
        assert answers[2].startswith("refused: this run has sent its 2 progress messages")
        assert answers[3] == "already sent"
        assert answers[4].startswith("refused: this run has sent its 2 progress messages")
        assert sum(1 for t in r.texts() if t == "Crew: hi") == 2


async def test_cancel_drops_progress_messages_not_yet_sent(tmp_path: Path) -> None:
    sent = asyncio.Event()

    async def message_then_hang(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await channel.send_message("msg-000001", "partial news")
        sent.set()
        await asyncio.Event().wait()
        return None

    async with rig(tmp_path, message_then_hang) as r:
        r.channel.fail_sends = True  # Telegram is slow: the message waits in the outbox
        run_id = await r.spawn("news")
        await asyncio.wait_for(sent.wait(), 5)
        await r.service.manager.cancel_run(CHAT_ID, run_id)
        r.channel.fail_sends = False
        await r.settled()
        await r.delivery.flush(CHAT_ID)  # what the outbox dispatcher does next
        assert not any("partial news" in t for t in r.texts())


async def test_token_budget_exhaustion_ends_the_run_with_a_clear_message(tmp_path: Path) -> None:
    started = asyncio.Event()
    async with rig(tmp_path, forever(started)) as r:
        run_id = await r.spawn("spender")
        await asyncio.wait_for(started.wait(), 5)
        await r.service.manager.on_budget_exhausted(run_id)
        assert await r.until_status(run_id, RunStatus.FAILED, RunStatus.COMPLETED) == RunStatus.FAILED
        await r.settled()
        record = await r.service.runs.get(run_id)
        assert record is not None and record.error is not None and "SUBAGENT_MAX_TOKENS" in record.error
        assert r.runtime.running_count() == 0


async def test_sessions_carry_over_only_from_completed_runs_and_bad_ones_are_refused(tmp_path: Path) -> None:
    seen_history: list[int] = []
    refusals: list[str] = []
    good = (
        b'[{"kind":"request","parts":[{"part_kind":"user-prompt","content":"hi","timestamp":"2026-01-01T00:00:00Z"}]},'
        b'{"kind":"response","parts":[{"part_kind":"text","content":"hello"}],"timestamp":"2026-01-01T00:00:01Z"}]'
    )

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        seen_history.append(len(task.history))
        try:
            await channel.save_session(good if task.task != "bad" else b'{"not": "a history"}')
        except ChannelRefused as exc:
            refusals.append(str(exc))
        await channel.report(RunResult(status="completed", result="ok"))
        return 0

    async with rig(tmp_path, behaviour) as r:
        first = await r.spawn("first")
        await r.until_status(first, RunStatus.COMPLETED)
        await r.settled()
        bad = await r.spawn("bad")
        await r.until_status(bad, RunStatus.COMPLETED)
        await r.settled()
        third = await r.spawn("third")
        await r.until_status(third, RunStatus.COMPLETED)
        await r.settled()
        assert seen_history == [0, 2, 2]
        assert len(refusals) == 1 and "not a message history" in refusals[0]


async def test_a_workspace_over_quota_refuses_to_start_and_says_how_to_clear_it(tmp_path: Path) -> None:
    async with rig(tmp_path, completing(), WORKSPACE_QUOTA_MB=1) as r:
        workspace = r.service.paths.workspace(r.chat.folder)
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "big.bin").write_bytes(b"x" * (2 * 1024 * 1024))
        run_id = await r.spawn("anything")
        assert await r.until_status(run_id, RunStatus.FAILED, RunStatus.COMPLETED) == RunStatus.FAILED
        await r.settled()
        assert not r.runtime.started_specs
        assert any("/workspace clear" in t and "WORKSPACE_QUOTA_MB" in t for t in r.texts())


async def test_deferred_recovery_leaves_this_process_runs_alone(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def wait_then_complete(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await release.wait()
        await channel.report(RunResult(status="completed", result="mine"))
        return 0

    async with rig(tmp_path, wait_then_complete) as r:
        run_id = await r.spawn("own run")
        await r.until(lambda: r.runtime.running_count() == 1)
        report = await r.service.recovery.run()  # as when the engine comes back after a down start
        assert (report.reattached, report.interrupted, report.removed) == (0, 0, 0)
        release.set()
        assert await r.until_status(run_id, RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED


async def test_a_rejection_notice_owed_before_a_crash_is_told_at_start(tmp_path: Path) -> None:
    async with rig(tmp_path, completing()) as r:
        await r.service.runs.create(
            "rej-000001",
            chat_id=OTHER_CHAT_ID,
            turn_id=None,
            task="t",
            label="t",
            include_context=False,
            status=RunStatus.REJECTED,
            error="full",
        )
        await r.service.manager.tell_unnotified_rejections()
        await r.until(lambda: len(r.texts(OTHER_CHAT_ID)) == 1)
        await r.service.manager.tell_unnotified_rejections()
        await asyncio.sleep(0.05)
        assert len(r.texts(OTHER_CHAT_ID)) == 1


@pytest.mark.usefixtures("quick_engine_retries")
async def test_engine_failure_on_kill_is_logged_and_retried(tmp_path: Path) -> None:
    started = asyncio.Event()
    async with rig(tmp_path, forever(started)) as r:
        run_id = await r.spawn("kill me")
        await asyncio.wait_for(started.wait(), 5)
        r.runtime.fail_next_kill(RuntimeUnavailable("engine hiccup"))
        await r.service.manager.cancel_run(CHAT_ID, run_id)
        await r.settled()
        assert r.runtime.running_count() == 0


def left_running(run_id: str) -> Prepare:
    """An earlier process's run: recorded running, its container still running in the engine."""

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        runs = RunStore(stores.db)
        await runs.create(
            run_id,
            chat_id=CHAT_ID,
            turn_id=None,
            task="left behind",
            label="left behind",
            include_context=False,
            status=RunStatus.QUEUED,
        )
        await runs.mark_running(run_id, None)
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_RUN_ID: run_id, LABEL_CHAT_ID: str(CHAT_ID)}
        container_id = runtime.add_existing(labels)
        await runs.set_container(run_id, container_id)
        runtime.set_engine_down(True)  # the engine is away while the bot starts

    return prepare


async def test_runs_left_live_count_against_the_cap_while_the_engine_is_down(tmp_path: Path) -> None:
    async with rig(
        tmp_path, completing(), prepare=left_running("old-run-0001"), MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=0
    ) as r:
        assert r.service.live.count() == 1
        refused = await r.spawn("new work")
        assert await r.status(refused) == RunStatus.REJECTED


async def test_cancel_of_a_run_not_yet_recovered_cancels_it_and_recovery_removes_its_container(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, completing(), prepare=left_running("old-run-0002")) as r:
        assert await r.service.manager.cancel_run(CHAT_ID, "old-run-0002") == RunStatus.CANCELLED
        r.runtime.set_engine_down(False)
        report = await r.service.recovery.run()
        assert report.removed == 1 and report.reattached == 0
        assert r.runtime.running_count() == 0
        assert await r.status("old-run-0002") == RunStatus.CANCELLED
        assert r.service.live.count() == 0


async def test_workspace_is_described_and_cleared_only_when_no_run_uses_it(tmp_path: Path) -> None:
    started = asyncio.Event()
    outside = tmp_path / "host-file.txt"
    outside.write_text("keep me")
    async with rig(tmp_path, forever(started)) as r:
        workspace = r.service.paths.workspace(r.chat.folder)
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "data.bin").write_bytes(b"x" * (3 * 1024 * 1024))
        (workspace / "link").symlink_to(outside)
        assert "3.0 MB of 1024 MB" in await r.service.workspaces.describe(CHAT_ID)
        run_id = await r.spawn("busy")
        await asyncio.wait_for(started.wait(), 5)
        assert "/cancel all first" in await r.service.workspaces.clear(CHAT_ID)
        assert (workspace / "data.bin").exists()
        await r.service.manager.cancel_run(CHAT_ID, run_id)
        await r.settled()
        assert await r.service.workspaces.clear(CHAT_ID) == "Cleared this chat's workspace."
        assert workspace.is_dir() and not any(workspace.iterdir())
        assert outside.read_text() == "keep me"
