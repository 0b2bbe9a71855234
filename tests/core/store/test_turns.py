"""Who asked for a turn, from the store alone (the status card's buttons ask it for a run's turn): the senders
of the triggers the turn answers, merged ones too, never those a completed turn answered before it."""

from __future__ import annotations

from core.store import ChatStore, Database, MessageStore
from core.store.messages import NewMessage
from core.store.turns import TurnStatus, TurnStore

CHAT, OTHER = -1001, -1002
ANN, BO, CY = 7001, 7002, 7003


async def say(messages: MessageStore, sender: int, text: str, *, chat: int = CHAT, trigger: bool = True) -> int:
    row = await messages.add(
        NewMessage(chat_id=chat, sender_name=f"user {sender}", content=text, sender_id=sender, is_trigger=trigger)
    )
    assert row is not None
    return row


async def answer(messages: MessageStore) -> None:
    await messages.add(NewMessage(chat_id=CHAT, sender_name="Crew", content="ok", is_bot=True, kind="reply"))


async def test_a_turns_askers_are_its_triggers_since_the_last_answered_one(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    turns = TurnStore(db)
    await chats.ensure(CHAT, "supergroup", "crew")
    await chats.ensure(OTHER, "supergroup", "other")
    first = await say(messages, CY, "hello")
    await turns.start("t1", CHAT, trigger_message_id=first)
    await answer(messages)
    await turns.end("t1", TurnStatus.COMPLETED)
    await say(messages, CY, "just chatting", trigger=False)
    await say(messages, CY, "in another chat", chat=OTHER)
    ann = await say(messages, ANN, "background: build it")
    await turns.start("t2", CHAT, trigger_message_id=ann)
    bo = await say(messages, BO, "and test it")  # merged: t2 aborted, t3 answers both
    await turns.end("t2", TurnStatus.ABORTED)
    await turns.start("t3", CHAT, trigger_message_id=bo)

    assert await turns.askers("t3") == [(BO, f"user {BO}"), (ANN, f"user {ANN}")]
    assert await turns.askers("t1") == [(CY, f"user {CY}")]
    assert await turns.askers("t3", limit=1) == [(BO, f"user {BO}")]


async def test_a_turn_no_member_asked_for_has_no_askers(db: Database, chats: ChatStore) -> None:
    turns = TurnStore(db)
    await chats.ensure(CHAT, "supergroup", "crew")
    await turns.start("announce", CHAT, trigger_message_id=None)
    assert await turns.askers("announce") == []
    assert await turns.askers("never") == []
