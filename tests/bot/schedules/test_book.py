"""What chats may ask of tasks: limits refuse with a reason; pause, resume and cancel for the creator and
admins only; failures back off and pause the task with a word to the chat; finished runs are counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.schedules.book import ScheduleLimits, TaskAction, TaskBook, TaskRequestError
from core.store.chats import ChatStore
from core.store.runs import RunStatus, RunStore
from core.store.schedules import FireStatus, TaskMode, TaskStatus
from tests.bot.schedules.rig import CHAT, CREATOR, WAIT_SECONDS, RecordingSpawner, Rig, open_rig

OTHER_USER = 99


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    rig = await open_rig(tmp_path / "db.sqlite3", min_interval_seconds=300, max_tasks=2, max_failures=3)
    yield rig
    await rig.stop()


@pytest.mark.parametrize(
    ("schedule", "says"),
    [
        ("every 1m", "shorter than the minimum interval of 300 seconds"),
        ("*/1 * * * *", "more often than the minimum interval of 300 seconds"),
        ("0 25 * * *", "bad cron expression"),
        ("2020-05-01T10:00", "is in the past"),
        ("next tuesday", "is not a schedule"),
    ],
)
async def test_bad_schedules_are_refused_with_a_reason(rig: Rig, schedule: str, says: str) -> None:
    with pytest.raises(TaskRequestError, match=says):
        await rig.book.schedule(CHAT, CREATOR, "do it", schedule)
    assert await rig.store.for_chat(CHAT) == []


async def test_a_chat_may_have_at_most_its_limit_of_tasks(rig: Rig) -> None:
    await rig.book.schedule(CHAT, CREATOR, "one", "every 1h")
    await rig.book.schedule(CHAT, CREATOR, "two", "every 2h")
    with pytest.raises(TaskRequestError, match=r"the most it may have \(2\): cancel one first"):
        await rig.book.schedule(CHAT, CREATOR, "three", "every 3h")


async def test_the_reply_names_the_task_and_its_next_due_time_in_the_chats_zone(rig: Rig) -> None:
    await rig.book.set_timezone(CHAT, "Europe/Berlin")
    task = await rig.book.schedule(CHAT, CREATOR, "summarise the links", "0 9 * * mon", label="links")

    said = rig.book.describe_new(task)

    assert said.startswith(f"Scheduled task {task.id} (links), cron 0 9 * * mon (09:00 on mon); next due ")
    assert said.endswith(" 09:00 Europe/Berlin.")
    with pytest.raises(TaskRequestError, match="unknown time zone 'Moon/Base'"):
        await rig.book.set_timezone(CHAT, "Moon/Base")


async def test_pause_resume_cancel_for_the_creator(rig: Rig) -> None:
    task = await rig.book.schedule(CHAT, CREATOR, "check the build", "every 1h", label="build")

    paused = await rig.book.change(CHAT, CREATOR, task.id, TaskAction.PAUSE, admin=False)
    assert paused == f"Paused scheduled task {task.id} (build)."
    assert rig.scheduler.planned(task.id) is None
    assert "PAUSED" in await rig.book.list_text(CHAT)

    resumed = await rig.book.change(CHAT, CREATOR, task.id, TaskAction.RESUME, admin=False)
    assert resumed.startswith(f"Resumed scheduled task {task.id} (build); next due ")
    assert rig.scheduler.planned(task.id) is not None

    await rig.book.change(CHAT, CREATOR, task.id, TaskAction.CANCEL, admin=False)
    ended = await rig.store.get(task.id)
    assert ended is not None and ended.status is TaskStatus.CANCELLED
    assert rig.scheduler.planned(task.id) is None
    with pytest.raises(TaskRequestError, match="has already ended"):
        await rig.book.change(CHAT, CREATOR, task.id, TaskAction.RESUME, admin=False)


async def test_others_may_not_change_a_task_but_admins_may(rig: Rig, tmp_path: Path) -> None:
    task = await rig.book.schedule(CHAT, CREATOR, "check the build", "every 1h")

    with pytest.raises(TaskRequestError, match="only the task's creator or a chat admin can cancel"):
        await rig.book.change(CHAT, OTHER_USER, task.id, TaskAction.CANCEL, admin=False)
    with pytest.raises(TaskRequestError, match="no scheduled task nope in this chat"):
        await rig.book.change(CHAT, CREATOR, "nope", TaskAction.CANCEL, admin=False)
    await ChatStore(rig.db).ensure(CHAT - 1, "group", "elsewhere")
    with pytest.raises(TaskRequestError, match=f"no scheduled task {task.id} in this chat"):
        await rig.book.change(CHAT - 1, CREATOR, task.id, TaskAction.CANCEL, admin=True)

    assert (await rig.book.change(CHAT, OTHER_USER, task.id, TaskAction.PAUSE, admin=True)).startswith("Paused")


async def test_repeated_failures_back_off_then_pause_the_task_and_tell_the_chat(tmp_path: Path) -> None:
    now = [10_000.0]
    rig = await open_rig(
        tmp_path / "db.sqlite3",
        spawner=RecordingSpawner(fail="engine down"),
        max_failures=3,
        clock=lambda: now[0],
        start=False,  # a fixed clock: the firing alone, with no scheduler running on the real one
    )
    try:
        task = await rig.book.schedule(CHAT, CREATOR, "$ date", "every 1h", label="clock")
        backoffs = []
        for n in range(3):
            due = 20_000.0 + n * 3600
            fire = await rig.store.claim(task.id, due, due + 3600)
            assert fire is not None
            await rig.firing.run(fire, task)
            current = await rig.store.get(task.id)
            assert current is not None and current.failures == n + 1
            backoffs.append(current.backoff_until)
        history = await rig.store.history(task.id)
    finally:
        await rig.stop()
    assert backoffs[:2] == [now[0] + 60, now[0] + 120]  # doubling after each failure in a row
    assert current is not None and current.status is TaskStatus.PAUSED
    assert [f.status for f in history] == [FireStatus.FAILED] * 3
    assert rig.chat.notices == [
        f"Scheduled task {task.id} (clock) is paused after 3 failures in a row (last: could not start: engine down)."
        f" /tasks resume {task.id} starts it again."
    ]


async def test_finished_runs_are_counted_and_a_success_clears_the_failures(rig: Rig) -> None:
    runs = RunStore(rig.db)
    task = await rig.book.schedule(CHAT, CREATOR, "$ date", "every 1h")
    for n, outcome in enumerate((RunStatus.FAILED, RunStatus.COMPLETED)):
        fire = await rig.store.claim(task.id, 50_000.0 + n, 60_000.0 + n)
        assert fire is not None
        await rig.firing.run(fire, task)
        run_id = rig.spawner.spawned and f"run{len(rig.spawner.spawned)}"
        assert run_id
        await runs.create(
            run_id, chat_id=CHAT, turn_id=None, task="t", label="l", include_context=False, status=RunStatus.RUNNING
        )
        await runs.finish(run_id, outcome, error="exit 1" if outcome is RunStatus.FAILED else None)
        assert await rig.firing.settle() == 1
        current = await rig.store.get(task.id)
        assert current is not None and current.failures == (1 if outcome is RunStatus.FAILED else 0)
    history = await rig.store.history(task.id)
    assert [(f.status, f.detail) for f in history] == [(FireStatus.DONE, None), (FireStatus.FAILED, "exit 1")]


async def test_a_message_task_puts_its_prompt_to_the_main_agent(rig: Rig) -> None:
    task = await rig.book.schedule(CHAT, CREATOR, "remind us to stand up", "every 1h", mode=TaskMode.MESSAGE)
    fire = await rig.store.claim(task.id, 70_000.0, 73_600.0)
    assert fire is not None

    await rig.firing.run(fire, task)

    assert rig.chat.posted == [(f"[Scheduled task {task.id}]", "remind us to stand up")]
    assert rig.spawner.spawned == []
    assert [f.status for f in await rig.store.history(task.id)] == [FireStatus.DONE]


async def test_the_console_may_try_a_two_minute_task_a_group_may_not(rig: Rig) -> None:
    console = 1
    await ChatStore(rig.db).ensure(console, "console", "console")

    task = await rig.book.schedule(console, CREATOR, "$ date", "every 2m")

    assert rig.book.words(task) == "every 2 minutes"
    with pytest.raises(TaskRequestError, match="minimum interval of 300 seconds"):
        await rig.book.schedule(CHAT, CREATOR, "$ date", "every 2m")
    with pytest.raises(TaskRequestError, match="minimum interval of 60 seconds"):
        await rig.book.schedule(console, CREATOR, "$ date", "every 30s")


async def test_a_run_the_manager_rejected_for_full_caps_waits_and_starts_again(rig: Rig) -> None:
    runs = RunStore(rig.db)
    task = await rig.book.schedule(CHAT, CREATOR, "$ date", "every 1h")
    fire = await rig.store.claim(task.id, 80_000.0, 83_600.0)
    assert fire is not None
    await rig.firing.run(fire, task)
    await runs.create(
        "run1", chat_id=CHAT, turn_id=None, task="t", label="l", include_context=False, status=RunStatus.QUEUED
    )
    await runs.finish("run1", RunStatus.REJECTED, error="2 of 2 running")

    await rig.firing.settle()  # not an outcome: the due time waits for a slot instead, then starts again
    await rig.spawner.wait_for(2)
    async with asyncio.timeout(WAIT_SECONDS):
        while True:  # the spawn is recorded a moment before the fire notes its run
            history = await rig.store.history(task.id)
            if history[0].run_id == "run2":
                break
            await asyncio.sleep(0.02)

    current = await rig.store.get(task.id)
    assert current is not None and current.failures == 0
    assert [(f.status, f.run_id) for f in history] == [(FireStatus.RUNNING, "run2")]


async def test_with_approval_by_admins_only_an_admin_creates_a_subagent_task(rig: Rig) -> None:
    """SUBAGENT_APPROVAL=admins: a scheduled subagent task is approved by its creation, so a member's is refused;
    an admin's is created (its runs are not asked about again: tests/runner/lifecycle/test_approval.py)."""
    admins = {CREATOR}

    async def is_admin(chat_id: int, user_id: int) -> bool:
        return user_id in admins

    book = TaskBook(rig.store, rig.scheduler, ScheduleLimits(300, 5, "UTC", admins_approve=lambda: True), is_admin)
    with pytest.raises(TaskRequestError, match="only a chat admin can create one"):
        await book.schedule(CHAT, OTHER_USER, "report the weather", "every 1h")
    with pytest.raises(TaskRequestError, match="only a chat admin can create one"):
        await book.schedule(CHAT, None, "report the weather", "every 1h")
    task = await book.schedule(CHAT, CREATOR, "report the weather", "every 1h")
    assert task.creator_id == CREATOR
    message = await book.schedule(CHAT, OTHER_USER, "say good morning", "every 1h", mode=TaskMode.MESSAGE)
    assert message.mode is TaskMode.MESSAGE  # no subagent, nothing to approve
