"""Memory: `search_history` over a chat of 1,000,000 stored messages (200,000 with `--quick`) against a plain
LIKE scan of the same messages, the index's size against the messages', migration 0018's time on a store of
100,000 messages against copying them, and what 50 notes of 500 characters add to a prompt.

The messages are made up from a fixed vocabulary with a Zipf-like spread (a few words in most messages, most
words rare), 30 s apart, with a decision about a venue planted among them; queries mix a rare word, two words
of middling frequency, a common word, and the decision's words. Both sides return the same 10 messages at most
for the chat, newest first.
"""

from __future__ import annotations

import itertools
import random
import time

from bench.common import BenchContext, bench_settings, ms
from bench.report import Measure, Row
from bot.agent.memory import Memory, MemoryLimits
from bot.agent.prompt import build_prompt
from core.store.db import MIGRATIONS_DIR, Database
from core.store.history import HistoryIndex, parse_query
from core.store.notes import NewNote
from core.stores import Stores

NAME = "history"
SIZES = {False: 1_000_000, True: 200_000}
MIGRATION_MESSAGES = 100_000
BATCH_ROWS = 20_000
SEARCH_LIMIT = 10
RARE_WORD = "quokkaberry"  # in 3 of the first messages only: a LIKE scan reads the whole chat to find them
CHARS_PER_TOKEN = 4  # English prose with OpenAI's and Anthropic's tokenizers: about 4 characters a token
_INSERT = (
    "INSERT INTO messages (chat_id, sender_id, sender_name, content, timestamp, is_trigger) VALUES (?, ?, ?, ?, ?, ?)"
)
# English's letters by frequency (per mille), so the words share trigrams as a language's do.
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
_LETTER_WEIGHTS = (127, 91, 82, 75, 70, 67, 63, 61, 60, 43, 40, 28, 28, 24, 24, 22, 20, 20, 19, 15, 10, 8, 2, 2, 1, 1)
_LIKE_SQL = (
    "SELECT id, timestamp, sender_name, content FROM messages WHERE chat_id = ? {likes} ORDER BY id DESC LIMIT ?"
)


def _vocabulary(rng: random.Random) -> list[str]:
    words: dict[str, None] = {}
    while len(words) < 8_000:
        words["".join(rng.choices(_LETTERS, _LETTER_WEIGHTS, k=rng.randint(3, 9)))] = None
    return list(words)  # in the order drawn: a word's rank (its frequency) has nothing to do with its letters


def _rows(chat_id: int, count: int, vocabulary: list[str], rng: random.Random) -> list[tuple[object, ...]]:
    cumulative = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(vocabulary))))
    start = time.time() - count * 30
    rows: list[tuple[object, ...]] = []
    for k in range(count):
        words = rng.choices(vocabulary, cum_weights=cumulative, k=rng.randint(3, 14))
        rows.append((chat_id, 3000 + k % 9, f"User {k % 9}", " ".join(words), start + k * 30, int(k % 5 == 0)))
    return rows


async def _fill(db: Database, rows: list[tuple[object, ...]]) -> float:
    started = time.perf_counter()
    for at in range(0, len(rows), BATCH_ROWS):
        async with db.transaction() as conn:
            await conn.executemany(_INSERT, rows[at : at + BATCH_ROWS])
    return time.perf_counter() - started


async def _like_scan(db: Database, chat_id: int, words: tuple[str, ...]) -> int:
    likes = " ".join("AND content LIKE ?" for _ in words)
    params = [chat_id, *(f"%{w}%" for w in words), SEARCH_LIMIT]
    async with db.conn.execute(_LIKE_SQL.format(likes=likes), params) as cursor:
        return len(list(await cursor.fetchall()))


async def _searches(ctx: BenchContext, stores: Stores, chat_id: int, vocabulary: list[str]) -> list[Row]:
    queries = {
        "a rare word": RARE_WORD,
        "two middling words": f"{vocabulary[300]} {vocabulary[900]}",
        "a common word": vocabulary[2],
        "the decision's words": "venue decided",
    }
    index = HistoryIndex(stores.db)
    rounds = ctx.scaled(15, 5)
    product: dict[str, list[float]] = {kind: [] for kind in queries}
    baseline: dict[str, list[float]] = {kind: [] for kind in queries}
    found: dict[str, tuple[int, int]] = {}
    for _ in range(rounds):  # interleaved: drift in the machine's load hits both alike
        for kind, text in queries.items():
            query = parse_query(text)
            t0 = time.perf_counter()
            hits = (await index.search(chat_id, query, SEARCH_LIMIT)).hits
            product[kind].append(ms(time.perf_counter() - t0))
            t0 = time.perf_counter()
            scanned = await _like_scan(stores.db, chat_id, query.words)
            baseline[kind].append(ms(time.perf_counter() - t0))
            found[kind] = (len(hits), scanned)
    ctx.note(f"search: {rounds} rounds of each query; hits (product, LIKE) {found}")
    every = [s for samples in product.values() for s in samples]
    every_baseline = [s for samples in baseline.values() for s in samples]
    rows = [
        Row(
            bench=NAME,
            metric="search_history, all queries (goal p50 ≤ 20 ms)",
            unit="ms",
            result=Measure.of(every),
            baseline_label="LIKE scan of the chat's messages",
            baseline=Measure.of(every_baseline),
        )
    ]
    rows += [
        Row(
            bench=NAME,
            metric=f"search_history, {kind}",
            unit="ms",
            result=Measure.of(product[kind]),
            baseline_label="LIKE scan",
            baseline=Measure.of(baseline[kind]),
        )
        for kind in queries
    ]
    return rows


