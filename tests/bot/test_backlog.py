"""One chat's backlog never holds up the bot: updates are handled at once, in every chat, while a chat's
owed messages wait on Telegram (slow, rate limited, or answering 429). Real PTB against the fake Bot
API, real SQLite; ordering is asserted on events, never on elapsed time."""

from __future__ import annotations

from pathlib import Path

from bot.commands import HELP_TEXT
from core.settings import Settings
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import NewMessage
from core.store.outbox import Outgoing, stage
from crewbot.app import App
from tests.fakes.faults import Fault
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

BUSY = GROUP_ID  # the chat with the backlog
OTHER = GROUP_ID - 1
STRANGER = GROUP_ID - 2  # not allowed
ADMIN_ID = 4242
LARGE_BACKLOG = 1000
GROUP_BURST = 20  # PTB's AIORateLimiter: Telegram's 20 messages per minute per group, the first 20 at once
HELP_REPLY = f"Crew: {HELP_TEXT.splitlines()[0]}"


async def stage_backlog(settings: Settings, chat_id: int, count: int) -> None:
    """Messages the bot owes `chat_id`, as a busy chat (or a crash) leaves them, before the bot starts."""
    db = await Database.open(settings.db_path)
    try:
        await ChatStore(db).ensure(chat_id, "group", "busy")
        async with db.transaction() as conn:
            for n in range(count):
                message = NewMessage(chat_id=chat_id, sender_name="Crew", content=f"owed {n}", is_bot=True)
                await stage(conn, Outgoing(message, f"Crew: owed {n}"))
    finally:
        await db.close()


async def pending_texts(app: App, chat_id: int) -> list[str]:
    async with app.stores.db.conn.execute(
        "SELECT text FROM outbox WHERE chat_id = ? AND status = 'pending' ORDER BY id", (chat_id,)
    ) as cursor:
        return [str(row[0]) for row in await cursor.fetchall()]


def settings_for(tmp_path: Path, tg: FakeTelegram) -> Settings:
    for chat_id in (BUSY, OTHER, STRANGER):
        tg.add_chat(chat_id)
    return make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=f"{BUSY},{OTHER}", ADMIN_USER_IDS="")


async def test_help_is_handled_at_once_while_a_large_backlog_waits_on_telegram(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = settings_for(tmp_path, tg)
        await stage_backlog(settings, BUSY, LARGE_BACKLOG)
        tg.holds.hold("sendMessage", BUSY)  # Telegram does not answer for the busy chat
        async with telegram_app(settings) as app:
            await tg.wait_until(lambda: True if tg.holds.waiting("sendMessage", BUSY) else None)

            tg.push_message(BUSY, "/help")
            tg.push_message(OTHER, "/help")
            (reply,) = await tg.wait_for_messages(OTHER, 1)

            assert reply.plain_text.startswith(HELP_REPLY)
            # The busy chat's /help was handled too: stored, its answer owed after the backlog.
            assert tg.sent_messages(BUSY) == []
            owed = await pending_texts(app, BUSY)
            assert len(owed) == LARGE_BACKLOG + 1
            assert owed[-1].startswith(HELP_REPLY)
            tg.holds.release("sendMessage", BUSY, Fault.retry_after(60))  # the outbox retries later


async def test_a_reply_in_the_busy_chat_still_comes_after_its_backlog(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = settings_for(tmp_path, tg)
        await stage_backlog(settings, BUSY, 3)
        tg.holds.hold("sendMessage", BUSY)
        async with telegram_app(settings):
            await tg.wait_until(lambda: True if tg.holds.waiting("sendMessage", BUSY) else None)
            tg.push_message(BUSY, "/help")
            tg.push_message(OTHER, "/help")
            await tg.wait_for_messages(OTHER, 1)

            tg.holds.release("sendMessage", BUSY)
            sent = await tg.wait_for_messages(BUSY, 4)
            assert [m.plain_text for m in sent[:3]] == ["Crew: owed 0", "Crew: owed 1", "Crew: owed 2"]
            assert sent[3].plain_text.startswith(HELP_REPLY)


async def test_admin_stop_in_a_rate_limited_chat_is_handled_at_once(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = settings_for(tmp_path, tg)
        tg.set_chat_admins(BUSY, [ADMIN_ID])
        await stage_backlog(settings, BUSY, LARGE_BACKLOG)
        async with telegram_app(settings) as app:
            # The group's first 20 go out at once; the 21st waits about 3 s for the per-group limit.
            await tg.wait_for_messages(BUSY, GROUP_BURST)

            tg.push_message(BUSY, "/stop", user_id=ADMIN_ID, first_name="Ada")
            tg.push_message(OTHER, "/help")
            (reply,) = await tg.wait_for_messages(OTHER, 1)

            assert reply.plain_text.startswith(HELP_REPLY)
            # The admin check did not queue behind the busy chat's messages, and its answer is owed.
            assert len(tg.sent_messages(BUSY)) == GROUP_BURST
            assert len(tg.requests("getChatMember")) == 1
            assert (await pending_texts(app, BUSY))[-1] == "Crew: Nothing to stop."


async def test_a_429_in_one_chat_does_not_hold_up_the_others(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = settings_for(tmp_path, tg)
        await stage_backlog(settings, BUSY, 3)
        tg.fail_next("sendMessage", Fault.retry_after(30))  # the busy chat's first send
        async with telegram_app(settings) as app:
            await tg.wait_for_requests("sendMessage", 1)

            tg.push_message(OTHER, "/help")
            (reply,) = await tg.wait_for_messages(OTHER, 1)

            assert reply.plain_text.startswith(HELP_REPLY)
            assert tg.sent_messages(BUSY) == []
            assert len(await pending_texts(app, BUSY)) == 3  # retried after Telegram's retry_after


async def test_start_floods_from_chats_not_allowed_do_not_hold_up_the_bot(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = settings_for(tmp_path, tg)
        async with telegram_app(settings) as app:
            for _ in range(GROUP_BURST + 5):  # more than Telegram lets the bot answer in a minute
                tg.push_message(STRANGER, "/start")
            tg.push_message(OTHER, "/help")
            await tg.wait_for_messages(OTHER, 1)

            assert 1 <= len(tg.sent_messages(STRANGER)) <= GROUP_BURST
            assert await app.stores.messages.count(STRANGER) == 0
