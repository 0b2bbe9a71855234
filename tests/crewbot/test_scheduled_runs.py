"""Scheduled tasks end to end: the bot as a real process (`python -m crewbot run`) against the fake Bot API
on a thread, the real engine and image. A one-off due in a few seconds runs as a subagent and its result
arrives once; one that comes due while the bot is SIGKILLed runs once after the restart, and never again."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.crewbot.test_crash_recovery import (
    BotProcess,
    bot_env,
    query,
    remove_containers,
    texts,
    unique_group_ids,
    until,
)
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.docker

SCHEDULED = re.compile(r"Scheduled task ([0-9a-f]{8}) ")
# How far ahead the one-off is set, once the bot polls: its turn must have answered before the time is due.
LEAD_SECONDS = 6
POLLING_WAIT_SECONDS = 60.0  # the bot's start, on a loaded machine


def one_off(lead_seconds: float) -> str:
    """An ISO date-time `lead_seconds` from now, to the second, in UTC (the bot's default zone)."""
    return (datetime.now(UTC) + timedelta(seconds=lead_seconds)).strftime("%Y-%m-%dT%H:%M:%S")


async def schedule_one_off(tg: FakeTelegram, chat_id: int, command: str) -> None:
    """Ask for `command` at LEAD_SECONDS from now, once the bot polls (so its start takes none of the lead)."""
    await tg.wait_for_requests("getUpdates", 1, POLLING_WAIT_SECONDS)
    tg.push_message(chat_id, f"@{tg.bot_username} schedule: {one_off(LEAD_SECONDS)} {command}")


async def scheduled_task_id(tg: FakeTelegram, chat_id: int, bot: BotProcess) -> str:
    def said() -> str | None:
        return next((m[1] for t in texts(tg, chat_id) if (m := SCHEDULED.search(t))), None)

    task_id: str = await until("the task to be scheduled", said, bot, timeout_seconds=60)
    return task_id


def fires(db: Path, task_id: str) -> list[tuple[str, str | None]]:
    return [(r["status"], r["run_id"]) for r in query(db, "SELECT * FROM task_fires WHERE task_id = ?", task_id)]


async def test_a_one_off_due_in_seconds_runs_as_a_subagent_and_its_result_arrives_once(
    tmp_path: Path, subagent_image: str
) -> None:
    (chat_id,) = unique_group_ids(1)
    db = tmp_path / "data" / "crewbot.sqlite3"
    token = f"sched{secrets.token_hex(3)}"
    output = f"{token}-101"  # made by the shell: it appears in the result only, not in the task or its label
    with FakeTelegram() as tg:
        tg.add_chat(chat_id, title="scheduled")
        bot = BotProcess(bot_env(tg, tmp_path / "data", [chat_id], subagent_image), tmp_path)
        try:
            bot.start()
            await schedule_one_off(tg, chat_id, f"$ echo {token}-$((100+1))")
            task_id = await scheduled_task_id(tg, chat_id, bot)

            def result() -> list[str]:
                return [t for t in texts(tg, chat_id) if t.startswith("Crew: [Task:") and output in t]

            await until("the scheduled run's result", result, bot)
            await until(
                "the fire to be settled", lambda: fires(db, task_id) == [("done", fires(db, task_id)[0][1])], bot
            )
            [(_, run_id)] = fires(db, task_id)
            runs = query(db, "SELECT id, turn_id, status FROM subagent_runs")
            sent = texts(tg, chat_id)
        finally:
            await asyncio.to_thread(bot.stop)
            await asyncio.to_thread(remove_containers, [chat_id])
    assert [tuple(r) for r in runs] == [(run_id, f"task-{task_id}", "completed")]
    assert len([t for t in sent if output in t]) == 1, sent
    assert query(db, "SELECT status FROM scheduled_tasks WHERE id = ?", task_id)[0]["status"] == "completed"


async def test_a_task_due_while_the_bot_is_killed_runs_once_after_the_restart(
    tmp_path: Path, subagent_image: str
) -> None:
    (chat_id,) = unique_group_ids(1)
    db = tmp_path / "data" / "crewbot.sqlite3"
    token = f"late{secrets.token_hex(3)}"
    output = f"{token}-101"
    with FakeTelegram() as tg:
        tg.add_chat(chat_id, title="scheduled restart")
        bot = BotProcess(bot_env(tg, tmp_path / "data", [chat_id], subagent_image), tmp_path)
        try:
            bot.start()
            await schedule_one_off(tg, chat_id, f"$ echo {token}-$((100+1))")
            task_id = await scheduled_task_id(tg, chat_id, bot)
            bot.kill()  # before it is due
            [row] = query(db, "SELECT next_due_at FROM scheduled_tasks WHERE id = ?", task_id)
            assert fires(db, task_id) == [], f"the turn outran LEAD_SECONDS ({LEAD_SECONDS} s): the task fired first"
            # The due time passes while no bot runs (well inside SCHEDULE_MISFIRE_GRACE_SECONDS).
            await asyncio.sleep(max(0.0, row["next_due_at"] - time.time()) + 1)
            assert fires(db, task_id) == []

            bot.start()
            await until("the missed run's result", lambda: any(output in t for t in texts(tg, chat_id)), bot)
            await until("the fire to be settled", lambda: [s for s, _ in fires(db, task_id)] == ["done"], bot)
            bot.kill()
            bot.start()  # and once more: the due time is taken, nothing runs again
            await until(
                "the third start's scheduler", lambda: bot.log_path.read_text().count("scheduler_started") == 3, bot
            )
            tg.push_message(chat_id, "/tasks")
            await until("the answer to /tasks", lambda: any("No scheduled tasks" in t for t in texts(tg, chat_id)), bot)
            runs = query(db, "SELECT status FROM subagent_runs")
            sent = texts(tg, chat_id)
        finally:
            await asyncio.to_thread(bot.stop)
            await asyncio.to_thread(remove_containers, [chat_id])
    assert [r["status"] for r in runs] == ["completed"]
    assert len([t for t in sent if output in t]) == 1, sent
    assert [s for s, _ in fires(db, task_id)] == ["done"]
