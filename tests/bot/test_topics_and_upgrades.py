"""Real groups through real PTB and the fake Bot API: forum topics are conversations of their own, and a
group upgraded to a supergroup keeps its conversation."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.offline import prompt_text
from tests.fakes.telegram_group_events import upgrade_group
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings, telegram_app

FORUM_ID = -1_005_000_000_001
OLD_GROUP_ID = -4_001
NEW_SUPERGROUP_ID = -1_004_000_000_001
TOPIC_A, TOPIC_B = 10, 20
WAIT_SECONDS = 20.0


class TopicModel:
    """Answers with every user line of its prompt; a prompt that holds `hold_word` waits for `release`."""

    def __init__(self, hold_word: str | None = None) -> None:
        self.hold_word = hold_word
        self.release = asyncio.Event()
        self.prompts: list[str] = []

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = prompt_text(messages)
        self.prompts.append(prompt)
        if self.hold_word is not None and self.hold_word in prompt:
            await self.release.wait()
        words = sorted({w for w in prompt.split() if w.startswith("q-")})
        return ModelResponse(parts=[TextPart("seen " + " ".join(words))])


def answers(tg: FakeTelegram, chat_id: int, thread_id: int | None) -> list[str]:
    return [m.plain_text for m in tg.sent_messages(chat_id) if m.thread_id == thread_id]


async def test_two_topics_are_two_conversations_each_answered_in_its_topic(tmp_path: Path) -> None:
    model = TopicModel(hold_word="q-slow")
    async with FakeTelegram() as tg:
        tg.add_chat(FORUM_ID, chat_type="supergroup", title="forum")
        tg.update_chat(FORUM_ID, is_forum=True)
        settings = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(FORUM_ID), MERGE_WINDOW_SECONDS=60)
        async with telegram_app(settings, model=FunctionModel(model)) as app:
            asked_in_a = tg.push_message(FORUM_ID, f"@{tg.bot_username} q-slow from A", thread_id=TOPIC_A)
            await tg.wait_until(lambda: model.prompts or None, WAIT_SECONDS)
            # B's turn starts and ends while A's is in flight inside its merge window: A's is not aborted.
            asked_in_b = tg.push_message(FORUM_ID, f"@{tg.bot_username} q-fast from B", thread_id=TOPIC_B)
            await tg.wait_until(lambda: answers(tg, FORUM_ID, TOPIC_B) or None, WAIT_SECONDS)
            assert answers(tg, FORUM_ID, TOPIC_B) == ["Crew: seen q-fast"]
            assert answers(tg, FORUM_ID, TOPIC_A) == []

            model.release.set()
            await tg.wait_until(lambda: answers(tg, FORUM_ID, TOPIC_A) or None, WAIT_SECONDS)
            assert answers(tg, FORUM_ID, TOPIC_A) == ["Crew: seen q-slow"]  # B's words never in A's prompt
            assert len(model.prompts) == 2  # one turn each: nothing was aborted and re-run
            assert answers(tg, FORUM_ID, None) == []  # nothing went to the General topic
            # Each answer is a reply to the message that asked for it.
            replied = {m.thread_id: m.reply_to_message_id for m in tg.sent_messages(FORUM_ID)}
            assert replied == {
                TOPIC_A: asked_in_a["message"]["message_id"],
                TOPIC_B: asked_in_b["message"]["message_id"],
            }
            assert {a.thread_id for a in tg.chat_actions(FORUM_ID)} <= {TOPIC_A, TOPIC_B}

            # A follow-up in A sees A's history only.
            tg.push_message(FORUM_ID, f"@{tg.bot_username} q-again in A", thread_id=TOPIC_A)
            await tg.wait_until(lambda: len(answers(tg, FORUM_ID, TOPIC_A)) == 2 or None, WAIT_SECONDS)
            assert answers(tg, FORUM_ID, TOPIC_A)[-1] == "Crew: seen q-again q-slow"
            topics = await app.stores.chats.conversations_of(FORUM_ID)
            assert len(topics) == 2 and all(t < -(2**53) for t in topics)


async def test_a_merge_in_one_topic_does_not_touch_the_other(tmp_path: Path) -> None:
    model = TopicModel(hold_word="q-first")
    async with FakeTelegram() as tg:
        tg.add_chat(FORUM_ID, chat_type="supergroup", title="forum")
        tg.update_chat(FORUM_ID, is_forum=True)
        settings = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(FORUM_ID), MERGE_WINDOW_SECONDS=60)
        async with telegram_app(settings, model=FunctionModel(model)):
            tg.push_message(FORUM_ID, f"@{tg.bot_username} q-first in B", thread_id=TOPIC_B)
            await tg.wait_until(lambda: model.prompts or None, WAIT_SECONDS)
            tg.push_message(FORUM_ID, f"@{tg.bot_username} q-other in A", thread_id=TOPIC_A)
            await tg.wait_until(lambda: answers(tg, FORUM_ID, TOPIC_A) or None, WAIT_SECONDS)
            # A second message in A inside A's window merges A's turns only; B's turn is still waiting.
            tg.push_message(FORUM_ID, f"@{tg.bot_username} q-more in A", thread_id=TOPIC_A)
            await tg.wait_until(lambda: len(answers(tg, FORUM_ID, TOPIC_A)) == 2 or None, WAIT_SECONDS)
            assert answers(tg, FORUM_ID, TOPIC_B) == []
            model.release.set()
            await tg.wait_until(lambda: answers(tg, FORUM_ID, TOPIC_B) or None, WAIT_SECONDS)
            assert answers(tg, FORUM_ID, TOPIC_B) == ["Crew: seen q-first"]


async def test_an_upgrade_keeps_the_conversation_and_sends_go_to_the_new_id(tmp_path: Path) -> None:
    model = TopicModel()
    async with FakeTelegram() as tg:
        tg.add_chat(OLD_GROUP_ID, chat_type="group", title="team")
        settings = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(OLD_GROUP_ID))
        async with telegram_app(settings, model=FunctionModel(model)) as app:
            tg.push_message(OLD_GROUP_ID, f"@{tg.bot_username} q-before the upgrade")
            await tg.wait_for_messages(OLD_GROUP_ID, 1)
            upgrade_group(tg, OLD_GROUP_ID, NEW_SUPERGROUP_ID)
            tg.push_message(NEW_SUPERGROUP_ID, f"@{tg.bot_username} q-after the upgrade")
            sent = await tg.wait_for_messages(NEW_SUPERGROUP_ID, 1)
            # The same conversation: the answer saw the message from before; the allow-list's old id holds.
            assert [m.plain_text for m in sent] == ["Crew: seen q-after q-before"]
            assert len(tg.sent_messages(OLD_GROUP_ID)) == 1
            assert await app.stores.chats.conversations_of(NEW_SUPERGROUP_ID) == [OLD_GROUP_ID]


async def test_a_send_refused_as_upgraded_is_sent_to_the_supergroup_once(tmp_path: Path) -> None:
    model = TopicModel(hold_word="q-held")
    async with FakeTelegram() as tg:
        tg.add_chat(OLD_GROUP_ID, chat_type="group", title="team")
        settings = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=f"{OLD_GROUP_ID},{NEW_SUPERGROUP_ID}")
        async with telegram_app(settings, model=FunctionModel(model)) as app:
            tg.push_message(OLD_GROUP_ID, f"@{tg.bot_username} q-held until the upgrade")
            await tg.wait_until(lambda: model.prompts or None, WAIT_SECONDS)
            upgrade_group(tg, OLD_GROUP_ID, NEW_SUPERGROUP_ID, announce=False)  # the bot has not heard of it
            model.release.set()
            sent = await tg.wait_for_messages(NEW_SUPERGROUP_ID, 1)
            assert [m.plain_text for m in sent] == ["Crew: seen q-held"]
            assert tg.sent_messages(OLD_GROUP_ID) == []
            await app.wait_quiet(OLD_GROUP_ID)  # the turn ends once its answer is recorded as sent
            assert await app.stores.outbox.counts() == {"sent": 1}
            tg.push_message(NEW_SUPERGROUP_ID, f"@{tg.bot_username} q-next")
            await tg.wait_for_messages(NEW_SUPERGROUP_ID, 2)
            assert tg.sent_messages(NEW_SUPERGROUP_ID)[-1].plain_text == "Crew: seen q-held q-next"


async def test_after_an_upgrade_and_a_restart_the_new_id_alone_allows_the_chat(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(OLD_GROUP_ID, chat_type="group", title="team")
        before = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(OLD_GROUP_ID))
        async with telegram_app(before, model=FunctionModel(TopicModel())):
            tg.push_message(OLD_GROUP_ID, f"@{tg.bot_username} q-old")
            await tg.wait_for_messages(OLD_GROUP_ID, 1)
            upgrade_group(tg, OLD_GROUP_ID, NEW_SUPERGROUP_ID)
            await tg.wait_until(lambda: tg.pending_updates() == [] or None, WAIT_SECONDS)
        # The operator replaced the old id by the new one in ALLOWED_CHAT_IDS and restarted.
        after = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(NEW_SUPERGROUP_ID))
        async with telegram_app(after, model=FunctionModel(TopicModel())):
            tg.push_message(NEW_SUPERGROUP_ID, f"@{tg.bot_username} q-new")
            sent = await tg.wait_for_messages(NEW_SUPERGROUP_ID, 1)
            assert [m.plain_text for m in sent] == ["Crew: seen q-new q-old"]
