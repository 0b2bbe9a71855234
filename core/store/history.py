"""Search through every stored message of one chat: the FTS5 trigram index that migration 0018 builds and its
triggers keep in step with `messages` (deleted messages leave it). A query is words, never FTS5 syntax: each
word is matched literally, so `"a" NEAR/3 OR *` looks for the letters, not for an operator."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from core.store.db import Database

MAX_QUERY_CHARS = 200  # of a query, the rest ignored: a 10 KB query costs as much as a short one
MAX_TERMS = 8  # words of a query; all must occur in a message
TRIGRAM_CHARS = 3  # the index matches words of at least 3 characters; a query of only shorter ones uses LIKE
# Words shorter than a trigram alone (`AI`, two CJK characters) cannot use the index: they are looked for with
# LIKE in the chat's newest messages only, so such a query stays bounded in a chat of millions.
MAX_LIKE_SCAN_MESSAGES = 20_000
# The index is shared by every chat: a word's postings are walked newest first and the chat, `since` and
# `author` filtered after. The walk reads at most this many postings of the query's rarest word (each other word
# looked up at those rows), so a search in a small chat (or for an author who never wrote it, or for common words
# that never occur together) does not walk the whole index while it holds the one database connection.
MAX_WALK_POSTINGS = 20_000
SNIPPET_CHARS = 240  # of a message's text around the first match
INDEX_TABLES = ("messages_fts_data", "messages_fts_idx", "messages_fts_docsize", "messages_fts_config")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Hit:
    message_id: int  # messages.id
    timestamp: float
    sender_name: str
    snippet: str


@dataclass(frozen=True, slots=True)
class Found:
    hits: list[Hit]
    cut: bool  # fewer than asked, and the walk stopped at its bound: older messages were not looked at


class SearchRefused(ValueError):
    """The query has nothing to look for, or a filter cannot be read."""


@dataclass(frozen=True, slots=True)
class Query:
    """A query as the store runs it: the words for the index (quoted: literal), and those too short for it."""

    indexed: tuple[str, ...]
    short: tuple[str, ...]

    @property
    def words(self) -> tuple[str, ...]:
        return self.indexed + self.short

    def match_expression(self) -> str:
        return " ".join(_phrase(word) for word in self.indexed)


def _phrase(word: str) -> str:
    """A word as an FTS5 literal phrase: only \\w characters reach here, so no quote can end the string."""
    return f'"{word}"'


def parse_query(text: str) -> Query:
    head = text[: MAX_QUERY_CHARS + 1]
    if len(head) > MAX_QUERY_CHARS:  # cut at a space: half a word would ask for a word nobody wrote
        head = (head[:MAX_QUERY_CHARS].rsplit(maxsplit=1) or [""])[0]
    # lower(), not casefold(): the trigram tokenizer folds case letter by letter, and never turns ß into ss.
    words = list(dict.fromkeys(word.lower() for word in _WORD.findall(head)))[:MAX_TERMS]
    if not words:
        raise SearchRefused("the query has no words to look for")
    indexed = tuple(w for w in words if len(w) >= TRIGRAM_CHARS)
    # Beside a longer word a short one is mostly "on", "we", "a": required it would only lose matches.
    return Query(indexed=indexed, short=() if indexed else tuple(words))


def parse_since(text: str | None) -> float | None:
    """`2026-11-23` or an ISO date-time (UTC unless it says otherwise) as unix seconds; None: no bound."""
    if text is None or not text.strip():
        return None
    try:
        when = datetime.fromisoformat(text.strip()[:40])
    except ValueError as exc:
        raise SearchRefused(f"since must be a date like 2026-11-23, not {text[:40]!r}") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _folds_in(text: object, wanted: object) -> bool:
    """SQLite's `folds_in(text, wanted)`: `wanted` (casefolded) occurs in `text` in any case, in any script
    (SQLite's own LIKE folds ASCII letters only: `élodie` would not find `Élodie`)."""
    return str(wanted) in str(text).casefold()


def _lowered_in(text: object, word: object) -> bool:
    """SQLite's `lowered_in(text, word)`: `word` (lower-cased) occurs in `text` as the trigram index matches it,
    case folded letter by letter (`case_sensitive 0`)."""
    return str(word) in str(text).lower()


def snippet(content: str, words: tuple[str, ...], width: int = SNIPPET_CHARS) -> str:
    """The text around the first word found, on one line, at most `width` characters and marks of the cut."""
    flat = " ".join(content.split())
    folded = flat.lower()  # may differ in length from `flat` for a few letters: then the start is approximate
    found = [i for i in (folded.find(word) for word in words) if i >= 0]
    at = min(found) if found else 0
    start = max(0, min(at - width // 3, len(flat) - width))
    cut = flat[start : start + width]
    return ("…" if start > 0 else "") + cut + ("…" if start + width < len(flat) else "")


class HistoryIndex:
    def __init__(
        self, db: Database, walk_postings: int = MAX_WALK_POSTINGS, like_scan: int = MAX_LIKE_SCAN_MESSAGES
    ) -> None:
        self._db = db
        self._walk = walk_postings
        self._like_scan = like_scan
        self._function_on: object = None  # the connection `folds_in` was registered on

    async def search(
        self, chat_id: int, query: Query, limit: int, since: float | None = None, author: str | None = None
    ) -> Found:
        """At most `limit` messages of the chat that contain every word, newest first; `cut` when the walk
        stopped at its bound before finding that many."""
        if self._function_on is not self._db.conn:
            await self._db.conn.create_function("folds_in", 2, _folds_in, deterministic=True)
            await self._db.conn.create_function("lowered_in", 2, _lowered_in, deterministic=True)
            self._function_on = self._db.conn
        filters, params = ["m.chat_id = ?"], list[object]([chat_id])
        if since is not None:
            filters.append("m.timestamp >= ?")
            params.append(since)
        if author and author.strip():
            filters.append("folds_in(m.sender_name, ?)")
            params.append(author.strip()[:64].casefold())
        for word in query.short:
            filters.append("folds_in(m.content, ?)")
            params.append(word.casefold())
        where = " AND ".join(filters)
        if query.indexed:
            driver, more = await self._driver(query)
            # The rarest word's postings are walked newest first in a subquery of their own, bounded: its LIMIT
            # keeps it from being flattened into the join, and CROSS JOIN keeps it the outer loop, read in its
            # order (no ORDER BY outside: that would sort the whole bounded walk before LIMIT could stop it; the
            # few rows are sorted below). The other words are checked in each row's text, as the index matches
            # them (a case-folded substring). FTS5's own AND would walk every word's postings until they meet (the
            # whole index, for two common words that never occur together: a rowid bound does not stop it), and
            # a lookup in the index per row costs a third of a millisecond; the planner, left to itself, may walk
            # the chat's messages and probe the index for each; bm25 order would score every match first.
            walk = "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid DESC LIMIT ?"
            also = [w for w in query.indexed if w != driver]
            lookups = "".join(" AND lowered_in(m.content, ?)" for _ in also)
            sql = (
                f"SELECT m.id, m.timestamp, m.sender_name, m.content FROM ({walk}) AS f "
                f"CROSS JOIN messages AS m ON m.id = f.rowid WHERE {where}{lookups} LIMIT ?"
            )
            values: list[object] = [_phrase(driver), self._walk, *params, *also, limit]
            async with self._db.conn.execute(sql, values) as cursor:
                rows = sorted(await cursor.fetchall(), key=lambda row: int(row[0]), reverse=True)
            # Cut when fewer were found than asked and the rarest word has older postings than the walk read.
            cut = len(rows) < limit and more
        else:
            sql = (
                "SELECT m.id, m.timestamp, m.sender_name, m.content FROM (SELECT * FROM messages WHERE chat_id = ? "
                f"ORDER BY id DESC LIMIT ?) AS m WHERE {where} ORDER BY m.id DESC LIMIT ?"
            )
            values = [chat_id, self._like_scan, *params, limit]
            async with self._db.conn.execute(sql, values) as cursor:
                rows = sorted(await cursor.fetchall(), key=lambda row: int(row[0]), reverse=True)
            cut = False
            if len(rows) < limit:  # was there more to walk than the bound let it? (as bounded a walk again)
                beyond = "SELECT 1 FROM messages WHERE chat_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?"
                async with self._db.conn.execute(beyond, (chat_id, self._like_scan)) as cursor:
                    cut = await cursor.fetchone() is not None
        hits = [Hit(int(r[0]), float(r[1]), str(r[2]), snippet(str(r[3]), query.words)) for r in rows]
        return Found(hits, cut)

    async def _driver(self, query: Query) -> tuple[str, bool]:
        """The word with the fewest postings (each counted up to the bound + 1, a bounded walk of its own), and
        whether it has more than the bound: the walk reads at most that many of its postings."""
        count = (
            "SELECT COUNT(*) FROM (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? "
            "ORDER BY rowid DESC LIMIT ?)"
        )
        fewest, driver = self._walk + 2, query.indexed[0]
        for word in query.indexed:
            async with self._db.conn.execute(count, (_phrase(word), self._walk + 1)) as cursor:
                row = await cursor.fetchone()
            found = int(row[0]) if row else 0
            if found < fewest:
                fewest, driver = found, word
        return driver, fewest > self._walk

    async def size_bytes(self) -> int:
        """What the index takes on disk (its shadow tables' pages)."""
        return await self._table_bytes(INDEX_TABLES, "SELECT COALESCE(SUM(LENGTH(block)), 0) FROM messages_fts_data")

    async def messages_bytes(self) -> int:
        """What the messages it indexes take on disk (their table and its indexes)."""
        async with self._db.conn.execute(
            "SELECT name FROM sqlite_master WHERE tbl_name = 'messages' AND type IN ('table', 'index')"
        ) as cursor:
            names = tuple(str(row[0]) for row in await cursor.fetchall())
        return await self._table_bytes(names, "SELECT COALESCE(SUM(LENGTH(content)), 0) FROM messages")

    async def _table_bytes(self, names: tuple[str, ...], fallback: str) -> int:
        marks = ", ".join("?" for _ in names)
        try:
            sql = f"SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE aggregate = TRUE AND name IN ({marks})"
            async with self._db.conn.execute(sql, names) as cursor:
                row = await cursor.fetchone()
        except Exception:  # an SQLite built without dbstat: the bytes of the content, without page overhead
            async with self._db.conn.execute(fallback) as cursor:
                row = await cursor.fetchone()
        return int(row[0]) if row else 0
