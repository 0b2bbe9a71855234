"""Subagents in real groups: a result lands in the topic it was asked in, as a reply to the asking
message, and a run that outlives a group's upgrade reports to the new supergroup once. Real Docker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.store.runs import RunStatus, RunStore
from tests.fakes.telegram_group_events import upgrade_group
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_state import SentMessage
from tests.harness import make_settings, telegram_app

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

FORUM_ID = -1_005_000_000_002
OLD_GROUP_ID = -4_002
NEW_SUPERGROUP_ID = -1_004_000_000_002
TOPIC = 77
RUN_WAIT_SECONDS = 90.0  # container starts are slow on a loaded 2-core machine


def with_text(tg: FakeTelegram, chat_id: int, text: str) -> list[SentMessage]:
    return [m for m in tg.sent_messages(chat_id) if text in m.plain_text]


async def test_a_result_lands_in_its_topic_as_a_reply_to_the_asking_message(
    tmp_path: Path, subagent_image: str
) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(FORUM_ID, chat_type="supergroup", title="forum")
        tg.update_chat(FORUM_ID, is_forum=True)
        settings = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(FORUM_ID), SUBAGENT_IMAGE=subagent_image)
        async with telegram_app(settings, with_subagents=True):
            asked = tg.push_message(FORUM_ID, f"@{tg.bot_username} background: $ echo topic-$((2+2))", thread_id=TOPIC)
            asked_id = asked["message"]["message_id"]
            (result,) = await tg.wait_until(lambda: with_text(tg, FORUM_ID, "topic-4") or None, RUN_WAIT_SECONDS)
            assert result.plain_text.startswith("Crew: [Task: ") and "\ntopic-4\n" in result.plain_text
            assert (result.thread_id, result.reply_to_message_id) == (TOPIC, asked_id)
            assert all(m.thread_id == TOPIC for m in tg.sent_messages(FORUM_ID))  # the answer too
            assert all(m.reply_to_message_id == asked_id for m in tg.sent_messages(FORUM_ID))
            assert {a.thread_id for a in tg.chat_actions(FORUM_ID)} == {TOPIC}  # typing in the topic


async def test_a_run_outliving_an_upgrade_reports_to_the_supergroup_once(tmp_path: Path, subagent_image: str) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(OLD_GROUP_ID, chat_type="group", title="team")
        settings = make_settings(
            tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(OLD_GROUP_ID), SUBAGENT_IMAGE=subagent_image
        )
        async with telegram_app(settings, with_subagents=True) as app:
            tg.push_message(OLD_GROUP_ID, f"@{tg.bot_username} background: $ sleep 4 && echo upg-$((40+2))")
            await tg.wait_for_messages(OLD_GROUP_ID, 1)  # the answer that started it, before the upgrade
            upgrade_group(tg, OLD_GROUP_ID, NEW_SUPERGROUP_ID)
            await tg.wait_until(lambda: with_text(tg, NEW_SUPERGROUP_ID, "upg-42") or None, RUN_WAIT_SECONDS)
            await app.wait_quiet(OLD_GROUP_ID)
            assert len(with_text(tg, NEW_SUPERGROUP_ID, "upg-42")) == 1
            assert with_text(tg, OLD_GROUP_ID, "upg-42") == []
            # Asked in the old group: nothing there to reply to in the new one, so it is sent plainly.
            assert with_text(tg, NEW_SUPERGROUP_ID, "upg-42")[0].reply_to_message_id is None
            # The result's row is marked sent just after Telegram took it: nothing stays owed to either id.
            async with asyncio.timeout(RUN_WAIT_SECONDS):
                while True:
                    if await app.stores.outbox.counts() == {"sent": 2}:
                        break
                    await asyncio.sleep(0.05)


async def test_cancel_all_acts_on_its_topic_and_cancel_all_chat_on_every_topic(
    tmp_path: Path, subagent_image: str
) -> None:
    other_topic = TOPIC + 1
    async with FakeTelegram() as tg:
        tg.add_chat(FORUM_ID, chat_type="supergroup", title="forum")
        tg.update_chat(FORUM_ID, is_forum=True)
        settings = make_settings(
            tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(FORUM_ID), SUBAGENT_IMAGE=subagent_image, ADMIN_USER_IDS="1001"
        )
        async with telegram_app(settings, with_subagents=True) as app:
            runs = RunStore(app.stores.db)
            topics: list[int] = []
            for topic in (TOPIC, other_topic):
                tg.push_message(FORUM_ID, f"@{tg.bot_username} background: $ sleep 120", thread_id=topic)

            async def statuses() -> dict[int, RunStatus]:
                topics[:] = await app.stores.chats.conversations_of(FORUM_ID)
                found: dict[int, RunStatus] = {}
                for conversation in topics:
                    for record in await runs.for_chat(conversation, 5):
                        found[conversation] = record.status
                return found

            async def until(expected: dict[RunStatus, int]) -> dict[int, RunStatus]:
                async with asyncio.timeout(RUN_WAIT_SECONDS):
                    while True:
                        found = await statuses()
                        if sorted(found.values()) == sorted(s for s, n in expected.items() for _ in range(n)):
                            return found
                        await asyncio.sleep(0.1)

            await until({RunStatus.RUNNING: 2})
            command = tg.push_message(FORUM_ID, "/cancel all", thread_id=TOPIC)
            found = await until({RunStatus.CANCELLED: 1, RunStatus.RUNNING: 1})
            reply = await tg.wait_until(lambda: with_text(tg, FORUM_ID, "Cancelled 1 subagent") or None, 30)
            assert (reply[0].thread_id, reply[0].reply_to_message_id) == (TOPIC, command["message"]["message_id"])
            by_topic = {(await app.stores.chats.address(c)).thread_id: s for c, s in found.items()}
            assert by_topic == {TOPIC: RunStatus.CANCELLED, other_topic: RunStatus.RUNNING}

            tg.push_message(FORUM_ID, "/cancel all chat", thread_id=TOPIC)
            await until({RunStatus.CANCELLED: 2})
            await tg.wait_until(lambda: with_text(tg, FORUM_ID, "in the whole chat") or None, 30)