async def _migration(ctx: BenchContext, vocabulary: list[str], rng: random.Random) -> Row:
    """Migration 0018 on a store at schema 17 with MIGRATION_MESSAGES messages, against copying them."""
    before = ctx.work_dir / "migrations-17"
    before.mkdir(exist_ok=True)
    for entry in MIGRATIONS_DIR.iterdir():
        if entry.name.endswith(".sql") and int(entry.name[:4]) <= 17:
            (before / entry.name).write_text(entry.read_text(encoding="utf-8"))
    rows = _rows(ctx.chat_id(1), MIGRATION_MESSAGES, vocabulary, rng)
    migrate: list[float] = []
    copy: list[float] = []
    for sample in range(ctx.scaled(3, 1)):
        path = ctx.work_dir / f"migrate-{sample}.sqlite3"
        db = await Database.open(path, before)
        async with db.transaction() as conn:
            await conn.execute(
                "INSERT INTO chats (id, kind, title, folder, created_at) VALUES (?, 'group', 'b', ?, 0)",
                (ctx.chat_id(1), f"b{sample}"),
            )
        await _fill(db, rows)
        t0 = time.perf_counter()
        async with db.transaction() as conn:
            await conn.execute("CREATE TABLE messages_copy AS SELECT * FROM messages")
        copy.append(time.perf_counter() - t0)
        async with db.transaction() as conn:
            await conn.execute("DROP TABLE messages_copy")
        await db.close()
        t0 = time.perf_counter()
        db = await Database.open(path)  # applies 0018: builds the index of the messages already there
        migrate.append(time.perf_counter() - t0)
        await db.close()  # the worker's folder goes at its end, these stores with it
    return Row(
        bench=NAME,
        metric=f"migration 0018 on {MIGRATION_MESSAGES:,} stored messages",
        unit="s",
        result=Measure.of(migrate),
        baseline_label="copying those messages (CREATE TABLE AS SELECT)",
        baseline=Measure.of(copy),
    )


async def _prompt_notes(ctx: BenchContext, stores: Stores, chat_id: int) -> Row:
    """The prompt of a turn without notes and with 50 of 500 characters (all the default settings allow)."""
    settings = bench_settings(ctx.work_dir / "data")
    memory = Memory(stores.notes, stores.history, MemoryLimits.from_settings(settings))
    prompt = await build_prompt(stores.messages, chat_id, settings.history_window_messages, settings.assistant_name)
    plain = len(prompt.text)
    for n in range(settings.memory_max_notes):
        text = f"Note {n:02d}: " + "the group agreed on this point after a long discussion, " * 9
        await stores.notes.add(NewNote(chat_id, text[: settings.memory_note_chars], 3001, "User 1", n + 1), 50)
    section = await memory.prompt_section(chat_id, prompt.window)
    added = len(section) + 2
    ctx.note(
        f"prompt: {plain:,} characters without notes, +{added:,} with 50 notes of {settings.memory_note_chars} "
        f"(MEMORY_PROMPT_CHARS {settings.memory_prompt_chars:,}); tokens at {CHARS_PER_TOKEN} characters each; "
        f"the allowances' upper bound (a token a UTF-8 byte) is +{len(section.encode()) + 2:,}"
    )
    return Row(
        bench=NAME,
        metric="prompt growth with 50 notes of 500 characters (goal ≤ +2,000 tokens)",
        unit="tokens",
        result=Measure.figure(added / CHARS_PER_TOKEN),
        baseline_label="the prompt without notes",
        baseline=Measure.figure(plain / CHARS_PER_TOKEN),
    )


async def run(ctx: BenchContext) -> list[Row]:
    rng = random.Random(39)
    vocabulary = _vocabulary(rng)
    size = SIZES[ctx.quick]
    settings = bench_settings(ctx.work_dir / "data")
    stores = await Stores.open(settings)
    chat_id = ctx.chat_id(0)
    try:
        await stores.chats.ensure(chat_id, "supergroup", "bench history")
        rows = _rows(chat_id, size, vocabulary, rng)
        rows[size // 7] = (chat_id, 3001, "User 1", "OK, decided: the venue is the Old Mill", rows[size // 7][4], 1)
        for k in (10, 20, 30):
            rows[k] = (chat_id, 3002, "User 2", f"who brought the {RARE_WORD} jam?", rows[k][4], 0)
        fill_seconds = await _fill(stores.db, rows)
        del rows
        ctx.note(f"{size:,} messages stored with their index in {fill_seconds:.0f} s")
        result = await _searches(ctx, stores, chat_id, vocabulary)
        index_bytes, messages_bytes = await stores.history.size_bytes(), await stores.history.messages_bytes()
        result.append(
            Row(
                bench=NAME,
                metric=f"history index size, {size:,} messages",
                unit="MB",
                result=Measure.figure(index_bytes / 1e6),
                baseline_label="the messages (table and its indexes)",
                baseline=Measure.figure(messages_bytes / 1e6),
            )
        )
        result.append(await _prompt_notes(ctx, stores, chat_id))
    finally:
        await stores.db.close()
    result.append(await _migration(ctx, vocabulary, rng))
    return result
