"""Run records: statuses only move forward and racing outcomes are recorded once."""

from __future__ import annotations

import asyncio

import pytest

from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.outbox import OutboxStore, Outgoing
from core.store.runs import DuplicateRun, RunStatus, RunStore

CHAT = -500


@pytest.fixture
async def runs(db: Database) -> RunStore:
    await ChatStore(db).ensure(CHAT, "group", "runs")
    return RunStore(db)


async def queued(runs: RunStore, run_id: str) -> None:
    await runs.create(
        run_id, chat_id=CHAT, turn_id=None, task="task", label="label", include_context=False, status=RunStatus.QUEUED
    )


async def test_duplicate_run_id_is_refused(runs: RunStore) -> None:
    await queued(runs, "run-aaaaaa")
    with pytest.raises(DuplicateRun):
        await queued(runs, "run-aaaaaa")


async def test_statuses_only_move_forward(runs: RunStore) -> None:
    await queued(runs, "run-bbbbbb")
    assert await runs.mark_running("run-bbbbbb", None)
    assert not await runs.mark_running("run-bbbbbb", None)  # running never goes back to running
    assert await runs.finish("run-bbbbbb", "completed", result="ok")
    assert not await runs.finish("run-bbbbbb", "failed", error="late")
    assert not await runs.mark_running("run-bbbbbb", None)
    record = await runs.get("run-bbbbbb")
    assert record is not None and record.status == "completed" and record.error is None
    with pytest.raises(ValueError):
        await runs.finish("run-bbbbbb", "running")


async def test_cancel_racing_completion_records_one_outcome_and_one_message(
    db: Database, runs: RunStore, messages: MessageStore
) -> None:
    for n in range(30):
        run_id = f"race-{n:04d}"
        await queued(runs, run_id)
        await runs.mark_running(run_id, None)
        message = NewMessage(
            chat_id=CHAT, sender_name="[Subagent]", content=f"[Task: label]\n{n}", is_bot=True, kind="subagent"
        )
        outgoing = Outgoing(message=message, text=f"Crew: {message.content}")
        completed, cancelled = await asyncio.gather(
            runs.finish(run_id, "completed", result=str(n), outgoing=outgoing),
            runs.finish(run_id, "cancelled", error="cancelled: merge"),
        )
        assert completed != cancelled
        record = await runs.get(run_id)
        assert record is not None
        assert record.status == ("completed" if completed else "cancelled")
    stored = [m for m in await messages.recent(CHAT, 100) if m.kind == "subagent"]
    completed_runs = [r for r in await runs.for_chat(CHAT, 100) if r.status == "completed"]
    assert len(stored) == len(completed_runs)
    assert len(await OutboxStore(db).pending(CHAT)) == len(completed_runs)  # each owed once, no more


async def test_usage_accumulates_and_sessions_are_per_chat(runs: RunStore) -> None:
    await queued(runs, "run-cccccc")
    await runs.record_usage("run-cccccc", 10, 5, 1)
    await runs.record_usage("run-cccccc", 7, 3, 1)
    record = await runs.get("run-cccccc")
    assert record is not None and (record.input_tokens, record.output_tokens, record.llm_requests) == (17, 8, 2)
    assert await runs.current_session(CHAT) is None
    await runs.set_session(CHAT, "run-cccccc")
    await runs.set_session(CHAT, "run-dddddd")
    assert await runs.current_session(CHAT) == "run-dddddd"
    assert await runs.remember_ipc_message("msg-000001", CHAT)
    assert not await runs.remember_ipc_message("msg-000001", CHAT)
