"""Prompt build: `build_prompt` for a chat with 100, 10,000 and 100,000 stored messages.

All three chats live in one database (bulk-inserted with executemany in one transaction), so only the
chat's own history differs. Each call builds the prompt from the last HISTORY_WINDOW_MESSAGES (default)
messages; the calls for the three chats are interleaved so drift hits them alike. The claim under test:
the cost does not grow with history (ratio against the 100-message chat stays near 1).
"""

from __future__ import annotations

import time

from bench.common import BenchContext, bench_settings, ms
from bench.report import Measure, Row
from bot.agent.prompt import build_prompt
from core.store.messages import NewMessage, insert_params
from core.stores import Stores

NAME = "prompt"
SIZES = (100, 10_000, 100_000)
WARMUP_CALLS = 20
_INSERT = (
    "INSERT INTO messages (chat_id, platform_message_id, sender_id, sender_name, content, timestamp, "
    "is_bot, is_trigger, reply_to, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _history(chat_id: int, size: int) -> list[tuple[object, ...]]:
    start = time.time() - size * 30
    rows = []
    for k in range(size):
        bot = k % 7 == 6
        rows.append(
            insert_params(
                NewMessage(
                    chat_id=chat_id,
                    sender_name="Crew" if bot else f"User {k % 9}",
                    content=f"message {k}: " + "a line of ordinary chat text, neither short nor long. " * (1 + k % 3),
                    sender_id=None if bot else 3000 + k % 9,
                    platform_message_id=k + 1,
                    timestamp=start + k * 30,
                    is_bot=bot,
                    is_trigger=not bot and k % 5 == 0,
                    kind="reply" if bot else "text",
                )
            )
        )
    return rows


async def run(ctx: BenchContext) -> list[Row]:
    calls = ctx.scaled(300, 60)
    settings = bench_settings(ctx.work_dir / "data")
    window = settings.history_window_messages
    stores = await Stores.open(settings)
    timings: dict[int, list[float]] = {size: [] for size in SIZES}
    try:
        chats = {size: ctx.chat_id(i) for i, size in enumerate(SIZES)}
        t_insert = time.perf_counter()
        for size, chat_id in chats.items():
            await stores.chats.ensure(chat_id, "supergroup", f"bench prompt {size}")
            async with stores.db.transaction() as conn:
                await conn.executemany(_INSERT, _history(chat_id, size))
        insert_seconds = time.perf_counter() - t_insert
        for chat_id in chats.values():
            for _ in range(WARMUP_CALLS):
                await build_prompt(stores.messages, chat_id, window, settings.assistant_name)
        lengths: dict[int, int] = {}
        for _ in range(calls):
            for size, chat_id in chats.items():
                t0 = time.perf_counter()
                prompt = await build_prompt(stores.messages, chat_id, window, settings.assistant_name)
                timings[size].append(ms(time.perf_counter() - t0))
                lengths[size] = len(prompt.text)
    finally:
        await stores.db.close()
    ctx.note(
        f"{calls} calls per chat, window {window} messages; prompt lengths {lengths} characters; "
        f"{sum(SIZES):,} rows inserted in {insert_seconds:.1f} s"
    )
    smallest = Measure.of(timings[SIZES[0]])
    rows = [Row(bench=NAME, metric=f"build_prompt, {SIZES[0]:,} stored messages", unit="ms", result=smallest)]
    rows += [
        Row(
            bench=NAME,
            metric=f"build_prompt, {size:,} stored messages",
            unit="ms",
            result=Measure.of(timings[size]),
            baseline_label=f"the {SIZES[0]:,}-message chat",
            baseline=smallest,
        )
        for size in SIZES[1:]
    ]
    return rows
