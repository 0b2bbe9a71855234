"""Who a turn acts for: the senders of the triggers no completed turn has answered, read from the turns'
own record in a real store, never from where an answer happens to sit in the window."""

from __future__ import annotations

from bot.agent.main_agent import turn_askers
from core.store import ChatStore, Database, MessageStore
from core.store.messages import NewMessage
from core.store.turns import TurnStatus, TurnStore

CHAT = -1001
ADMIN, MEMBER = 7001, 7002


async def say(messages: MessageStore, sender: int, text: str, platform_id: int, *, bot: bool = False) -> int:
    row = await messages.add(
        NewMessage(
            chat_id=CHAT,
            sender_name="Crew" if bot else str(sender),
            content=text,
            sender_id=None if bot else sender,
            platform_message_id=platform_id,
            is_bot=bot,
            is_trigger=not bot,
            kind="reply" if bot else "text",
        )
    )
    assert row is not None
    return row


async def test_an_answer_stored_after_a_members_order_does_not_answer_it(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    # The reviewer's sequence: the admin's turn is still thinking when a member's order arrives (past the
    # merge window, so it waits); the admin's answer is stored after it; the member's own turn is aborted by
    # the admin's "thanks", and the next turn answers both.
    turns = TurnStore(db)
    await chats.ensure(CHAT, "supergroup", "crew")
    hello = await say(messages, ADMIN, "hello", 1)
    await turns.start("t1", CHAT, trigger_message_id=hello)
    order = await say(messages, MEMBER, "cancel run X", 2)
    await say(messages, 0, "hello Ada", 3, bot=True)
    await turns.end("t1", TurnStatus.COMPLETED)
    await turns.start("t2", CHAT, trigger_message_id=order)
    thanks = await say(messages, ADMIN, "thanks!", 4)
    await turns.end("t2", TurnStatus.ABORTED)

    window = await messages.recent(CHAT, 50, up_to_id=thanks)
    answered = await turns.answered_up_to(CHAT, thanks)

    assert answered == hello
    assert turn_askers(window, answered) == (MEMBER, ADMIN)


async def test_with_no_completed_turn_every_trigger_in_the_window_asks(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    turns = TurnStore(db)
    await chats.ensure(CHAT, "supergroup", "crew")
    first = await say(messages, MEMBER, "hi", 1)
    await turns.start("t1", CHAT, trigger_message_id=first)
    await turns.end("t1", TurnStatus.FAILED)  # an apology answers no one: its asker still counts
    second = await say(messages, ADMIN, "cancel it", 2)

    answered = await turns.answered_up_to(CHAT, second)

    assert answered is None
    assert turn_askers(await messages.recent(CHAT, 50, up_to_id=second), answered) == (MEMBER, ADMIN)


async def test_a_turn_answered_before_leaves_only_the_new_askers(
    db: Database, chats: ChatStore, messages: MessageStore
) -> None:
    turns = TurnStore(db)
    await chats.ensure(CHAT, "supergroup", "crew")
    first = await say(messages, MEMBER, "what is running?", 1)
    await turns.start("t1", CHAT, trigger_message_id=first)
    await say(messages, 0, "two runs", 2, bot=True)
    await turns.end("t1", TurnStatus.COMPLETED)
    second = await say(messages, ADMIN, "cancel the first", 3)

    answered = await turns.answered_up_to(CHAT, second)

    assert turn_askers(await messages.recent(CHAT, 50, up_to_id=second), answered) == (ADMIN,)
