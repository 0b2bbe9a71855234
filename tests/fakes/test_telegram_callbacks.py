"""Buttons on the fake Bot API, driven by the real python-telegram-bot: inline keyboards checked and kept
(sendMessage, editMessageText, editMessageReplyMarkup), presses delivered as callback_query updates, each
answered once."""

from __future__ import annotations

import secrets

import pytest
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup
from telegram.error import BadRequest

from tests.fakes.telegram_server import FakeTelegram

GROUP = -1_001_555_000_222
MEMBER = 4242


def bot_for(tg: FakeTelegram) -> Bot:
    return Bot(tg.token, base_url=tg.base_url)


def keyboard(*data: str) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup([[InlineKeyboardButton(f"button {d}", callback_data=d)] for d in data])


async def test_a_press_arrives_as_a_callback_query_and_is_answered_once() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        sent = await bot.send_message(GROUP, "card", reply_markup=keyboard("c:run1"))
        assert [b["callback_data"] for b in tg.buttons(GROUP, sent.message_id)] == ["c:run1"]
        [record] = tg.sent_messages(GROUP)
        assert record.reply_markup["inline_keyboard"][0][0]["callback_data"] == "c:run1"

        query_id = tg.push_callback_query(GROUP, sent.message_id, "c:run1", user_id=MEMBER, first_name="Bo")

        [update] = await bot.get_updates(timeout=1)
        query = update.callback_query
        assert query is not None and query.id == query_id
        assert query.data == "c:run1" and query.from_user.id == MEMBER and query.from_user.first_name == "Bo"
        assert query.message is not None and query.message.chat.id == GROUP
        assert query.message.message_id == sent.message_id
        assert [q.query_id for q in tg.unanswered_queries()] == [query_id]

        assert await bot.answer_callback_query(query_id, "Only Alice can", show_alert=True)
        answer = await tg.wait_for_answer(query_id)
        assert (answer.text, answer.show_alert) == ("Only Alice can", True)
        assert tg.unanswered_queries() == []
        with pytest.raises(BadRequest, match=r"(?i)query is too old"):
            await bot.answer_callback_query(query_id)  # Telegram takes one answer per query
        with pytest.raises(BadRequest, match=r"(?i)query is too old"):
            await bot.answer_callback_query("12345")  # never asked
        other = tg.push_callback_query(GROUP, sent.message_id, "c:run1")
        with pytest.raises(BadRequest, match=r"(?i)message_too_long"):
            await bot.answer_callback_query(other, "x" * 201)
        assert tg.callback_answers(other) == []


async def test_forged_and_old_presses_carry_what_telegram_would() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        sent = await bot.send_message(GROUP, "card")
        tg.push_callback_query(GROUP, sent.message_id, secrets.token_bytes(64))
        tg.push_callback_query(GROUP, sent.message_id, "c:x", inaccessible=True)
        tg.push_callback_query(GROUP, 999, "c:y")  # a message the fake never had: inaccessible too

        forged, old, unknown = [u.callback_query for u in await bot.get_updates(timeout=1)]
        assert forged is not None and forged.data is not None and len(forged.data) >= 32
        for query in (old, unknown):
            assert query is not None and query.message is not None
            assert query.message.chat.id == GROUP and not query.message.is_accessible
        with pytest.raises(ValueError, match="no chat"):
            tg.push_callback_query(-5, 1, "c:x")


async def test_keyboards_are_checked_kept_and_taken_away_by_edits() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        with pytest.raises(BadRequest, match=r"(?i)button_data_invalid"):
            await bot.send_message(GROUP, "card", reply_markup=keyboard("x" * 65))
        with pytest.raises(BadRequest, match=r"(?i)button_data_invalid"):
            await bot.send_message(GROUP, "card", reply_markup=keyboard("é" * 33))  # 66 bytes
        sent = await bot.send_message(GROUP, "card", reply_markup=keyboard("a", "b"))

        await bot.edit_message_text("card 2", chat_id=GROUP, message_id=sent.message_id, reply_markup=keyboard("a"))
        assert [b["callback_data"] for b in tg.buttons(GROUP, sent.message_id)] == ["a"]
        await bot.edit_message_text("card 3", chat_id=GROUP, message_id=sent.message_id)
        assert tg.buttons(GROUP, sent.message_id) == []  # an edit without a keyboard takes the buttons away

        await bot.edit_message_reply_markup(GROUP, sent.message_id, reply_markup=keyboard("z"))
        assert [b["callback_data"] for b in tg.buttons(GROUP, sent.message_id)] == ["z"]
        with pytest.raises(BadRequest, match=r"(?i)not modified"):
            await bot.edit_message_reply_markup(GROUP, sent.message_id, reply_markup=keyboard("z"))
        await bot.edit_message_reply_markup(GROUP, sent.message_id)
        assert tg.buttons(GROUP, sent.message_id) == []
        message = tg.message(GROUP, sent.message_id)
        assert message is not None and message["text"] == "card 3"
        with pytest.raises(BadRequest, match=r"(?i)not found"):
            await bot.edit_message_reply_markup(GROUP, 999)
        assert [c.method for c in tg.requests() if c.method.startswith("edit")].count("editMessageReplyMarkup") == 4
