"""End to end through the real PTB Application and the fake Telegram Bot API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.offline import prompt_text
from bot.channels.formatting import utf16_len
from core.store.messages import MessageStore
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app


class RecordingModel:
    """A FunctionModel whose prompts we keep, answering with a fixed or computed text."""

    def __init__(self, reply: str = "ok") -> None:
        self.prompts: list[str] = []
        self.reply = reply

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.prompts.append(prompt_text(messages))
        return ModelResponse(parts=[TextPart(self.reply)])

    def model(self) -> FunctionModel:
        return FunctionModel(self)


async def test_mention_gets_reply_and_unmentioned_message_is_context(tmp_path: Path) -> None:
    recorder = RecordingModel("Hello from the model")
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings, model=recorder.model()) as app:
            tg.push_message(GROUP_ID, "just chatting about the deploy window", first_name="Bob", user_id=2002)
            tg.push_message(GROUP_ID, f"@{tg.bot_username} what did Bob say?", first_name="Alice")
            sent = await tg.wait_for_messages(GROUP_ID, 1)
            assert sent[0].plain_text == "Crew: Hello from the model"
            # The unmentioned message did not trigger a turn but is in the prompt of the one that ran.
            assert len(recorder.prompts) == 1
            assert "Bob: just chatting about the deploy window" in recorder.prompts[0]
            assert "Alice:" in recorder.prompts[0]
            stored = await MessageStore(app.stores.db).recent(GROUP_ID, 10)
            assert [m.is_trigger for m in stored] == [False, True, False]
            assert stored[-1].is_bot and stored[-1].content == "Hello from the model"

            # The bot's own reply is in the next turn's prompt, and a reply to the bot triggers.
            tg.push_message(GROUP_ID, "thanks!", reply_to_message_id=sent[0].message_id)
            await tg.wait_for_messages(GROUP_ID, 2)
            assert "Crew (you): Hello from the model" in recorder.prompts[1]


async def test_chat_outside_allow_list_gets_nothing_but_start_gets_its_id(tmp_path: Path) -> None:
    recorder = RecordingModel()
    stranger = -2002
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings, model=recorder.model()) as app:
            tg.push_message(stranger, f"@{tg.bot_username} hello?")
            tg.push_message(stranger, "/start")
            replies = await tg.wait_for_messages(stranger, 1)
            assert str(stranger) in replies[0].plain_text and "ALLOWED_CHAT_IDS" in replies[0].plain_text
            # Then a message in an allowed chat proves the earlier updates were all processed.
            tg.push_message(GROUP_ID, f"@{tg.bot_username} ping")
            await tg.wait_for_messages(GROUP_ID, 1)
            assert len(tg.sent_messages(stranger)) == 1
            assert recorder.prompts and all("hello?" not in p for p in recorder.prompts)
            assert await MessageStore(app.stores.db).count(stranger) == 0


async def test_long_reply_is_split_into_messages_that_fit(tmp_path: Path) -> None:
    body = "\n".join(f"line {i}: " + "lorem ipsum dolor sit amet " * 3 for i in range(120))
    long_reply = f"Here you go:\n```text\n{body}\n```\nDone."
    assert len(long_reply) > 10_000
    recorder = RecordingModel(long_reply)
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings, model=recorder.model()):
            tg.push_message(GROUP_ID, f"@{tg.bot_username} dump it")
            await tg.wait_until(
                lambda: (
                    tg.sent_messages(GROUP_ID)
                    if any("Done." in m.plain_text for m in tg.sent_messages(GROUP_ID))
                    else None
                )
            )
            sent = tg.sent_messages(GROUP_ID)
            assert len(sent) >= 3
            assert all(utf16_len(m.text) <= 4096 for m in sent)
            assert all(m.parse_mode == "HTML" for m in sent)  # code blocks stayed balanced in every part
            joined = "\n".join(m.plain_text for m in sent)
            for i in (0, 59, 119):
                assert f"line {i}: " in joined


async def test_private_chat_every_message_triggers(tmp_path: Path) -> None:
    recorder = RecordingModel("hi")
    user_chat = 4242
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=f"{GROUP_ID},{user_chat}")
        async with telegram_app(settings, model=recorder.model()):
            tg.push_message(user_chat, "no mention needed here")
            sent = await tg.wait_for_messages(user_chat, 1)
            assert sent[0].plain_text == "Crew: hi"


async def test_media_edits_and_service_messages_do_not_crash(tmp_path: Path) -> None:
    recorder = RecordingModel("still here")
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings, model=recorder.model()) as app:
            first = tg.push_message(GROUP_ID, "original text")
            message_id = first["message"]["message_id"]
            tg.push_edited_message(GROUP_ID, message_id, "edited text")
            chat = {"id": GROUP_ID, "type": "supergroup", "title": "g"}
            user = {"id": 1001, "is_bot": False, "first_name": "Alice"}
            tg.push_raw_update(
                {
                    "message": {
                        "message_id": 900,
                        "date": 1,
                        "chat": chat,
                        "from": user,
                        "photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}],
                    }
                }
            )
            tg.push_raw_update(
                {"message": {"message_id": 901, "date": 1, "chat": chat, "from": user, "new_chat_members": [user]}}
            )
            tg.push_message(GROUP_ID, f"@{tg.bot_username} are you alive?")
            await tg.wait_for_messages(GROUP_ID, 1)
            stored = await MessageStore(app.stores.db).recent(GROUP_ID, 10)
            assert [m.content for m in stored[:3]] == ["original text", "[edited] edited text", ""]
            photo = stored[2].file  # a photo is a file kept by reference, its caption (none) the content
            assert photo is not None and (photo.kind, photo.file_id, photo.size_bytes) == ("photo", "f", None)
            assert "[edited] edited text" in recorder.prompts[0]
            assert f"[file {photo.ref}: photo_900.jpg, image/jpeg, size unknown]" in recorder.prompts[0]


async def test_per_chat_order_holds_with_twenty_chats_at_once(tmp_path: Path) -> None:
    chats = [GROUP_ID - i for i in range(20)]

    def echo_latest(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = prompt_text(messages)
        latest = prompt.rsplit("Latest message, from ", 1)[1].split(":\n", 1)[1].split("\n", 1)[0]
        return ModelResponse(parts=[TextPart(f"answer to {latest}")])

    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=",".join(map(str, chats)))
        async with telegram_app(settings, model=FunctionModel(echo_latest)) as app:
            for n in range(3):
                for chat_id in chats:
                    tg.push_message(chat_id, f"@{tg.bot_username} m{n}")

            async def answered_last(chat_id: int) -> None:
                def done() -> bool | None:
                    return any("m2" in m.plain_text for m in tg.sent_messages(chat_id)) or None

                await tg.wait_until(done, timeout_seconds=20)

            await asyncio.gather(*(answered_last(c) for c in chats))
            store = MessageStore(app.stores.db)
            for chat_id in chats:
                stored = [m.content for m in await store.recent(chat_id, 20) if not m.is_bot]
                assert stored == [f"@{tg.bot_username} m{n}" for n in range(3)]
                answered = [int(m.plain_text.rsplit("m", 1)[1]) for m in tg.sent_messages(chat_id)]
                assert answered == sorted(answered) and answered[-1] == 2


async def test_rejected_formatting_falls_back_to_plain_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever the converter produces, Telegram may still refuse it: the reply must go out as plain text.
    monkeypatch.setattr("bot.channels.telegram_stream.markdown_to_telegram_html", lambda text: f"<b>{text}")
    recorder = RecordingModel("**bold** claim & more")
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings, model=recorder.model()):
            tg.push_message(GROUP_ID, f"@{tg.bot_username} format this")
            sent = await tg.wait_for_messages(GROUP_ID, 1)
            assert sent[0].parse_mode is None
            assert sent[0].text == "Crew: **bold** claim & more"
