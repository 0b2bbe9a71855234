"""Load through real PTB, the fake Bot API and real SQLite: 50 chats each send a burst of 20 messages.

Every message is stored in order; each chat's replies answer its triggering messages in increasing order,
never one twice, and the last one is always answered. The time bound only prevents a hang."""

from __future__ import annotations

import asyncio
import re
import secrets
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.offline import prompt_text
from bot.agent.prompt import LATEST_MARKER
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings, telegram_app

CHATS = 50
MESSAGES_PER_CHAT = 20
TRIGGER_EVERY = 4  # every 4th message mentions the bot
RUN_BOUND_SECONDS = 240.0
ANSWER = re.compile(r"^Crew: answer to c(\d+) m(\d+) @")


def latest_text(messages: list[ModelMessage]) -> str:
    prompt = prompt_text(messages)
    return prompt.rpartition(LATEST_MARKER)[2].partition(":\n")[2].partition("\n\nWrite ")[0].strip()


async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    await asyncio.sleep(0.01)  # a model takes a moment; merges and queueing get a chance to happen
    return ModelResponse(parts=[TextPart(f"answer to {latest_text(messages)}")])


def is_trigger(index: int) -> bool:
    return index % TRIGGER_EVERY == TRIGGER_EVERY - 1


async def test_fifty_chats_twenty_messages_each(tmp_path: Path) -> None:
    base = 2_000_000_000 + secrets.randbelow(900_000_000)
    chat_ids = [-(base + n) for n in range(CHATS)]
    async with FakeTelegram() as tg:
        for chat_id in chat_ids:
            tg.add_chat(chat_id, title=f"load {chat_id}")
        settings = make_settings(
            tmp_path,
            tg,
            ALLOWED_CHAT_IDS=",".join(map(str, chat_ids)),
            MERGE_WINDOW_SECONDS=0,
            TYPING_INTERVAL_SECONDS=1.0,
            LOG_LEVEL="WARNING",
        )
        texts = {
            chat_id: [
                f"c{c:02d} m{i:02d}" + (f" @{tg.bot_username}" if is_trigger(i) else " chatter")
                for i in range(MESSAGES_PER_CHAT)
            ]
            for c, chat_id in enumerate(chat_ids)
        }
        last_trigger = max(i for i in range(MESSAGES_PER_CHAT) if is_trigger(i))
        async with telegram_app(settings, model=FunctionModel(answer)) as app, asyncio.timeout(RUN_BOUND_SECONDS):
            for i in range(MESSAGES_PER_CHAT):  # the bursts interleave, as busy groups do
                for chat_id in chat_ids:
                    tg.push_message(chat_id, texts[chat_id][i], user_id=5000 + i % 3, first_name=f"U{i % 3}")

            def all_last_answered() -> bool | None:
                done = all(
                    any(
                        m.plain_text.startswith(f"Crew: answer to {texts[c][last_trigger]}")
                        for m in tg.sent_messages(c)
                    )
                    for c in chat_ids
                )
                return True if done else None

            await tg.wait_until(all_last_answered, timeout_seconds=RUN_BOUND_SECONDS)
            for chat_id in chat_ids:
                await app.wait_quiet(chat_id)

            for c, chat_id in enumerate(chat_ids):
                async with app.stores.db.conn.execute(
                    "SELECT content FROM messages WHERE chat_id = ? AND is_bot = 0 ORDER BY id", (chat_id,)
                ) as cursor:
                    assert [str(r[0]) for r in await cursor.fetchall()] == texts[chat_id]
                answered: list[int] = []
                for message in tg.sent_messages(chat_id):
                    match = ANSWER.match(message.plain_text)
                    assert match is not None, message.plain_text
                    assert int(match[1]) == c  # never another chat's message
                    answered.append(int(match[2]))
                assert all(is_trigger(i) for i in answered), answered
                assert answered == sorted(set(answered)), f"chat {c}: out of order or twice: {answered}"
                assert answered[-1] == last_trigger
            assert await app.stores.outbox.counts() == {"sent": sum(len(tg.sent_messages(c)) for c in chat_ids)}
