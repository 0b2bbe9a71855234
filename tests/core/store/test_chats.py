"""ChatStore remembers the chats it wrote, the most recently seen up to its bound (core/store/chats.py)."""

from __future__ import annotations

from core.store import ChatStore, Database


async def changes_of(db: Database, chats: ChatStore, chat_id: int) -> int:
    """Rows the database changed for one `ensure` of the chat as it is (0: it was remembered)."""
    before = db.conn.total_changes
    await chats.ensure(chat_id, "group", f"chat {chat_id}")
    return db.conn.total_changes - before


async def test_a_remembered_chat_needs_no_write_and_the_least_recently_seen_is_forgotten(db: Database) -> None:
    chats = ChatStore(db, kept=3)
    for chat_id in (-1, -2, -3):
        assert await changes_of(db, chats, chat_id) == 1
    assert await changes_of(db, chats, -1) == 0  # remembered, and now the most recently seen
    assert await changes_of(db, chats, -4) == 1  # a fourth: -2, the least recently seen, is forgotten
    assert await changes_of(db, chats, -1) == 0
    assert await changes_of(db, chats, -3) == 0
    assert await changes_of(db, chats, -2) == 1  # written again, as a new chat would be
    assert (await chats.get(-2)) == await chats.ensure(-2, "group", "chat -2")


async def test_many_chats_leave_only_the_bound_remembered(db: Database) -> None:
    chats = ChatStore(db, kept=10)
    for chat_id in range(-1, -201, -1):
        await chats.ensure(chat_id, "group", f"chat {chat_id}")
    rewritten = [chat_id for chat_id in range(-1, -201, -1) if await changes_of(db, chats, chat_id)]
    assert len(rewritten) == 200  # each pass through 200 chats forgets each before it is seen again
    assert [c for c in range(-191, -201, -1) if await changes_of(db, chats, c)] == []  # the last ten remembered
