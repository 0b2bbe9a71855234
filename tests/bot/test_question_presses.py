"""Replies and late presses, decided from the store (real SQLite): a reply answers a question without options
only from one who may (the members who asked for the run, admins); a press on a question whose run has ended
closes it and says so; a press never decides a closed question."""

from __future__ import annotations

import time

from bot.channels.buttons import CardAction, CardPress
from bot.channels.inbound import InboundMessage
from bot.question_presses import QuestionPresses
from core.questions import Questions
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.questions import Audience, NewQuestion, QuestionKind, QuestionStatus, QuestionStore
from core.store.runs import RunStatus, RunStore
from core.store.turns import TurnStore

CHAT, ALICE, BOB, ADMIN = -100, 1001, 1002, 1003
QUESTION_MESSAGE = 77


async def admins_only(chat_id: int, user_id: int) -> bool:
    return user_id == ADMIN


def reply(user_id: int, name: str, text: str) -> InboundMessage:
    return InboundMessage(
        chat_id=CHAT, chat_kind="group", chat_title="g", sender_id=user_id, sender_name=name, text=text,
        platform_message_id=200 + user_id % 100, reply_to=QUESTION_MESSAGE, triggers=True,
    )  # fmt: skip


async def test_replies_and_late_presses(db: Database) -> None:
    await ChatStore(db).ensure(CHAT, "group", "g")
    trigger = await MessageStore(db).add(
        NewMessage(chat_id=CHAT, sender_name="Alice", content="@bot do it", sender_id=ALICE, is_trigger=True)
    )
    turns, runs = TurnStore(db), RunStore(db)
    await turns.start("turn-1", CHAT, trigger_message_id=trigger)
    await runs.create(
        "run-000001", chat_id=CHAT, turn_id="turn-1", task="t", label="pick", include_context=False,
        status=RunStatus.QUEUED,
    )  # fmt: skip
    desk = Questions(QuestionStore(db))
    presses = QuestionPresses(desk, runs, turns, admins_only)
    new = NewQuestion(
        chat_id=CHAT, run_id="run-000001", kind=QuestionKind.ASK, text="What name?", options=(),
        audience=Audience.ASKERS, expires_at=time.time() + 60, ask_id="ask-000001",
    )  # fmt: skip
    question = await desk.ask(new)
    await desk.store.set_message(question.id, QUESTION_MESSAGE)

    assert not await presses.reply(reply(BOB, "Bob", "Mallory"))  # not one who asked, no admin
    assert (await desk.store.get(question.id)).status is QuestionStatus.OPEN  # type: ignore[union-attr]
    assert await presses.reply(reply(ALICE, "Alice", "  Bob  "))
    answered = await desk.store.get(question.id)
    assert answered is not None and (answered.answer, answered.answered_by) == ("Bob", ALICE)
    assert not await presses.reply(reply(ADMIN, "Ada", "Eve"))  # the first answer counted

    # A question with options, whose run ended before anyone answered (its container died, say).
    buttons = await desk.ask(
        NewQuestion(
            chat_id=CHAT, run_id="run-000001", kind=QuestionKind.ASK, text="Which?", options=("a", "b"),
            audience=Audience.ASKERS, expires_at=time.time() + 60, ask_id="ask-000002",
        )
    )  # fmt: skip
    assert await runs.finish("run-000001", RunStatus.FAILED, error="its container died")
    press = CardPress(
        chat_id=CHAT, chat_kind="group", user_id=ALICE, user_name="Alice", action=CardAction.ANSWER,
        run_id=buttons.id, press_id="p1", message_id=QUESTION_MESSAGE + 1, option=0,
    )  # fmt: skip
    answer = await presses.press(press)
    assert answer.text == "This question is closed (its run ended (failed))."
    closed = await desk.store.get(buttons.id)
    assert closed is not None and closed.status is QuestionStatus.ENDED and closed.answer is None


async def test_a_question_past_its_time_is_closed_by_a_press(db: Database) -> None:
    """Its waiter is gone (the bot restarted while a door's question was open): a tap after its time says so."""
    await ChatStore(db).ensure(CHAT, "group", "g")
    desk = Questions(QuestionStore(db))
    presses = QuestionPresses(desk, RunStore(db), TurnStore(db), admins_only)
    old = await desk.ask(
        NewQuestion(
            chat_id=CHAT, run_id=None, kind=QuestionKind.TOPUP, text="Top up?", options=("Add",),
            audience=Audience.ADMINS, expires_at=time.time() - 1,
        )
    )  # fmt: skip
    press = CardPress(
        chat_id=CHAT, chat_kind="group", user_id=ADMIN, user_name="Ada", action=CardAction.ANSWER,
        run_id=old.id, press_id="p2", option=0,
    )  # fmt: skip
    assert (await presses.press(press)).text == "Nobody answered in time: this question is closed."
    closed = await desk.store.get(old.id)
    assert closed is not None and closed.status is QuestionStatus.EXPIRED and closed.answered_by is None
