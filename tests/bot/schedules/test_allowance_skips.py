"""A due time met with the chat's daily LLM allowance used up is skipped with the reason: not failed, not
backed off, no word of failure to the chat; after a top-up the next due time runs. Real SQLite, the real
allowances and the spawner path the main agent shares (AllowanceCheckedSpawner)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.agent.spawn_guard import AllowanceCheckedSpawner
from bot.schedules.firing import TaskFiring
from core.allowances import Allowances
from core.settings import load_settings
from core.store.schedules import FireStatus, TaskMode, TaskRecord, TaskStatus
from core.store.spend import SpendKind, SpendStore
from tests.bot.schedules.rig import CHAT, CREATOR, Rig, open_rig

NOW = 10_000.0
SPENT = "this chat's daily allowance of 1,000 tokens is used up for today"


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    opened = await open_rig(tmp_path / "db.sqlite3", start=False, clock=lambda: NOW)
    yield opened
    await opened.stop()


async def spent_allowances(rig: Rig) -> Allowances:
    allowances = Allowances(load_settings(DATA_DIR="unused", CHAT_DAILY_TOKENS="1000"), SpendStore(rig.db))
    held = await allowances.reserve(CHAT, SpendKind.MAIN, 1000)
    await allowances.settle(held, 600, 400, estimated=False)
    return allowances


def firing(rig: Rig, allowances: Allowances, *, checks_first: bool) -> TaskFiring:
    """max_failures=1: a due time counted as failed would pause the task at once."""
    return TaskFiring(
        rig.store,
        AllowanceCheckedSpawner(rig.spawner, allowances.left_for),
        rig.chat,
        rig.chat,
        max_failures=1,
        spent=allowances.left_for if checks_first else None,
        clock=lambda: NOW,
        wait_retry_seconds=0.01,
    )


async def fire_once(rig: Rig, fired: TaskFiring, task: TaskRecord, due: float) -> None:
    fire = await rig.store.claim(task.id, due, due + 3600)
    assert fire is not None
    await fired.run(fire, task)


@pytest.mark.parametrize("checks_first", [False, True], ids=["refused-by-the-spawner", "checked-before"])
async def test_a_scheduled_run_without_allowance_is_skipped_not_failed(rig: Rig, checks_first: bool) -> None:
    allowances = await spent_allowances(rig)
    fired = firing(rig, allowances, checks_first=checks_first)
    task = await rig.book.schedule(CHAT, CREATOR, "$ date", "every 1h", label="clock")
    await fire_once(rig, fired, task, 20_000.0)
    await fire_once(rig, fired, task, 23_600.0)  # the next due time too: no backoff held it back

    history = await rig.store.history(task.id)
    current = await rig.store.get(task.id)
    assert [f.status for f in history] == [FireStatus.SKIPPED, FireStatus.SKIPPED]
    assert all(f.detail is not None and f.detail.startswith(SPENT) for f in history), history
    assert current is not None and current.status is TaskStatus.ACTIVE
    assert (current.failures, current.backoff_until) == (0, None)
    assert rig.spawner.spawned == [] and rig.chat.notices == []

    await allowances.add(CHAT, 5000)  # an admin's top-up: the next due time runs
    await fire_once(rig, fired, task, 27_200.0)
    assert [s.task for s in rig.spawner.spawned] == ["$ date"]
    assert (await rig.store.history(task.id))[0].status is FireStatus.RUNNING


async def test_a_scheduled_prompt_without_allowance_is_not_put_to_the_main_agent(rig: Rig) -> None:
    allowances = await spent_allowances(rig)
    fired = firing(rig, allowances, checks_first=True)
    task = await rig.book.schedule(CHAT, CREATOR, "summarise the day", "every 1h", mode=TaskMode.MESSAGE)
    await fire_once(rig, fired, task, 20_000.0)
    (fire,) = await rig.store.history(task.id)
    assert fire.status is FireStatus.SKIPPED and fire.detail is not None and fire.detail.startswith(SPENT)
    assert rig.chat.posted == []
    current = await rig.store.get(task.id)
    assert current is not None and current.failures == 0
