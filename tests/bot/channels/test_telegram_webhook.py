"""Webhook mode's listener, with real PTB, SQLite and the fake Bot API: updates POSTed as Telegram sends them
are stored before the 200, a redelivered one is stored once, a storage failure is a 500 (Telegram delivers it
again), and every kind of bad request gets its 4xx, stores nothing and is logged once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.channels.webhook import MAX_BODY_BYTES
from core.store.messages import MessageStore, NewMessage
from tests.bot.channels.webhook_helpers import (
    SECRET,
    SECRET_HEADER,
    listener_url,
    message_update,
    post,
    webhook_settings,
)
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, telegram_app

TEN_MB = 10 * 1024 * 1024


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("answered")])


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


async def stored(app: Any, chat_id: int = GROUP_ID) -> list[str]:
    return [m.content for m in await MessageStore(app.stores.db).recent(chat_id, 50) if not m.is_bot]


async def test_an_update_posted_is_stored_answered_200_and_replied_to(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        async with telegram_app(settings, model=FunctionModel(answer)) as app, aiohttp.ClientSession() as http:
            update = message_update(tg, GROUP_ID, f"@{tg.bot_username} hello over the webhook")

            assert await post(http, settings, update) == (200, "ok\n")

            assert await stored(app) == [f"@{tg.bot_username} hello over the webhook"]
            [reply] = await tg.wait_for_messages(GROUP_ID, 1)
            assert reply.plain_text == "Crew: answered"
            assert tg.call_count("getUpdates") == 0 and tg.call_count("deleteWebhook") == 0


async def test_the_200_comes_only_once_the_update_is_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    add = MessageStore.add

    async def held_add(self: MessageStore, message: NewMessage) -> int | None:
        if "held" in message.content:
            entered.set()
            await release.wait()
        return await add(self, message)

    monkeypatch.setattr(MessageStore, "add", held_add)
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
            posting = asyncio.create_task(post(http, settings, message_update(tg, GROUP_ID, "held in the store")))
            await asyncio.wait_for(entered.wait(), 5)
            await asyncio.sleep(0.3)
            assert not posting.done()  # the store is held: no answer yet, so Telegram would deliver it again

            release.set()
            assert await asyncio.wait_for(posting, 5) == (200, "ok\n")
            assert await stored(app) == ["held in the store"]  # there when the 200 arrived


async def test_a_redelivered_update_is_stored_once_also_after_a_restart(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        update = message_update(tg, GROUP_ID, "said once")
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
                assert (await post(http, settings, update))[0] == 200
                assert (await post(http, settings, update))[0] == 200  # our 200 was lost: Telegram sends it again
                assert await stored(app) == ["said once"]
        assert [e["update_id"] for e in events(logs, "update_redelivered")] == [update["update_id"]]

        # After a restart the recent ids are gone; the store still knows the message.
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
                assert (await post(http, settings, update))[0] == 200
                assert await stored(app) == ["said once"]
        assert events(logs, "duplicate_message_ignored")


async def test_a_storage_failure_is_a_500_and_the_redelivery_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add = MessageStore.add
    failures = [sqlite3.OperationalError("database is locked")]

    async def failing_add(self: MessageStore, message: NewMessage) -> int | None:
        if failures:
            raise failures.pop()
        return await add(self, message)

    monkeypatch.setattr(MessageStore, "add", failing_add)
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
            update = message_update(tg, GROUP_ID, "stored the second time")
            with structlog.testing.capture_logs() as logs:
                assert (await post(http, settings, update))[0] == 500
            [not_stored] = events(logs, "update_not_stored")
            assert not_stored["update_id"] == update["update_id"] and "locked" in not_stored["error"]
            assert await stored(app) == []

            assert (await post(http, settings, update))[0] == 200  # Telegram's next attempt
            assert await stored(app) == ["stored the second time"]


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_bad_requests_get_their_4xx_store_nothing_and_are_logged_once_per_kind(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
                update = message_update(tg, GROUP_ID, "never stored")
                body = json.dumps(update).encode()
                url = listener_url(settings)
                json_type = {"Content-Type": "application/json"}
                assert (await post(http, settings, update, secret=None))[0] == 403
                assert (await post(http, settings, update, secret="wrong-secret_0123456789"))[0] == 403
                assert (await post(http, settings, update, secret=SECRET + "x"))[0] == 403
                assert (await post(http, settings, update, secret="ünïcode"))[0] == 403
                assert (await post(http, settings, b" " * TEN_MB, secret=None))[0] == 403  # not read at all
                assert (await post(http, settings, b" " * TEN_MB))[0] == 413
                assert (await post(http, settings, b" " * (MAX_BODY_BYTES + 1)))[0] == 413
                assert (await post(http, settings, b'{"update_id": 5, "message": '))[0] == 400
                assert (await post(http, settings, b"\xff\xfe not even text"))[0] == 400
                assert (await post(http, settings, b"[1, 2]"))[0] == 400
                assert (await post(http, settings, b'{"update_id": "5"}'))[0] == 400
                assert (await post(http, settings, b'{"update_id": true}'))[0] == 400
                assert (await post(http, settings, b"[" * 100_000 + b"]" * 100_000))[0] == 400  # too deep
                assert (await post(http, settings, update, path="/other"))[0] == 404
                async with http.get(url, headers={SECRET_HEADER: SECRET}) as response:
                    assert response.status == 405
                chunked = {SECRET_HEADER: SECRET, **json_type}
                async with http.post(url, data=chunks(body), headers=chunked) as response:
                    assert response.status == 411  # no Content-Length: chunked

                assert await stored(app) == []
                assert (await post(http, settings, update))[0] == 200  # the listener is none the worse
                assert await stored(app) == ["never stored"]

        rejected = events(logs, "webhook_request_rejected")
        assert [(e["kind"], e["status"]) for e in rejected] == [
            ("no_secret", 403),
            ("wrong_secret", 403),
            ("too_large", 413),
            ("invalid_json", 400),
            ("not_an_update", 400),
            ("wrong_path", 404),
            ("wrong_method", 405),
            ("no_length", 411),
        ]
        [counts] = events(logs, "webhook_requests_rejected")
        assert counts["counts"] == {
            "no_secret": 2,
            "wrong_secret": 3,
            "too_large": 2,
            "invalid_json": 3,
            "not_an_update": 3,
            "wrong_path": 1,
            "wrong_method": 1,
            "no_length": 1,
        }
        assert SECRET not in str(logs)


async def test_an_update_ptb_cannot_read_is_logged_and_acknowledged(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        update = message_update(tg, GROUP_ID, f"@{tg.bot_username} poisoned")
        update["message"]["entities"] = "oops"  # PTB's Update.de_json raises AttributeError on it
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
                # 200: from Telegram (it has the secret), which would otherwise deliver it again for a day,
                # holding the chat's later updates back.
                assert (await post(http, settings, update))[0] == 200
                assert await stored(app) == []
                assert (await post(http, settings, message_update(tg, GROUP_ID, "next")))[0] == 200
                assert await stored(app) == ["next"]
        [unreadable] = events(logs, "update_unreadable")
        assert unreadable["update_id"] == update["update_id"] and unreadable["kinds"] == ["message"]
        assert "poisoned" not in str(unreadable)


async def test_a_bug_in_handling_one_update_is_logged_and_does_not_wedge_its_chat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add = MessageStore.add

    async def buggy_add(self: MessageStore, message: NewMessage) -> int | None:
        if message.content == "odd":
            raise KeyError("a bug")
        return await add(self, message)

    monkeypatch.setattr(MessageStore, "add", buggy_add)
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
                odd = message_update(tg, GROUP_ID, "odd")
                assert (await post(http, settings, odd))[0] == 200  # as polling: logged, acknowledged
                assert (await post(http, settings, message_update(tg, GROUP_ID, "fine")))[0] == 200
                assert await stored(app) == ["fine"]
        [failed] = events(logs, "update_handler_failed")
        assert failed["update_id"] == odd["update_id"]
