"""Memory on a real store: 10,000 remembers keep the chat's limit, the prompt's notes stay within their budget
(50 notes of 500 characters), notes are one quoted line each, and a subagent's task gets room for its own text
before any note."""

from __future__ import annotations

import pytest

from bot.agent.memory import (
    CHAT_HEADING,
    PROPOSE,
    SUBAGENT_NOTES,
    Askers,
    Memory,
    MemoryLimits,
    NoteRefused,
    clean_text,
)
from core.store import ChatStore, Database
from core.store.history import HistoryIndex
from core.store.messages import MessageStore, NewMessage, StoredMessage
from core.store.notes import NoteStore

CHAT = -100123
ALICE, BOB = 11, 12
LIMITS = MemoryLimits(max_notes=50, max_member_notes=20, note_chars=500, prompt_chars=6000, search_results=10)


@pytest.fixture
async def memory(db: Database, chats: ChatStore) -> Memory:
    await chats.ensure(CHAT, "supergroup", "Team")
    return Memory(NoteStore(db), HistoryIndex(db), LIMITS)


def spoke(sender_id: int, name: str) -> StoredMessage:
    return StoredMessage(1, CHAT, name, "hi", sender_id, None, 0.0, False, True, None, "text")


async def test_ten_thousand_remembers_keep_fifty(memory: Memory) -> None:
    answers = [await memory.remember(CHAT, f"fact {n}", ALICE, "Alice", None) for n in range(10_000)]

    assert sum(a.startswith("Kept as note") for a in answers) == 50
    assert answers[-1].startswith("Not kept: this chat keeps at most 50 notes")
    assert len(await memory.notes.chat_notes(CHAT, 10_000)) == 50


async def test_fifty_long_notes_stay_within_the_prompt_budget(memory: Memory) -> None:
    for n in range(50):
        await memory.remember(CHAT, f"{n:02d} " + "w" * 496, ALICE, "Alice", 1000 + n)
    for n in range(20):
        await memory.remember_about(CHAT, "Bob", f"bob {n:02d} " + "b" * 480, only(BOB, "Bob"))

    section = await memory.prompt_section(CHAT, [spoke(BOB, "Bob")])

    assert len(section) <= LIMITS.prompt_chars + 600  # headings and the "not shown" lines besides the notes
    assert section.startswith(CHAT_HEADING)
    assert '"49 www' in section and '"00 www' not in section  # newest first; the oldest make room
    assert "older notes not shown: /memory lists them all." in section
    assert "bob 19" in section and "older member notes not shown" in section


async def test_member_notes_only_of_members_in_the_window(memory: Memory) -> None:
    await memory.remember_about(CHAT, "me", "Alice is on call this week", only(ALICE, "Alice"))

    assert "on call" not in await memory.prompt_section(CHAT, [spoke(BOB, "Bob")])
    assert "on call" in await memory.prompt_section(CHAT, [spoke(ALICE, "Alice")])


async def test_notes_are_one_clean_quoted_line() -> None:
    assert clean_text("  a\n\nb\t\u202ec\x00d  ", 500) == "a b c d"
    for bad in ("", " \n\t ", "\x00\x01"):
        with pytest.raises(NoteRefused, match="empty"):
            clean_text(bad, 500)
    with pytest.raises(NoteRefused, match="1,048,576 characters"):
        clean_text("x" * 1_048_576, 500)


def only(user: int, name: str, message_id: int = 1) -> Askers:
    return Askers((user,), {user: name}, {user: message_id})


async def test_remember_about_resolves_only_the_one_asker(memory: Memory) -> None:
    both = Askers((BOB, ALICE, BOB), {ALICE: "Alice", BOB: "Bob"}, {BOB: 12, ALICE: 11})

    assert "about Bob" in await memory.remember_about(CHAT, "@bob", "Bob likes tea", only(BOB, "Bob", 12))
    assert "Not kept" in await memory.remember_about(CHAT, "me", "ambiguous with two askers", both)
    assert "Not kept" in await memory.remember_about(CHAT, "Mallory", "Mallory is admin", both)
    assert "Not kept" in await memory.remember_about(CHAT, "Bob", "x", only(ALICE, "Alice"))
    several = await memory.remember_about(CHAT, "Bob", "Bob obeys Alice", both)
    assert several.startswith("Not kept: several members asked in this turn (Bob, Alice)")
    scheduled = Askers((None, BOB), {BOB: "Bob"}, {None: 10, BOB: 12})  # a scheduled prompt merged with Bob's
    assert "Not kept: several members asked" in await memory.remember_about(CHAT, "Bob", "x", scheduled)
    assert [(n.about_user_id, n.message_id) for n in await memory.notes.member_notes(CHAT, [BOB], 5)] == [(BOB, 12)]


async def test_a_subagent_task_keeps_its_room(memory: Memory) -> None:
    await memory.remember(CHAT, "The picnic is on Saturday", ALICE, "Alice", None)
    await memory.remember_about(CHAT, "me", "Alice is allergic", only(ALICE, "Alice"))

    full = await memory.subagent_notes(CHAT, 100_000)
    tight = await memory.subagent_notes(CHAT, len(PROPOSE) + 10)

    assert full.startswith(SUBAGENT_NOTES) and '"The picnic is on Saturday"' in full and "allergic" not in full
    assert tight == PROPOSE  # no room for notes: the task is never cut for them
    assert await memory.subagent_notes(CHAT, 5) == ""


async def test_search_answers_bad_queries_in_words(memory: Memory, messages: MessageStore) -> None:
    await messages.add(NewMessage(CHAT, "Bob", 'we said "near" the lake', sender_id=BOB))

    assert await memory.search(CHAT, "", None, None) == "Not searched: the query has no words to look for."
    assert (await memory.search(CHAT, "lake", "next friday", None)).startswith("Not searched: since must be a date")
    assert "No stored message" in await memory.search(CHAT, "x" * 10_000, None, None)
    found = await memory.search(CHAT, '"a" NEAR/3 OR *', None, None)
    assert found.startswith("1 stored message(s), newest first") and 'Bob: "we said \\"near\\" the lake"' in found


async def test_a_cut_search_says_it_was_cut(db: Database, chats: ChatStore, messages: MessageStore) -> None:
    other = -100999
    await chats.ensure(CHAT, "supergroup", "Team")
    await chats.ensure(other, "supergroup", "Busy")
    memory = Memory(NoteStore(db), HistoryIndex(db, walk_postings=20), LIMITS)
    lake = await messages.add(NewMessage(CHAT, "Bob", "the lake house, booked", sender_id=BOB))
    for n in range(40):
        await messages.add(NewMessage(other, "Eve", f"lake {n}", sender_id=99))

    cut = await memory.search(CHAT, "lake", None, None)
    found = await memory.search(CHAT, "lake booked", None, None)

    assert cut.startswith("No stored message of this chat matches. The search stopped at the newest")
    assert "more distinctive words reach older ones" in cut
    assert found.startswith("1 stored message(s)") and f"#{lake} " in found and "stopped" not in found
