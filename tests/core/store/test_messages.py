"""MessageStore: duplicates ignored, a bounded oldest-first window per chat, counts."""

from __future__ import annotations

from core.store import ChatStore, MessageStore, NewMessage
from core.store.chats import folder_for_chat

CHAT = -100123
OTHER = 77


async def add_chats(chats: ChatStore) -> None:
    await chats.ensure(CHAT, "supergroup", "Team")
    await chats.ensure(OTHER, "private", None)


def msg(chat_id: int, content: str, platform_id: int | None = None, *, is_bot: bool = False) -> NewMessage:
    return NewMessage(
        chat_id=chat_id, sender_name="Alice", content=content, platform_message_id=platform_id, is_bot=is_bot
    )


async def test_stored_message_round_trips(chats: ChatStore, messages: MessageStore) -> None:
    await add_chats(chats)

    row_id = await messages.add(
        NewMessage(
            chat_id=CHAT,
            sender_name="Bob",
            content="hello <world> & 😀",
            sender_id=9,
            platform_message_id=11,
            timestamp=1_700_000_000.5,
            is_trigger=True,
            reply_to=10,
        )
    )

    assert row_id is not None
    stored = await messages.get(row_id)
    assert stored is not None
    assert (stored.chat_id, stored.sender_name, stored.content) == (CHAT, "Bob", "hello <world> & 😀")
    assert (stored.sender_id, stored.platform_message_id, stored.reply_to) == (9, 11, 10)
    assert stored.timestamp == 1_700_000_000.5
    assert stored.is_trigger is True
    assert stored.is_bot is False
    assert stored.kind == "text"


async def test_duplicate_platform_message_is_ignored(chats: ChatStore, messages: MessageStore) -> None:
    await add_chats(chats)

    first = await messages.add(msg(CHAT, "once", platform_id=5))
    second = await messages.add(msg(CHAT, "again", platform_id=5))

    assert first is not None
    assert second is None
    assert await messages.count(CHAT) == 1
    window = await messages.recent(CHAT, 10)
    assert [m.content for m in window] == ["once"]


async def test_same_platform_id_in_another_chat_is_stored(chats: ChatStore, messages: MessageStore) -> None:
    await add_chats(chats)

    assert await messages.add(msg(CHAT, "a", platform_id=5)) is not None
    assert await messages.add(msg(OTHER, "b", platform_id=5)) is not None


async def test_messages_without_platform_id_are_never_duplicates(chats: ChatStore, messages: MessageStore) -> None:
    await add_chats(chats)

    ids = [await messages.add(msg(CHAT, "bot says", is_bot=True)) for _ in range(3)]

    assert None not in ids
    assert len(set(ids)) == 3
    assert await messages.count(CHAT) == 3


async def test_recent_is_bounded_oldest_first_and_per_chat(chats: ChatStore, messages: MessageStore) -> None:
    await add_chats(chats)
    for i in range(10):
        await messages.add(msg(CHAT, f"chat-{i}", platform_id=i))
        await messages.add(msg(OTHER, f"other-{i}", platform_id=i))

    window = await messages.recent(CHAT, 4)

    assert [m.content for m in window] == ["chat-6", "chat-7", "chat-8", "chat-9"]
    assert all(m.chat_id == CHAT for m in window)
    assert [m.id for m in window] == sorted(m.id for m in window)
    assert len(await messages.recent(CHAT, 100)) == 10


async def test_recent_up_to_id(chats: ChatStore, messages: MessageStore) -> None:
    await add_chats(chats)
    ids = [await messages.add(msg(CHAT, f"m{i}", platform_id=i)) for i in range(6)]
    assert ids[3] is not None

    window = await messages.recent(CHAT, 2, up_to_id=ids[3])

    assert [m.content for m in window] == ["m2", "m3"]


async def test_recent_of_unknown_chat_is_empty(messages: MessageStore) -> None:
    assert await messages.recent(555, 10) == []


async def test_counts(chats: ChatStore, messages: MessageStore) -> None:
    await add_chats(chats)
    for i in range(3):
        await messages.add(msg(CHAT, "x", platform_id=i))
    await messages.add(msg(OTHER, "y", platform_id=1))

    assert await messages.count(CHAT) == 3
    assert await messages.count(OTHER) == 1
    assert await messages.count(12345) == 0
    assert await messages.count() == 4


async def test_chat_folder_names_are_safe_and_distinct(chats: ChatStore) -> None:
    group = await chats.ensure(-100123, "supergroup", "Old title")
    private = await chats.ensure(100123, "private", None)
    renamed = await chats.ensure(-100123, "supergroup", "New title")

    assert group.folder == folder_for_chat(-100123) == "chat_m100123"
    assert private.folder == "chat_100123"
    assert renamed.title == "New title"
    assert renamed.folder == group.folder
    assert await chats.by_folder("chat_m100123") == renamed
