"""An update PTB cannot read is logged with its id, acknowledged and skipped; the updates around it are
answered, and polling goes on, also after a restart (no poison pill)."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.channels.polling import UNREADABLE_KEY, ReadableUpdatesRequest
from core.store.messages import MessageStore
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_state import JsonDict
from tests.harness import GROUP_ID, make_settings, telegram_app

OTHER_GROUP_ID = -1002  # a second allowed chat: its turn runs on its own, so each good message gets a reply


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("answered")])


def poisoned_message(tg: FakeTelegram, chat_id: int) -> JsonDict:
    """A text message whose `entities` is no list: PTB's Update.de_json raises AttributeError on it."""
    return {
        "message_id": 900,
        "from": {"id": 1001, "is_bot": False, "first_name": "Mallory"},
        "chat": tg.add_chat(chat_id),
        "date": 1_700_000_000,
        "text": f"@{tg.bot_username} poisoned",
        "entities": "oops",
    }


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


async def test_an_unreadable_update_between_two_good_ones(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=f"{GROUP_ID},{OTHER_GROUP_ID}")
        # Waiting before the bot starts: its first getUpdates gets all three in one batch.
        tg.push_message(GROUP_ID, f"@{tg.bot_username} first")
        poisoned = tg.push_raw_update({"message": poisoned_message(tg, GROUP_ID)})
        tg.push_message(OTHER_GROUP_ID, f"@{tg.bot_username} second")
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings, model=FunctionModel(answer)) as app:
                [first] = await tg.wait_for_messages(GROUP_ID, 1)
                [second] = await tg.wait_for_messages(OTHER_GROUP_ID, 1)
                assert first.plain_text == second.plain_text == "Crew: answered"
                # Acknowledged: the next getUpdates asked past it, so Telegram will not deliver it again.
                await tg.wait_until(lambda: True if not tg.pending_updates() else None)

                stored = [m.content for m in await MessageStore(app.stores.db).recent(GROUP_ID, 10)]
                assert stored == [f"@{tg.bot_username} first", "answered"]

        [unreadable] = events(logs, "update_unreadable")
        assert unreadable["update_id"] == poisoned["update_id"]
        assert unreadable["error_type"] == "AttributeError"
        assert unreadable["kinds"] == ["message"]
        assert "poisoned" not in str(unreadable)  # what the update said is the chat's, not the log's
        assert not events(logs, "polling_stopped")

        # A restart meets nothing of it, and answers as before.
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings, model=FunctionModel(answer)):
                tg.push_message(GROUP_ID, f"@{tg.bot_username} after the restart")
                await tg.wait_for_messages(GROUP_ID, 2)
        assert not events(logs, "update_unreadable")


def reply(*updates: object) -> bytes:
    return json.dumps({"ok": True, "result": list(updates)}).encode()


def test_the_transport_stands_in_for_what_ptb_cannot_read() -> None:
    good = {"update_id": 7, "message": {"message_id": 1, "date": 1, "chat": {"id": 1, "type": "private"}}}
    newer = {"update_id": 8, "some_future_kind": {"x": 1}}  # unknown kinds parse (PTB keeps them aside)
    bad = {"update_id": 9, "edited_message": {"message_id": "x", "chat": "nope"}}

    parsed = ReadableUpdatesRequest.parse_json_payload(reply(good, newer, bad, {"no": "id"}, "not an object"))

    [kept_good, kept_newer, stand_in] = parsed["result"]
    assert kept_good == good and kept_newer == newer
    assert stand_in["update_id"] == 9
    assert stand_in[UNREADABLE_KEY]["kinds"] == ["edited_message"]
    # Errors and other answers pass as they are.
    assert ReadableUpdatesRequest.parse_json_payload(b'{"ok": false, "error_code": 409}') == {
        "ok": False,
        "error_code": 409,
    }
