"""The start-up pass over growing answers a crash cut short, on the real store: the chat's newest one is
answered into (its ids handed to the live replies, its record to the next turn); the others, and any whose
question is gone or whose chat is not allowed any more, are finished as interrupted through the outbox."""

from __future__ import annotations

import time
from collections.abc import Sequence

from bot.agent.live_reply import LiveReplies
from bot.agent.live_restart import (
    INTERRUPTED_KIND,
    INTERRUPTED_MARK,
    LIVE_RESUME_MAX_AGE_SECONDS,
    LiveRestart,
    Resumed,
)
from bot.channels.buttons import CardButton
from bot.channels.edit_pacer import EditPacer
from core.store import ChatStore, Database, MessageStore
from core.store.live_messages import LiveMessageStore
from core.store.messages import NewMessage
from core.store.outbox import OutboxStore, Outgoing
from core.store.run_record import RunStatus
from core.store.runs import RunStore
from core.store.schedules import NewTask, ScheduleStore, TaskMode
from core.store.turns import TurnStore
from core.typing_indicator import TypingIndicator
from tests.bot.helpers import RecordingChannel, make_delivery

CHAT, GONE_CHAT, BARRED_CHAT = -1001, -1002, -1003
GONE_TRIGGER = 999_999  # a messages row that does not exist


class Unseen:
    """A group's LiveChannel that is never written to here (the pass only hands ids on)."""

    def split(self, text: str) -> list[str]:
        return [text]

    async def drafts_for(self, chat_id: int) -> bool:
        return False

    async def send_live(self, chat_id: int, part: str, reply_to: int | None, buttons: Sequence[CardButton] = ()) -> int:
        raise AssertionError("nothing is sent by the start-up pass")

    async def edit_live(self, chat_id: int, message_id: int, part: str, buttons: Sequence[CardButton] = ()) -> None:
        raise AssertionError("nothing is edited by the start-up pass")

    async def edit_part(self, chat_id: int, message_id: int, part: str) -> None:
        raise AssertionError("nothing is edited by the start-up pass")

    async def delete_part(self, chat_id: int, message_id: int) -> None:
        raise AssertionError("nothing is deleted by the start-up pass")

    async def send_draft(self, chat_id: int, draft_id: int, part: str) -> None:
        raise AssertionError("nothing is drafted by the start-up pass")


async def ask(messages: MessageStore, chat_id: int, text: str) -> int:
    row = await messages.add(NewMessage(chat_id=chat_id, sender_name="Ann", content=text, sender_id=7, is_trigger=True))
    assert row is not None
    return row


async def owed(db: Database) -> list[tuple[int, str, str | None]]:
    async with db.conn.execute("SELECT chat_id, text, edit_ids FROM outbox WHERE status = 'pending' ORDER BY id") as c:
        return [(int(r[0]), str(r[1]), r[2]) for r in await c.fetchall()]


