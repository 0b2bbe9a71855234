"""Scheduled tasks in the store: a due time is claimed once, whoever asks and however often."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.store.chats import ChatStore
from core.store.db import Database
from core.store.schedules import FireStatus, NewTask, ScheduleStore, TaskLimitReached, TaskMode, TaskStatus

CHAT = -700


def new_task(next_due_at: float = 2_000.0, chat_id: int = CHAT) -> NewTask:
    return NewTask(
        chat_id=chat_id,
        creator_id=7,
        label="check",
        prompt="check the build",
        schedule="every 5m",
        timezone="UTC",
        mode=TaskMode.SUBAGENT,
        next_due_at=next_due_at,
        created_at=1_700.0,
    )


@pytest.fixture
async def store(db: Database) -> ScheduleStore:
    await ChatStore(db).ensure(CHAT, "group", "tasks")
    return ScheduleStore(db)


async def test_a_due_time_is_claimed_once_and_moves_the_task_on(store: ScheduleStore) -> None:
    task = await store.create(new_task(), max_open=5)

    first = await store.claim(task.id, 2_000.0, 2_300.0)
    second = await store.claim(task.id, 2_000.0, 2_300.0)

    assert first is not None and first.status is FireStatus.CLAIMED
    assert second is None
    moved = await store.get(task.id)
    assert moved is not None and moved.next_due_at == 2_300.0 and moved.last_outcome == "claimed"


async def test_two_connections_racing_for_one_due_time_claim_it_once(tmp_path: Path) -> None:
    path = tmp_path / "race.sqlite3"
    one, two = await Database.open(path), await Database.open(path)
    try:
        await ChatStore(one).ensure(CHAT, "group", "tasks")
        task = await ScheduleStore(one).create(new_task(), max_open=5)
        claims = await asyncio.gather(
            *(ScheduleStore(db).claim(task.id, 2_000.0, 2_300.0) for db in (one, two, one, two))
        )
    finally:
        await one.close()
        await two.close()
    assert sum(claim is not None for claim in claims) == 1


async def test_a_paused_or_ended_task_claims_nothing(store: ScheduleStore) -> None:
    task = await store.create(new_task(), max_open=5)
    assert await store.set_status(task.id, TaskStatus.PAUSED, "paused")
    assert await store.claim(task.id, 2_000.0, 2_300.0) is None

    once = await store.create(new_task(), max_open=5)
    assert await store.claim(once.id, 2_000.0, None) is not None  # a one-off: nothing follows
    ended = await store.get(once.id)
    assert ended is not None and ended.status is TaskStatus.COMPLETED
    assert await store.claim(once.id, 2_000.5, None) is None


async def test_open_tasks_are_limited_per_chat(store: ScheduleStore) -> None:
    for _ in range(3):
        await store.create(new_task(), max_open=3)
    with pytest.raises(TaskLimitReached, match="the most it may have \\(3\\)"):
        await store.create(new_task(), max_open=3)
    first = (await store.for_chat(CHAT))[0]
    await store.set_status(first.id, TaskStatus.CANCELLED, "cancelled")
    await store.create(new_task(), max_open=3)  # a cancelled task no longer counts


async def test_a_fire_moves_on_only_from_where_it_is(store: ScheduleStore) -> None:
    task = await store.create(new_task(), max_open=5)
    fire = await store.claim(task.id, 2_000.0, 2_300.0)
    assert fire is not None

    assert await store.move_fire(fire.id, FireStatus.STARTING, only_from=(FireStatus.CLAIMED,))
    assert not await store.move_fire(fire.id, FireStatus.STARTING, only_from=(FireStatus.CLAIMED,))
    assert await store.move_fire(fire.id, FireStatus.RUNNING, only_from=(FireStatus.STARTING,), run_id="r1")
    assert [f.run_id for f in await store.fires(FireStatus.RUNNING)] == ["r1"]


async def test_cancelling_a_chat_ends_its_open_tasks(store: ScheduleStore, db: Database) -> None:
    await ChatStore(db).ensure(CHAT - 1, "group", "other")
    mine = await store.create(new_task(), max_open=5)
    other = await store.create(new_task(chat_id=CHAT - 1), max_open=5)

    assert await store.cancel_chat(CHAT, "the bot left the chat") == 1

    ended, kept = await store.get(mine.id), await store.get(other.id)
    assert ended is not None and ended.status is TaskStatus.CANCELLED and ended.status_reason == "the bot left the chat"
    assert kept is not None and kept.status is TaskStatus.ACTIVE


async def test_a_tasks_history_keeps_its_latest_ended_fires(store: ScheduleStore) -> None:
    task = await store.create(new_task(), max_open=5)
    for n in range(5):
        fire = await store.claim(task.id, 2_000.0 + n, 3_000.0 + n, skip=None if n == 0 else "missed")
        assert fire is not None

    assert await store.prune_fires(keep_per_task=2) == 2  # the oldest is still pending: it is kept

    kept = await store.history(task.id)
    assert [f.due_at for f in kept] == [2_004.0, 2_003.0, 2_000.0]
