"""The fake Bot API, driven by the real python-telegram-bot."""

from __future__ import annotations

import asyncio
import html

import pytest
from telegram import Bot, ReplyParameters, Update
from telegram.constants import ChatMemberStatus, ParseMode
from telegram.error import (
    BadRequest,
    Conflict,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
)
from telegram.ext import ApplicationBuilder, ContextTypes, MessageHandler, filters

from tests.fakes.telegram_server import FakeTelegram, Fault

GROUP = -1_001_555_000_111  # a supergroup id
POLL_TIMEOUT_SECONDS = 5


def bot_for(tg: FakeTelegram) -> Bot:
    return Bot(tg.token, base_url=tg.base_url)


async def test_get_me_and_send_message_round_trip() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        assert bot.username == "crew_test_bot"
        assert bot.id == tg.bot_id
        tg.add_chat(GROUP)

        sent = await bot.send_message(GROUP, "<b>Crew</b>: 1 &lt; 2", parse_mode=ParseMode.HTML)

        assert sent.text == "Crew: 1 < 2"
        assert sent.entities[0].type == "bold"
        assert sent.from_user is not None and sent.from_user.id == tg.bot_id
        [record] = tg.sent_messages(GROUP)
        assert (record.message_id, record.text, record.parse_mode) == (sent.message_id, sent.text_html, "HTML")
        assert record.plain_text == "Crew: 1 < 2"


async def test_telegram_rules_are_enforced() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        await bot.send_message(GROUP, "é" * 4096)  # the limit counts characters, not bytes
        with pytest.raises(BadRequest, match="Message is too long"):
            await bot.send_message(GROUP, "x" * 4097)
        with pytest.raises(BadRequest, match="Can't parse entities"):
            await bot.send_message(GROUP, "<b>unclosed", parse_mode=ParseMode.HTML)
        with pytest.raises(BadRequest, match=r"(?i)unsupported start tag"):
            await bot.send_message(GROUP, "a < b", parse_mode=ParseMode.HTML)
        with pytest.raises(BadRequest, match=r"(?i)reserved and must be escaped"):
            await bot.send_message(GROUP, "Done.", parse_mode=ParseMode.MARKDOWN_V2)
        with pytest.raises(BadRequest, match="Chat not found"):
            await bot.send_message(42, "hi")
        with pytest.raises(BadRequest, match="Message to be replied not found"):
            await bot.send_message(GROUP, "hi", reply_parameters=ReplyParameters(message_id=999))
        await bot.send_message(GROUP, html.escape("a < b & c"), parse_mode=ParseMode.HTML)
        assert [m.plain_text[:3] for m in tg.sent_messages()] == ["ééé", "a <"]  # failures not recorded
        assert tg.call_count("sendMessage") == 8


async def test_faults_and_blocked_chats_surface_as_ptb_errors() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.add_chat(GROUP)
        tg.fail_next("sendMessage", Fault.retry_after(3))
        with pytest.raises(RetryAfter, match="Retry in 3 seconds"):
            await bot.send_message(GROUP, "hi")
        tg.fail_next("sendMessage", Fault.disconnect())
        with pytest.raises(NetworkError):
            await bot.send_message(GROUP, "hi")
        tg.block_chat(GROUP)
        with pytest.raises(Forbidden, match="kicked"):
            await bot.send_chat_action(GROUP, "typing")
        tg.unblock_chat(GROUP)
        await bot.send_message(GROUP, "back")
        assert [m.text for m in tg.sent_messages()] == ["back"]


async def test_wrong_token_and_unknown_method() -> None:
    async with FakeTelegram() as tg:
        with pytest.raises(InvalidToken):
            async with Bot("999:wrong-token", base_url=tg.base_url):
                pass
        async with bot_for(tg) as bot:
            with pytest.raises(EndPointNotFound):
                await bot.do_api_request("sendTelepathy")
        assert tg.call_counts() == {"getMe": 1, "sendTelepathy": 1}


