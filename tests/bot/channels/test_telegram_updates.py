"""Odd updates through real PTB and the fake Bot API, each stored exactly as often as it should be."""

from __future__ import annotations

from pathlib import Path

from crewbot.app import App
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_state import JsonDict
from tests.harness import GROUP_ID, make_settings, telegram_app


async def user_messages(app: App, chat_id: int) -> list[tuple[str, str]]:
    async with app.stores.db.conn.execute(
        "SELECT kind, content FROM messages WHERE chat_id = ? AND is_bot = 0 ORDER BY id", (chat_id,)
    ) as cursor:
        return [(str(row[0]), str(row[1])) for row in await cursor.fetchall()]


async def handled_up_to_here(tg: FakeTelegram, chat_id: int, answers_before: int = 0) -> None:
    """A mention behind everything pushed so far: once it is answered, every earlier update was handled."""
    tg.push_message(chat_id, f"@{tg.bot_username} ping")
    await tg.wait_for_messages(chat_id, answers_before + 1)


async def test_a_redelivered_edit_is_stored_once(tmp_path: Path) -> None:
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg)) as app:
        first = tg.push_message(GROUP_ID, "original text")
        message_id = first["message"]["message_id"]
        edit = tg.push_edited_message(GROUP_ID, message_id, "edited text")
        tg.push_raw_update({"edited_message": edit["edited_message"]})  # the same edit again
        tg.push_edited_message(GROUP_ID, message_id, "edited again")  # a new edit: stored
        await handled_up_to_here(tg, GROUP_ID)

        assert await user_messages(app, GROUP_ID) == [
            ("text", "original text"),
            ("edit", "[edited] edited text"),
            ("edit", "[edited] edited again"),
            ("text", f"@{tg.bot_username} ping"),
        ]


async def test_a_lone_surrogate_in_a_sender_name_or_chat_title_does_not_drop_the_message(tmp_path: Path) -> None:
    odd_group = GROUP_ID - 7
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=f"{GROUP_ID},{odd_group}")
        async with telegram_app(settings) as app:
            # The fake serialises with json.dumps: the names reach PTB as the escape "\ud800".
            tg.push_message(GROUP_ID, "hello from Eve", user_id=2002, first_name="Eve \ud800")
            tg.push_message(odd_group, "hello in a titled group", chat_title="Team \udfff")
            await handled_up_to_here(tg, odd_group)
            await handled_up_to_here(tg, GROUP_ID)

            async with app.stores.db.conn.execute(
                "SELECT sender_name FROM messages WHERE chat_id = ? AND content = 'hello from Eve'", (GROUP_ID,)
            ) as cursor:
                assert [row[0] for row in await cursor.fetchall()] == ["Eve \ufffd"]
            assert ("text", "hello in a titled group") in await user_messages(app, odd_group)
            chat = await app.stores.chats.get(odd_group)
            assert chat is not None and chat.title == "Team \ufffd"


GROUP_ANONYMOUS_BOT = {"id": 1087968824, "is_bot": True, "first_name": "Group", "username": "GroupAnonymousBot"}
CHANNEL_BOT = {"id": 136817688, "is_bot": True, "first_name": "Channel", "username": "Channel_Bot"}


def command_as_chat(message_id: int, text: str, sender: JsonDict, sender_chat: JsonDict) -> JsonDict:
    """A command posted on behalf of a chat: `from` is Telegram's placeholder bot, `sender_chat` the chat."""
    chat = {"id": GROUP_ID, "type": "group", "title": "Test group"}
    command_length = len(text.split()[0])
    return {
        "message": {
            "message_id": message_id,
            "date": 1_700_000_000,
            "chat": chat,
            "from": sender,
            "sender_chat": sender_chat,
            "text": text,
            "entities": [{"type": "bot_command", "offset": 0, "length": command_length}],
        }
    }


async def test_an_anonymous_group_admin_may_stop_and_cancel(tmp_path: Path) -> None:
    group = {"id": GROUP_ID, "type": "group", "title": "Test group"}
    channel = {"id": -1009876543210, "type": "channel", "title": "Some channel"}
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg)):
        tg.push_raw_update(command_as_chat(900, "/stop", GROUP_ANONYMOUS_BOT, group))
        tg.push_raw_update(command_as_chat(901, "/cancel all", GROUP_ANONYMOUS_BOT, group))
        # Posted as another chat (a channel) is not the group's admin speaking: still refused.
        tg.push_raw_update(command_as_chat(902, "/stop", CHANNEL_BOT, channel))
        sent = await tg.wait_for_messages(GROUP_ID, 3)

        assert [m.plain_text for m in sent] == [
            "Crew: Nothing to stop.",
            "Crew: Subagents are not enabled.",  # said after the admin check passed
            "Crew: Only chat admins can use /stop.",
        ]