async def test_the_newest_answer_of_a_chat_is_answered_into_and_every_other_one_marked_interrupted(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    for chat_id in (CHAT, GONE_CHAT, BARRED_CHAT):
        await chats.ensure(chat_id, "supergroup", f"chat {chat_id}")
    records = LiveMessageStore(db)
    first, second = await ask(messages, CHAT, "first question"), await ask(messages, CHAT, "second question")
    barred = await ask(messages, BARRED_CHAT, "a question")
    await records.save("t-old", CHAT, first, (11,), "an older answer")
    await records.save("t-new", CHAT, second, (12, 13), "the newest answer, half")
    await records.save("t-gone", GONE_CHAT, GONE_TRIGGER, (21,), "its question is gone")
    await records.save("t-barred", BARRED_CHAT, barred, (31,), "")
    channel = RecordingChannel()
    typing = TypingIndicator(channel.send_typing, 4.0)
    live = LiveReplies(Unseen(), EditPacer(1.0, 20.0), typing, "Crew", records=records)

    async def allowed(chat_id: int) -> bool:
        return chat_id != BARRED_CHAT

    resumed = await LiveRestart(records, messages, make_delivery(db, channel), live, allowed).recover()

    assert resumed == [Resumed(CHAT, second)]
    assert await owed(db) == [
        (CHAT, f"Crew: an older answer\n\n{INTERRUPTED_MARK}", "[11]"),
        (GONE_CHAT, f"Crew: its question is gone\n\n{INTERRUPTED_MARK}", "[21]"),
        (BARRED_CHAT, f"Crew: {INTERRUPTED_MARK}", "[31]"),  # nothing of it was recorded but its message
    ]
    async with db.conn.execute("SELECT DISTINCT kind FROM messages WHERE is_bot = 1") as cursor:
        assert [row[0] for row in await cursor.fetchall()] == [INTERRUPTED_KIND]
    [left] = await records.leftovers()
    assert left.turn_id == "t-new"  # the others ended in the transactions that owe their final text
    assert channel.sent == []  # owed, not sent: the outbox sends once it runs

    # The chat's next turn writes into the message and takes its record over.
    third = await ask(messages, CHAT, "and a third")
    reply = await live.open(CHAT, "t-next", None, third)
    assert await reply.settle() == (12, 13)
    [taken] = await records.leftovers()
    assert (taken.turn_id, taken.trigger_message_id, taken.part_ids) == ("t-next", third, (12, 13))
    await typing.close()


async def test_the_outbox_row_that_owes_the_final_text_ends_the_record(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    await chats.ensure(CHAT, "supergroup", "crew")
    records = LiveMessageStore(db)
    await records.save("t1", CHAT, None, (5,), "written so far")
    await records.save("t2", CHAT, None, (6,), "another")
    message = NewMessage(chat_id=CHAT, sender_name="Crew", content="final", is_bot=True, kind="reply")
    await OutboxStore(db).add(Outgoing(message=message, text="Crew: final", edit_ids=(5,), finishes_live="t1"))
    assert [r.turn_id for r in await records.leftovers()] == ["t2"]


async def test_without_streaming_now_every_record_is_marked_interrupted(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    await chats.ensure(CHAT, "supergroup", "crew")
    records = LiveMessageStore(db)
    asked = await ask(messages, CHAT, "a question")
    await records.save("t1", CHAT, asked, (5,), "half an answer")
    channel = RecordingChannel()

    async def allowed(chat_id: int) -> bool:
        return True

    assert await LiveRestart(records, messages, make_delivery(db, channel), None, allowed).recover() == []
    assert await owed(db) == [(CHAT, f"Crew: half an answer\n\n{INTERRUPTED_MARK}", "[5]")]
    assert await records.leftovers() == []


async def test_a_turn_that_started_a_run_or_scheduled_a_task_or_is_too_old_is_not_answered_again(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    """Answering such a trigger again would start its run or task twice, or answer far up the chat."""
    spawned, scheduled, stale, fresh = -2001, -2002, -2003, -2004
    for chat_id in (spawned, scheduled, stale, fresh):
        await chats.ensure(chat_id, "supergroup", f"chat {chat_id}")
    records, turns = LiveMessageStore(db), TurnStore(db)
    now = time.time()
    for chat_id, turn in ((spawned, "t-spawn"), (scheduled, "t-task"), (stale, "t-stale"), (fresh, "t-fresh")):
        asked = await ask(messages, chat_id, "a question")
        await turns.start(turn, chat_id, asked)
        await records.save(turn, chat_id, asked, (50,), "half")
    await RunStore(db).create(
        "r1", chat_id=spawned, turn_id="t-spawn", task="work", label="w", include_context=False,
        status=RunStatus.RUNNING,
    )  # fmt: skip
    task = NewTask(
        chat_id=scheduled, creator_id=7, label="daily", prompt="p", schedule="every 1d", timezone="UTC",
        mode=TaskMode.MESSAGE, next_due_at=now + 86_400, created_at=now + 1,
    )  # fmt: skip
    await ScheduleStore(db).create(task, max_open=10)
    async with db.write() as conn:  # its first message was sent long ago
        long_ago = now - LIVE_RESUME_MAX_AGE_SECONDS - 1
        await conn.execute("UPDATE live_messages SET created_at = ? WHERE turn_id = 't-stale'", (long_ago,))
    channel = RecordingChannel()
    typing = TypingIndicator(channel.send_typing, 4.0)
    live = LiveReplies(Unseen(), EditPacer(1.0, 20.0), typing, "Crew", records=records)

    async def allowed(chat_id: int) -> bool:
        return True

    resumed = await LiveRestart(records, messages, make_delivery(db, channel), live, allowed).recover()

    assert [r.chat_id for r in resumed] == [fresh]
    assert sorted(chat for chat, _, _ in await owed(db)) == sorted([spawned, scheduled, stale])
    assert {text for _, text, _ in await owed(db)} == {f"Crew: half\n\n{INTERRUPTED_MARK}"}
    assert [r.turn_id for r in await records.leftovers()] == ["t-fresh"]
    await typing.close()


async def test_a_run_of_the_turn_a_merge_handed_the_answer_over_from_counts_too(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    await chats.ensure(CHAT, "supergroup", "crew")
    await chats.ensure(GONE_CHAT, "supergroup", "other")
    records = LiveMessageStore(db)
    first = await ask(messages, CHAT, "first")
    await records.save("t-aborted", CHAT, first, (5,), "half")
    await RunStore(db).create(
        "r1", chat_id=CHAT, turn_id="t-aborted", task="work", label="w", include_context=False,
        status=RunStatus.RUNNING,
    )  # fmt: skip
    merged = await ask(messages, CHAT, "and also")
    assert await records.hand_over("t-aborted", "t-merged", merged)
    [record] = await records.leftovers()
    assert await records.started_work(record)
    await records.save("t-other", GONE_CHAT, None, (), "")  # another chat's record: nothing of its own started
    [_, other] = await records.leftovers()
    assert not await records.started_work(other)
