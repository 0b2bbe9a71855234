"""Updates are acknowledged to Telegram only once stored; storage failures retry, bugs are skipped."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from bot.channels.inbound import InboundMessage
from bot.channels.telegram import TelegramChannel
from core.store.messages import MessageStore
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, POLL_TIMEOUT_SECONDS, make_settings, telegram_app


class FlakyHandler:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.handled: list[str] = []
        self.attempts = 0
        self.changed = asyncio.Event()

    async def __call__(self, message: InboundMessage) -> None:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.handled.append(message.text)
        self.changed.set()


async def wait_handled(handler: FlakyHandler, count: int) -> None:
    async with asyncio.timeout(15):
        while len(handler.handled) < count:
            handler.changed.clear()
            await handler.changed.wait()


async def test_storage_failure_is_not_acknowledged_and_is_retried() -> None:
    handler = FlakyHandler([sqlite3.OperationalError("database is locked"), OSError(28, "No space left on device")])
    async with FakeTelegram() as tg:
        channel = TelegramChannel(tg.token, tg.base_url, poll_timeout_seconds=POLL_TIMEOUT_SECONDS)
        await channel.start(handler)
        try:
            tg.push_message(GROUP_ID, "keep me")
            await asyncio.sleep(0.3)
            assert handler.attempts >= 1 and handler.handled == []
            assert len(tg.pending_updates()) == 1  # still owed by Telegram: never acknowledged
            await wait_handled(handler, 1)
            tg.push_message(GROUP_ID, "after it")
            await wait_handled(handler, 2)
            assert handler.handled == ["keep me", "after it"]
            assert handler.attempts == 4
        finally:
            await channel.stop()


async def test_a_bug_on_one_update_does_not_wedge_the_chat() -> None:
    handler = FlakyHandler([ValueError("unexpected shape")])
    async with FakeTelegram() as tg:
        channel = TelegramChannel(tg.token, tg.base_url, poll_timeout_seconds=POLL_TIMEOUT_SECONDS)
        await channel.start(handler)
        try:
            tg.push_message(GROUP_ID, "poison")
            tg.push_message(GROUP_ID, "fine")
            await wait_handled(handler, 1)
            assert handler.handled == ["fine"]
        finally:
            await channel.stop()


async def test_a_locked_database_delays_but_loses_nothing(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings) as app:
            locked = threading.Event()
            release = threading.Event()

            def hold_lock() -> None:
                conn = sqlite3.connect(settings.db_path)
                conn.execute("BEGIN EXCLUSIVE")
                locked.set()
                release.wait(20)
                conn.rollback()
                conn.close()

            holder = threading.Thread(target=hold_lock)
            holder.start()
            try:
                await asyncio.to_thread(locked.wait, 5)
                tg.push_message(GROUP_ID, "written while the database is locked")
                await asyncio.sleep(6.5)  # longer than the store's busy timeout: the first write failed
                assert len(tg.pending_updates()) == 1
            finally:
                release.set()
                await asyncio.to_thread(holder.join)
            store = MessageStore(app.stores.db)
            async with asyncio.timeout(20):
                while True:  # the retry backs off up to seconds: poll the store until it lands
                    if await store.count(GROUP_ID) >= 1:
                        break
                    await asyncio.sleep(0.1)
            assert [m.content for m in await store.recent(GROUP_ID, 5)] == ["written while the database is locked"]
