"""Every branch of restart recovery, without Docker: what an earlier process left in the store and the
engine, and what the next start makes of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from container.channel import RunChannel
from container.task import RunResult
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from runner.lifecycle.manager import TaskManager
from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID, LABEL_INSTANCE, LABEL_RUN_ID
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.runner.lifecycle_helpers import CHAT_ID, Prepare, forever, rig

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("both_backends")]


async def completes(channel: RunChannel, container: MemoryContainer) -> int | None:
    task = await channel.task()
    await channel.report(RunResult(status="completed", result=f"restarted: {task.task}"))
    return 0


def left(run_id: str, status: RunStatus, container: str | None) -> Prepare:
    """An earlier process's run, recorded `status`; its container `running`, `exited` or None (gone)."""

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        runs = RunStore(stores.db)
        await runs.create(
            run_id, chat_id=CHAT_ID, turn_id=None, task="left behind", label="left behind",
            include_context=False, status=RunStatus.QUEUED,
        )  # fmt: skip
        if status is RunStatus.RUNNING:
            await runs.mark_running(run_id, None)
        if container is not None:
            labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_RUN_ID: run_id, LABEL_CHAT_ID: str(CHAT_ID)}
            exit_code = 0 if container == "exited" else None
            container_id = runtime.add_existing(labels, status=container, exit_code=exit_code)  # type: ignore[arg-type]
            await runs.set_container(run_id, container_id)

    return prepare


async def test_a_running_container_is_reattached_and_its_result_delivered(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, prepare=left("old-run-0010", RunStatus.RUNNING, "running")) as r:
        # The surviving container reconnects to its run's new socket and reports, as the agent would.
        socket = r.service.paths.channel_dir("old-run-0010") / "run.sock"
        await r.until(socket.exists)
        async with RunChannel(socket) as channel:
            assert (await channel.task()).task == "left behind"
            await channel.report(RunResult(status="completed", result="finished while you were away"))
        container_id = (await r.service.runs.get("old-run-0010")).container_id  # type: ignore[union-attr]
        assert container_id is not None
        r.runtime.finish(container_id, 0)
        assert await r.until_status("old-run-0010", RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        await r.until(lambda: any("finished while you were away" in t for t in r.texts()))


async def test_a_container_that_exited_meanwhile_without_reporting_is_a_failure(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, prepare=left("old-run-0011", RunStatus.RUNNING, "exited")) as r:
        assert await r.until_status("old-run-0011", RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.FAILED
        record = await r.service.runs.get("old-run-0011")
        assert record is not None and record.error == "exited with code 0 without reporting a result"


async def test_a_running_run_whose_container_is_gone_is_interrupted_once(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, prepare=left("old-run-0012", RunStatus.RUNNING, None)) as r:
        assert await r.status("old-run-0012") == RunStatus.INTERRUPTED
        await r.until(lambda: any("Interrupted:" in t for t in r.texts()))
        assert await r.service.recovery.run() is not None  # a second pass tells nobody twice
        assert sum("Interrupted:" in t for t in r.texts()) == 1
        assert not r.service.paths.channel_dir("old-run-0012").exists()


async def test_a_queued_run_that_never_got_a_container_starts_now(tmp_path: Path) -> None:
    async with rig(tmp_path, completes, prepare=left("old-run-0013", RunStatus.QUEUED, None)) as r:
        assert await r.until_status("old-run-0013", RunStatus.COMPLETED, RunStatus.FAILED) == RunStatus.COMPLETED
        await r.until(lambda: any("restarted: left behind" in t for t in r.texts()))


async def test_a_container_with_no_live_run_is_removed(tmp_path: Path) -> None:
    async def orphan(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        labels = {LABEL_APP: "1", LABEL_INSTANCE: instance, LABEL_RUN_ID: "no-such-run", LABEL_CHAT_ID: str(CHAT_ID)}
        runtime.add_existing(labels)
        other = {LABEL_APP: "1", LABEL_INSTANCE: "another-deployment", LABEL_RUN_ID: "theirs-000001"}
        runtime.add_existing(other)

    async with rig(tmp_path, completes, prepare=orphan) as r:
        assert len(r.runtime.removed) == 1  # only this deployment's orphan; another's is not ours to touch
        assert r.runtime.running_count() == 1


async def test_a_run_cancelled_while_recovery_still_holds_it_leaves_no_typing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery works through the runs it listed at start; a chat's cancel can reach the later ones first.
    Such a run is re-attached only to stop its container: it must not show the chat typing for ever."""
    first, second = left("old-run-0014", RunStatus.RUNNING, None), left("old-run-0015", RunStatus.RUNNING, "running")

    async def prepare(stores: Stores, runtime: MemoryRuntime, instance: str) -> None:
        await first(stores, runtime, instance)
        await second(stores, runtime, instance)

    interrupt = TaskManager.interrupt

    async def cancel_then_interrupt(self: TaskManager, record: Any, reason: str) -> bool:
        await self.cancel_chat(CHAT_ID, "a follow-up")  # while recovery is at the first run
        return await interrupt(self, record, reason)

    monkeypatch.setattr(TaskManager, "interrupt", cancel_then_interrupt)
    async with rig(tmp_path, forever(), prepare=prepare) as r:
        await r.settled()
        assert await r.status("old-run-0015") == RunStatus.CANCELLED
        assert r.runtime.running_count() == 0
        assert r.typing.holders(CHAT_ID) == 0
