"""Removed from a group or blocked: the chat's runs stop, what it was owed is given up with the reason
and never retried; added back, the bot answers as before. Real PTB, fake Bot API, real Docker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from core.store.runs import RunRecord, RunStatus, RunStore
from crewbot.app import App
from tests.fakes.telegram_group_events import set_bot_membership
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import until_no_containers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

WAIT_SECONDS = 90.0  # container starts are slow on a loaded 2-core machine


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def runs_of(app: App) -> list[RunRecord]:
    records: list[RunRecord] = await RunStore(app.stores.db).for_chat(GROUP_ID, 20)
    return records


async def start_run(app: App, tg: FakeTelegram, command: str, count: int) -> None:
    tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ {command}")

    async def running() -> bool:
        records = await runs_of(app)
        return len(records) == count and all(r.status == RunStatus.RUNNING for r in records)

    await until(f"{count} running runs", running)


async def owed_rows(app: App) -> list[tuple[str, int, str | None]]:
    async with app.stores.db.conn.execute(
        "SELECT status, attempts, last_error FROM outbox WHERE chat_id = ? ORDER BY id", (GROUP_ID,)
    ) as cursor:
        return [(str(r[0]), int(r[1]), r[2]) for r in await cursor.fetchall()]


async def test_a_kick_stops_the_chats_runs_and_coming_back_restores_service(
    tmp_path: Path, subagent_image: str
) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(GROUP_ID, title="kick")
        settings = make_settings(tmp_path / "data", tg, SUBAGENT_IMAGE=subagent_image)
        async with telegram_app(settings, with_subagents=True) as app:
            await start_run(app, tg, "sleep 120", 1)
            sent_before = len(tg.requests("sendMessage"))
            set_bot_membership(tg, GROUP_ID, "kicked")

            async def cancelled() -> bool:
                return [r.status for r in await runs_of(app)] == [RunStatus.CANCELLED]

            await until("the run cancelled", cancelled)
            (record,) = await runs_of(app)
            assert record.error is not None and "can no longer reach the chat" in record.error
            await until_no_containers(GROUP_ID)

            assert [status for status, _, _ in await owed_rows(app)] == ["sent"]  # the answer that started it
            assert len(tg.requests("sendMessage")) == sent_before  # nothing was tried on the chat since

            set_bot_membership(tg, GROUP_ID, "member")
            tg.push_message(GROUP_ID, f"@{tg.bot_username} are you back?")
            await tg.wait_for_messages(GROUP_ID, 1)


async def test_a_send_refused_with_403_gives_up_the_chat_and_cancels_its_other_runs(
    tmp_path: Path, subagent_image: str
) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(GROUP_ID, title="blocked")
        settings = make_settings(tmp_path / "data", tg, SUBAGENT_IMAGE=subagent_image)
        async with telegram_app(settings, with_subagents=True) as app:
            await start_run(app, tg, "sleep 120", 1)
            await start_run(app, tg, "sleep 4 && echo short-$((40+2))", 2)
            sent_before = len(tg.requests("sendMessage"))
            tg.block_chat(GROUP_ID)  # no update: the bot learns it from the next send

            async def settled() -> bool:
                return sorted(r.status for r in await runs_of(app)) == sorted(
                    [RunStatus.COMPLETED, RunStatus.CANCELLED]
                )

            await until("one run completed and the other cancelled", settled)
            long_run = next(r for r in await runs_of(app) if r.status == RunStatus.CANCELLED)
            assert "sleep 120" in long_run.task
            await until_no_containers(GROUP_ID)
            rows = await owed_rows(app)
            assert [row for row in rows if row[0] == "pending"] == []
            assert all(attempts == 0 for status, attempts, _ in rows if status == "failed"), rows
            # One refused send found it out; nothing after it was tried again or sent.
            refused = len(tg.requests("sendMessage")) - sent_before
            assert 1 <= refused <= 2
            assert not any("short-42" in m.plain_text for m in tg.sent_messages(GROUP_ID))