async def test_long_poll_waits_for_an_update_and_confirms_by_offset() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        poll = asyncio.create_task(bot.get_updates(timeout=POLL_TIMEOUT_SECONDS))
        await tg.wait_for_requests("getUpdates")
        assert not poll.done()
        tg.push_message(GROUP, "/start@crew_test_bot hi")

        [update] = await asyncio.wait_for(poll, 1)
        assert update.message is not None and update.message.text == "/start@crew_test_bot hi"
        assert update.message.entities[0].type == "bot_command"
        assert len(await bot.get_updates(timeout=0)) == 1  # not confirmed yet
        assert await bot.get_updates(offset=update.update_id + 1, timeout=0) == ()
        assert tg.pending_updates() == []


async def test_a_newer_poll_ends_the_older_one_with_conflict() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as first, bot_for(tg) as second:
        older = asyncio.create_task(first.get_updates(timeout=POLL_TIMEOUT_SECONDS))
        await tg.wait_for_requests("getUpdates")
        await second.get_updates(timeout=0)
        with pytest.raises(Conflict):
            await asyncio.wait_for(older, 1)


async def test_replies_admins_edits_and_deletes() -> None:
    async with FakeTelegram() as tg, bot_for(tg) as bot:
        tg.push_message(GROUP, "hi", user_id=7, first_name="Bob")
        sent = await bot.send_message(GROUP, "hello Bob")
        update = Update.de_json(tg.push_message(GROUP, "thanks", user_id=7, reply_to_message_id=sent.message_id), bot)
        assert update.message is not None and update.message.reply_to_message is not None
        assert update.message.reply_to_message.from_user is not None
        assert update.message.reply_to_message.from_user.id == tg.bot_id

        tg.set_chat_admins(GROUP, [8], owner_id=9)
        assert (await bot.get_chat_member(GROUP, 7)).status == ChatMemberStatus.MEMBER
        assert (await bot.get_chat_member(GROUP, 8)).status == ChatMemberStatus.ADMINISTRATOR
        assert [m.user.id for m in await bot.get_chat_administrators(GROUP)] == [9, 8]
        assert (await bot.get_chat(GROUP)).type == "supergroup"

        await bot.edit_message_text("hello again", GROUP, sent.message_id)
        with pytest.raises(BadRequest, match="Message is not modified"):
            await bot.edit_message_text("hello again", GROUP, sent.message_id)
        with pytest.raises(BadRequest, match="Message can't be deleted"):
            await bot.delete_message(GROUP, 1)  # Bob's, and the bot is no admin
        assert await bot.delete_message(GROUP, sent.message_id)
        assert tg.message(GROUP, sent.message_id) is None
        assert [m.text for m in tg.sent_messages(GROUP)] == ["hello Bob"]


async def test_application_receives_a_pushed_message_and_replies() -> None:
    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None
        await update.effective_message.reply_text(f"echo: {update.effective_message.text}")

    async with FakeTelegram() as tg:
        app = ApplicationBuilder().token(tg.token).base_url(tg.base_url).build()
        app.add_handler(MessageHandler(filters.TEXT, echo))
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0, timeout=POLL_TIMEOUT_SECONDS)
            update = tg.push_message(GROUP, "ping")

            [reply] = await tg.wait_for_messages(GROUP, 1, timeout_seconds=1)

            assert reply.text == "echo: ping"
            assert reply.reply_to_message_id == update["message"]["message_id"]
            await app.updater.stop()
            await app.stop()
        assert tg.pending_updates() == []  # PTB confirmed what it handled


def test_runs_on_its_own_thread_for_other_processes() -> None:
    with FakeTelegram() as tg:

        async def client() -> str:
            async with bot_for(tg) as bot:
                tg.add_chat(GROUP)
                await bot.send_message(GROUP, "from another loop")
                return (await tg.wait_for_messages(GROUP, 1))[0].text

        assert asyncio.run(client()) == "from another loop"
