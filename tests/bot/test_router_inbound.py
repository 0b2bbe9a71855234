"""The inbound path: the allow-list, storing messages, and triggering turns."""

from __future__ import annotations

import asyncio

from bot.commands import Commands
from bot.flood import FloodGuard
from bot.router import InboundRouter
from bot.turns.engine import ChatEngine
from core.settings import load_settings
from core.store import ChatStore, MessageStore
from core.store.db import Database
from core.typing_indicator import TypingIndicator
from tests.bot.helpers import (
    WAIT_SECONDS,
    ControlledRunner,
    RecordingChannel,
    RecordingLifecycle,
    inbound,
    make_delivery,
)
from tests.bot.router_helpers import ALLOWED, STRANGER, Bot

# --- allow-list -------------------------------------------------------------------------------------


async def test_other_chats_are_not_stored_and_get_no_reply(bot: Bot) -> None:
    await bot.router.handle(inbound(STRANGER, "@crew hello?", platform_message_id=1, triggers=True))
    await bot.router.handle(inbound(STRANGER, "/help", platform_message_id=2, triggers=True, command="help"))

    assert await bot.messages.count() == 0
    assert await bot.chats.get(STRANGER) is None
    assert bot.channel.sent == []
    assert bot.engine.idle(STRANGER)
    assert bot.runner.started == []


async def test_start_in_another_chat_replies_with_its_id(bot: Bot) -> None:
    await bot.router.handle(inbound(STRANGER, "/start", platform_message_id=1, triggers=True, command="start"))

    await bot.channel.wait_for(lambda: len(bot.channel.sent) == 1)  # sent in the background
    chat_id, text = bot.channel.sent[0]
    assert chat_id == STRANGER
    assert str(STRANGER) in text
    assert "ALLOWED_CHAT_IDS" in text
    assert await bot.messages.count() == 0


async def test_allow_all_chats_lets_everyone_in(db: Database, chats: ChatStore, messages: MessageStore) -> None:
    settings = load_settings(_env_file=None, ALLOW_ALL_CHATS="true")
    channel = RecordingChannel()
    typing = TypingIndicator(channel.send_typing, 1.0)
    engine = ChatEngine(ControlledRunner(), RecordingLifecycle(), typing, 3.0)
    delivery = make_delivery(db, channel, "Crew")
    commands = Commands(channel, delivery, engine, None, [])
    router = InboundRouter(
        settings,
        chats=chats,
        messages=messages,
        engine=engine,
        commands=commands,
        delivery=delivery,
        flood=FloodGuard(),
    )
    try:
        await router.handle(inbound(STRANGER, "just chatting", platform_message_id=1))
        assert await messages.count(STRANGER) == 1
    finally:
        await engine.close()
        await typing.close()


# --- storing and triggering -------------------------------------------------------------------------


async def test_non_triggering_message_is_stored_but_starts_no_turn(bot: Bot) -> None:
    await bot.router.handle(inbound(ALLOWED, "lunch at noon?", platform_message_id=10, sender_name="Bob"))

    stored = await bot.stored(ALLOWED)
    assert [(m.sender_name, m.content, m.is_trigger, m.is_bot) for m in stored] == [
        ("Bob", "lunch at noon?", False, False)
    ]
    assert bot.engine.idle(ALLOWED)
    assert bot.channel.sent == []
    chat = await bot.chats.get(ALLOWED)
    assert chat is not None and chat.kind == "group"


async def test_triggering_message_is_stored_and_starts_a_turn(bot: Bot) -> None:
    await bot.router.handle(inbound(ALLOWED, "@crew what's up?", platform_message_id=11, triggers=True))

    turn = await bot.runner.next_started(1)
    assert turn.chat_id == ALLOWED
    stored = await bot.stored(ALLOWED)
    assert [(m.content, m.is_trigger, m.platform_message_id) for m in stored] == [("@crew what's up?", True, 11)]
    bot.runner.finish(turn)


async def test_duplicate_platform_message_is_processed_once(bot: Bot) -> None:
    message = inbound(ALLOWED, "@crew once please", platform_message_id=12, triggers=True)
    await bot.router.handle(message)
    turn = await bot.runner.next_started(1)
    bot.runner.finish(turn)
    await asyncio.wait_for(bot.typing.wait_idle(ALLOWED), WAIT_SECONDS)

    await bot.router.handle(message)  # Telegram redelivers the update

    assert bot.engine.idle(ALLOWED)  # no new turn was started
    assert len(bot.runner.started) == 1
    assert await bot.messages.count(ALLOWED) == 1


async def test_overlong_message_is_truncated_when_stored(bot: Bot) -> None:
    await bot.router.handle(inbound(ALLOWED, "x" * 50_000, platform_message_id=13))

    (stored,) = await bot.stored(ALLOWED)
    assert stored.content.endswith(" [truncated]")
    assert len(stored.content) < 50_000
