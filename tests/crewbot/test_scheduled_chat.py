"""Scheduled tasks as a chat sees them, with the real app, real PTB against the fake Bot API and the offline
model: asked for in words, listed by /tasks, paused and cancelled by whom may; a message task answered by
the main agent; leaving the chat ends its tasks."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from core.store.schedules import FireStatus, ScheduleStore, TaskMode, TaskStatus
from tests.fakes.telegram_group_events import set_bot_membership
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

WAIT_SECONDS = 10.0

ALICE = 1001  # the fake's default user
BOB = 2002
TASK_ID = re.compile(r"Scheduled task ([0-9a-f]{8}) ")


async def test_ask_list_pause_and_cancel_a_task_in_the_chat(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, TIMEZONE="Europe/Berlin")
        async with telegram_app(settings):
            tg.push_message(GROUP_ID, f"@{tg.bot_username} schedule: 0 9 * * 1 $ echo monday report")
            said = (await tg.wait_for_messages(GROUP_ID, 1))[-1].plain_text
            match = TASK_ID.search(said)
            assert match is not None, said
            task_id = match[1]
            assert "cron 0 9 * * 1 (09:00 on mon); next due " in said and "09:00 Europe/Berlin" in said

            tg.push_message(GROUP_ID, "/tasks")
            listed = (await tg.wait_for_messages(GROUP_ID, 2))[-1].plain_text
            assert f"{task_id} echo monday report · cron 0 9 * * 1 (09:00 on mon) · next " in listed
            assert "last: not run yet" in listed

            tg.push_message(GROUP_ID, f"/tasks pause {task_id}", user_id=BOB, first_name="Bob")
            refused = (await tg.wait_for_messages(GROUP_ID, 3))[-1].plain_text
            assert f"Only the task's creator or a chat admin can pause task {task_id}." in refused

            tg.push_message(GROUP_ID, f"/tasks pause {task_id}")
            assert f"Paused scheduled task {task_id}" in (await tg.wait_for_messages(GROUP_ID, 4))[-1].plain_text
            tg.push_message(GROUP_ID, "/tasks")
            assert "PAUSED" in (await tg.wait_for_messages(GROUP_ID, 5))[-1].plain_text

            tg.push_message(GROUP_ID, f"/tasks cancel {task_id}")
            assert f"Cancelled scheduled task {task_id}" in (await tg.wait_for_messages(GROUP_ID, 6))[-1].plain_text
            tg.push_message(GROUP_ID, "/tasks")
            assert "No scheduled tasks in this chat" in (await tg.wait_for_messages(GROUP_ID, 7))[-1].plain_text
            tg.push_message(GROUP_ID, f"/tasks {task_id}")
            shown = (await tg.wait_for_messages(GROUP_ID, 8))[-1].plain_text
            assert f"{task_id} echo monday report · cron 0 9 * * 1 (09:00 on mon) · cancelled · next " in shown
            assert shown.endswith("Not due yet.")


async def test_a_bad_schedule_is_refused_with_its_reason(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings):
            tg.push_message(GROUP_ID, f"@{tg.bot_username} schedule: every 1m $ date")
            said = (await tg.wait_for_messages(GROUP_ID, 1))[-1].plain_text
    assert "Not scheduled: every 1m is shorter than the minimum interval of 300 seconds." in said


async def test_the_chat_sets_its_time_zone_and_a_bad_one_is_named(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, ADMIN_USER_IDS=str(ALICE))
        async with telegram_app(settings):
            tg.push_message(GROUP_ID, "/timezone Mars/Base")
            assert "Unknown time zone 'Mars/Base'" in (await tg.wait_for_messages(GROUP_ID, 1))[-1].plain_text
            tg.push_message(GROUP_ID, "/timezone Asia/Tokyo")
            assert "now Asia/Tokyo" in (await tg.wait_for_messages(GROUP_ID, 2))[-1].plain_text
            tg.push_message(GROUP_ID, "/timezone", user_id=BOB)
            assert "read in Asia/Tokyo" in (await tg.wait_for_messages(GROUP_ID, 3))[-1].plain_text


async def test_removing_the_bot_from_the_chat_cancels_its_tasks(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings) as app:
            tg.push_message(GROUP_ID, f"@{tg.bot_username} schedule: every 1h $ date")
            await tg.wait_for_messages(GROUP_ID, 1)
            store = ScheduleStore(app.stores.db)
            [task] = await store.for_chat(GROUP_ID)

            set_bot_membership(tg, GROUP_ID, "kicked", chat_type="group")
            async with asyncio.timeout(WAIT_SECONDS):
                while True:
                    current = await store.get(task.id)
                    if current is not None and current.status is TaskStatus.CANCELLED:
                        break
                    await asyncio.sleep(0.05)
    assert current.status_reason is not None and "can no longer reach the chat" in current.status_reason


async def test_a_message_task_has_the_main_agent_answer_it_in_the_chat_when_due(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings) as app:
            tg.add_chat(GROUP_ID, title="group")
            await app.stores.chats.ensure(GROUP_ID, "group", "group")
            due = datetime.now(UTC) + timedelta(seconds=1)
            task = await app.schedules.book.schedule(
                GROUP_ID, ALICE, "time to stand up", due.isoformat(), mode=TaskMode.MESSAGE
            )
            said = (await tg.wait_for_messages(GROUP_ID, 1))[-1].plain_text
            [fire] = await app.schedules.store.history(task.id)
    assert f"[Scheduled task {task.id}] wrote: “time to stand up”" in said
    assert fire.status is FireStatus.DONE
