"""A member's notes in a forum: the group's topics are conversations of their own, but what the bot keeps about a
member is theirs across the whole group. Real PTB against the fake Bot API, the real store on a SQLite file,
and the scripted model of tests/crewbot/test_memory.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crewbot.memory_rig import ALICE, BOB, WAIT_SECONDS, Rig, rig
from tests.harness import GROUP_ID

pytestmark = pytest.mark.timeout(90)

TOPIC_A, TOPIC_B = 10, 20


async def in_topic(r: Rig, topic: int, user_id: int, name: str, text: str) -> str:
    """Send in a topic and wait for the bot's next message there."""
    before = len(r.tg.sent_messages(GROUP_ID))
    r.tg.push_message(GROUP_ID, text, user_id=user_id, first_name=name, thread_id=topic)
    sent = await r.tg.wait_for_messages(GROUP_ID, before + 1, WAIT_SECONDS)
    r.sent = before + 1
    return sent[before].plain_text


async def test_forgetme_and_memory_me_in_one_topic_reach_the_members_notes_in_every_topic(tmp_path: Path) -> None:
    async with rig(tmp_path, ALLOWED_CHAT_IDS=f"{GROUP_ID},{ALICE}") as r:
        r.tg.update_chat(GROUP_ID, type="supergroup", is_forum=True)
        r.tg.add_chat(ALICE)  # her private chat with the bot: where /memory me answers
        await r.app.stores.chats.ensure(ALICE, "private", "Alice")
        mention = f"@{r.tg.bot_username}"
        r.script.plans.append([("remember_about", {"user": "me", "text": "Alice-topic-A-heron-3310 on call"})])
        await in_topic(r, TOPIC_A, ALICE, "Alice", f"{mention} I'm on call this week")
        r.script.plans.append([("remember", {"text": "Alice-topic-B-otter-8841 the venue"})])
        await in_topic(r, TOPIC_B, ALICE, "Alice", f"{mention} remember the venue")
        r.script.plans.append([("remember", {"text": "Bob-topic-A keys"})])
        await in_topic(r, TOPIC_A, BOB, "Bob", f"{mention} remember I keep the keys")
        assert len({row[0] for row in await r.stored("SELECT chat_id FROM notes")}) == 2  # two conversations

        await in_topic(r, TOPIC_B, ALICE, "Alice", "/memory me")
        (mine,) = await r.tg.wait_for_messages(ALICE, 1, WAIT_SECONDS)
        assert "heron-3310" in mine.plain_text  # kept in topic A, asked for in topic B
        (about_alice,) = await r.stored("SELECT id FROM notes WHERE about_user_id = ?", ALICE)
        r.script.plans.append([("remember_about", {"user": "me", "text": "Alice-again-kite-1201"})])
        await in_topic(r, TOPIC_A, ALICE, "Alice", f"{mention} I like tea")
        assert await in_topic(r, TOPIC_B, ALICE, "Alice", f"/memory forget n{about_alice[0]}") == (
            f"Crew: Erased note n{about_alice[0]}."
        )

        erased = await in_topic(r, TOPIC_B, ALICE, "Alice", "/forgetme")

        assert "Erased 2 note(s)" in erased  # topic B's chat note and topic A's note about her
        assert await r.stored("SELECT text FROM notes") == [("Bob-topic-A keys",)]
        await r.app.stores.db.flush_erased()
        on_disk = r.raw_bytes()
        assert b"heron-3310" not in on_disk and b"otter-8841" not in on_disk and b"kite-1201" not in on_disk
