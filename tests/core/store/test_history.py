"""The history index on a real SQLite file: built by migration 0018 for a store that had messages before it,
kept in step by triggers (a deleted message leaves it), one chat's search never sees another's, and a query
is words, never FTS5 syntax."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.store import ChatStore, Database, MessageStore, NewMessage
from core.store.db import MIGRATIONS_DIR
from core.store.history import (
    MAX_TERMS,
    Found,
    HistoryIndex,
    Query,
    SearchRefused,
    parse_query,
    parse_since,
    snippet,
)

CHAT, OTHER = -100123, -100456
MONDAY = datetime(2026, 11, 23, 10, 0, tzinfo=UTC).timestamp()


def said(chat_id: int, content: str, sender: str = "Alice", at: float = MONDAY) -> NewMessage:
    return NewMessage(chat_id=chat_id, sender_name=sender, content=content, sender_id=1, timestamp=at)


@pytest.fixture
async def history(db: Database, chats: ChatStore) -> HistoryIndex:
    await chats.ensure(CHAT, "supergroup", "Team")
    await chats.ensure(OTHER, "supergroup", "Elsewhere")
    return HistoryIndex(db)


async def ids(history: HistoryIndex, text: str, chat_id: int = CHAT, **filters: object) -> list[int]:
    hits = (await history.search(chat_id, parse_query(text), 10, **filters)).hits  # type: ignore[arg-type]
    return [hit.message_id for hit in hits]


async def test_a_message_far_back_is_found_with_its_date_author_and_id(
    history: HistoryIndex, messages: MessageStore
) -> None:
    decided = await messages.add(said(CHAT, "OK so we decided: the venue is the Old Mill on Friday", "Bob"))
    for n in range(2000):
        await messages.add(said(CHAT, f"chatter number {n} about lunch", at=MONDAY + n))

    hits = (await history.search(CHAT, parse_query("venue decided"), 10)).hits

    assert [h.message_id for h in hits] == [decided]
    assert hits[0].sender_name == "Bob" and hits[0].timestamp == MONDAY
    assert "the venue is the Old Mill" in hits[0].snippet


async def test_search_stays_in_its_chat(history: HistoryIndex, messages: MessageStore) -> None:
    mine = await messages.add(said(CHAT, "the password hint is parrot"))
    await messages.add(said(OTHER, "the password hint is parrot too"))

    assert await ids(history, "parrot") == [mine]


async def test_any_language_and_parts_of_words(history: HistoryIndex, messages: MessageStore) -> None:
    german = await messages.add(said(CHAT, "Wir treffen uns im Café Müller am Montag"))
    chinese = await messages.add(said(CHAT, "会场定在东京塔附近"))
    russian = await messages.add(said(CHAT, "Встреча в пятницу в офисе"))

    assert await ids(history, "CAFÉ müller") == [german]
    assert await ids(history, "东京塔") == [chinese]
    assert await ids(history, "пятницу") == [russian]
    assert await ids(history, "Mont") == [german]  # part of a word


async def test_deleted_and_changed_messages_leave_the_index(
    db: Database, history: HistoryIndex, messages: MessageStore
) -> None:
    gone = await messages.add(said(CHAT, "secret plan alpha"))
    changed = await messages.add(said(CHAT, "first draft beta"))
    async with db.write() as conn:  # as retention would
        await conn.execute("DELETE FROM messages WHERE id = ?", (gone,))
        await conn.execute("UPDATE messages SET content = 'final text gamma' WHERE id = ?", (changed,))

    assert await ids(history, "alpha") == []
    assert await ids(history, "beta") == []
    assert await ids(history, "gamma") == [changed]
    async with db.conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('integrity-check')"):
        pass  # raises when the index and the messages differ


async def test_fts_syntax_is_matched_literally(history: HistoryIndex, messages: MessageStore) -> None:
    near = await messages.add(said(CHAT, "meet me near the station"))
    await messages.add(said(CHAT, "an unrelated message"))

    query = parse_query('"a" NEAR/3 OR *')

    assert query == Query(indexed=("near",), short=())  # the words beside it are too short to matter
    assert [h.message_id for h in (await history.search(CHAT, query, 10)).hits] == [near]
    assert await ids(history, "near station") == [near]
    assert await ids(history, "near unrelated") == []  # every word must occur
    for hostile in ('") OR 1=1 --', "content:secret*", "NOT NOT", "^meet", "{content} : x"):
        await history.search(CHAT, parse_query(hostile), 10)  # never an SQL or FTS5 error


async def test_long_empty_and_short_queries(history: HistoryIndex, messages: MessageStore) -> None:
    short = await messages.add(said(CHAT, "AI is on the agenda"))
    await messages.add(said(CHAT, "nothing here"))

    for empty in ("", "   ", "*** ::: ///", " " * 10_000):
        with pytest.raises(SearchRefused):
            parse_query(empty)
    huge = parse_query("agenda " * 1500)  # 10 KB
    assert huge.words == ("agenda",)
    assert parse_query("x" * 10_000).words == ("x" * 200,)
    assert len(parse_query(" ".join(f"w{n:03d}" for n in range(100))).words) == MAX_TERMS
    assert await ids(history, "AI") == [short]  # shorter than a trigram: LIKE over the newest messages
    assert await ids(history, "AI on") == [short]
    assert await ids(history, "AI xy") == []


async def test_since_and_author_filters(history: HistoryIndex, messages: MessageStore) -> None:
    park = await messages.add(said(CHAT, "venue idea: the park", "Alice", MONDAY - 86_400 * 7))
    bobs = await messages.add(said(CHAT, "venue idea: the pier", "Bob", MONDAY))
    alices = await messages.add(said(CHAT, "venue idea: the mill", "Alice", MONDAY + 60))

    assert await ids(history, "venue") == [alices, bobs, park]  # newest first
    assert await ids(history, "venue", since=parse_since("2026-11-23")) == [alices, bobs]
    assert await ids(history, "venue", author="bob") == [bobs]
    assert await ids(history, "venue", author="100%_") == []  # LIKE's wildcards are literal
    with pytest.raises(SearchRefused):
        parse_since("last monday")


async def test_a_search_in_a_small_chat_walks_a_bounded_part_of_a_big_chats_matches(
    db: Database, history: HistoryIndex, messages: MessageStore
) -> None:
    # The index is every chat's: "venue" in CHAT lies behind OTHER's 300 newer matches. The walk stops after
    # its bound (60 postings here, 20,000 in the product) and says so, instead of walking them all.
    old = await messages.add(said(CHAT, "the venue is the Old Mill"))
    for n in range(300):
        await messages.add(said(OTHER, f"venue chatter {n}", "Bob", MONDAY + n))
    bounded = HistoryIndex(db, walk_postings=60, like_scan=60)

    far = await bounded.search(CHAT, parse_query("venue"), 10)
    nobody = await bounded.search(OTHER, parse_query("venue"), 10, author="Nobody")
    some = await bounded.search(OTHER, parse_query("venue"), 10, author="bob")
    distinct = await bounded.search(CHAT, parse_query("venue mill"), 10)

    assert far.hits == [] and far.cut  # cut, not "nothing matches"
    assert nobody.hits == [] and nobody.cut
    assert len(some.hits) == 10 and not some.cut  # found what was asked: nothing to say
    assert [h.message_id for h in distinct.hits] == [old] and not distinct.cut  # fewer postings: reached
    assert (await history.search(CHAT, parse_query("venue"), 10)) == Found(far.hits + distinct.hits, False)
    # Two words each common, never together: walking their intersection would read both lists to their ends
    # (the whole index) to find nothing. The walk reaches back only to the rarer one's 60th posting, and says so.
    together = await messages.add(said(CHAT, "alpha and omega, together at last"))
    for n in range(200):
        await messages.add(said(OTHER, "alpha" if n % 2 else "omega", "Bob", MONDAY + n))
    apart = await bounded.search(CHAT, parse_query("alpha omega"), 10)
    assert apart.hits == [] and apart.cut
    assert [h.message_id for h in (await history.search(CHAT, parse_query("alpha omega"), 10)).hits] == [together]
    short = await bounded.search(CHAT, parse_query("Ol"), 10)  # the LIKE path: bounded alike
    assert [h.message_id for h in short.hits] == [old] and not short.cut
    assert (await bounded.search(OTHER, parse_query("zz"), 10)).cut


async def test_words_and_authors_match_in_any_case_of_any_script(history: HistoryIndex, messages: MessageStore) -> None:
    street = await messages.add(said(CHAT, "Wir treffen uns in der Hauptstraße 5", "Élodie"))
    greek = await messages.add(said(CHAT, "ΣΥΝΑΝΤΗΣΗ στο γραφείο", "Ørjan"))

    assert await ids(history, "Straße") == [street]  # casefold() would look for "strasse"
    assert await ids(history, "HAUPTSTRASSE") == []  # the index folds case, not ß into ss
    assert await ids(history, "ΣΥΝΑΝΤΗΣΗ") == [greek] and await ids(history, "γραφείο") == [greek]
    assert await ids(history, "treffen", author="élodie") == [street]  # SQLite's LIKE folds ASCII only
    assert await ids(history, "treffen", author="ÉLODIE") == [street]
    assert await ids(history, "γραφείο", author="øRJAN") == [greek]
    assert await ids(history, "treffen", author="Ørjan") == []


def test_snippets_are_one_bounded_line_around_the_match() -> None:
    text = "x" * 1000 + "\nthe venue\nis decided\n" + "y" * 1000

    cut = snippet(text, ("venue",), width=100)

    assert "\n" not in cut and "the venue is decided" in cut
    assert len(cut) <= 102 and cut.startswith("…") and cut.endswith("…")


async def test_the_migration_indexes_an_existing_store(tmp_path: Path) -> None:
    old = tmp_path / "migrations"
    old.mkdir()
    for entry in MIGRATIONS_DIR.iterdir():
        if entry.name.endswith(".sql") and int(entry.name[:4]) < 18:
            (old / entry.name).write_text(entry.read_text(encoding="utf-8"))
    path = tmp_path / "crewbot.sqlite3"
    db = await Database.open(path, old)
    await ChatStore(db).ensure(CHAT, "supergroup", "Team")
    before = await MessageStore(db).add(said(CHAT, "stored before the index existed: harbour"))
    await db.close()
    assert "messages_fts" not in {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}

    db = await Database.open(path)
    try:
        assert await ids(HistoryIndex(db), "harbour") == [before]
        assert await HistoryIndex(db).size_bytes() > 0
    finally:
        await db.close()
