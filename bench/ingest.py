"""Ingest: messages per second from the (fake) Telegram server through the real PTB path into the store.

The fake Bot API runs in a process of its own (as Telegram would); the bot is the full app with
production defaults (merge window 3 s, group rate limits) and the offline model answering every
triggering message. 1,000 messages over 50 chats, every third one mentioning the bot, are pushed at once.
Start: the push. Stop: all 1,000 are rows in the store (polled every 20 ms). Also shown: until every
triggered turn has answered, and the same push with no mentions (no turns compete with ingest).

Baselines on a fresh database, the same 1,000 messages: `MessageStore.add` in a loop (the raw insert
rate the path is built on), and `ChatStore.ensure` + `MessageStore.add` in a loop (the store work the
router does per message). Three rounds (one with --quick), each running all four in turn; medians of
the per-round rates.
"""

from __future__ import annotations

import asyncio
import time

from bench.apps import BenchApp, bench_app
from bench.common import BenchContext, bench_settings, poll_until
from bench.report import Measure, Row
from bench.tg_process import TelegramProcess
from core.store.messages import NewMessage
from core.stores import Stores

NAME = "ingest"
MESSAGES = 1_000
CHATS = 50
MENTION_EVERY = 3
WAIT_SECONDS = 180.0
STORE_POLL_SECONDS = 0.02


def _text(i: int, bot_username: str, mentions: bool) -> str:
    body = f"message {i}: shall we ship the release on Thursday, or wait for the fix?"
    return f"@{bot_username} {body}" if mentions and i % MENTION_EVERY == 0 else body


async def _raw_rate(ctx: BenchContext, key: str, with_ensure: bool) -> float:
    stores = await Stores.open(bench_settings(ctx.work_dir / f"raw-{key}"))
    try:
        chat_ids = [ctx.chat_id(i) for i in range(CHATS)]
        for chat_id in chat_ids:
            await stores.chats.ensure(chat_id, "supergroup", "bench ingest")
        messages = [
            NewMessage(
                chat_id=chat_ids[i % CHATS],
                sender_name="Alice",
                content=_text(i, "crew_test_bot", mentions=True),
                sender_id=1001,
                platform_message_id=i + 1,
                is_trigger=i % MENTION_EVERY == 0,
            )
            for i in range(MESSAGES)
        ]
        t0 = time.perf_counter()
        for message in messages:
            if with_ensure:
                await stores.chats.ensure(message.chat_id, "supergroup", "bench ingest")
            await stores.messages.add(message)
        return MESSAGES / (time.perf_counter() - t0)
    finally:
        await stores.db.close()


async def _user_messages(bench: BenchApp) -> int:
    async with bench.app.stores.db.conn.execute("SELECT COUNT(*) FROM messages WHERE is_bot = 0") as cursor:
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _turns(bench: BenchApp) -> dict[str, int]:
    async with bench.app.stores.db.conn.execute("SELECT status, COUNT(*) FROM turns GROUP BY status") as cursor:
        rows = await cursor.fetchall()
    return {str(row[0]): int(row[1]) for row in rows}


async def _round(
    bench: BenchApp, tg: TelegramProcess, chat_ids: list[int], offset: int, mentions: bool
) -> tuple[float, float]:
    """One push of MESSAGES; (messages per second into the store, seconds until every chat is idle)."""
    batch = [(chat_ids[i % CHATS], _text(offset + i, tg.bot_username, mentions)) for i in range(MESSAGES)]
    expected = await _user_messages(bench) + MESSAGES

    async def all_stored() -> bool | None:
        return True if await _user_messages(bench) >= expected else None

    t0 = time.perf_counter()
    await tg.push(batch)
    await poll_until(all_stored, WAIT_SECONDS, f"{MESSAGES} messages in the store", STORE_POLL_SECONDS)
    t_stored = time.perf_counter()
    for chat_id in chat_ids:
        await asyncio.wait_for(bench.app.wait_quiet(chat_id), WAIT_SECONDS)
    return MESSAGES / (t_stored - t0), time.perf_counter() - t0


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(3, 1)
    raw_rates: list[float] = []
    router_rates: list[float] = []
    mixed: list[tuple[float, float]] = []
    quiet: list[tuple[float, float]] = []
    chat_ids = [ctx.chat_id(i) for i in range(CHATS)]
    async with TelegramProcess() as tg:
        settings = bench_settings(ctx.work_dir / "data", token=tg.token, base_url=tg.base_url, ALLOW_ALL_CHATS=True)
        async with bench_app(settings) as bench:
            for r in range(rounds):  # interleaved, so a change in the machine's load hits all alike
                raw_rates.append(await _raw_rate(ctx, f"add-{r}", with_ensure=False))
                router_rates.append(await _raw_rate(ctx, f"ensure-{r}", with_ensure=True))
                mixed.append(await _round(bench, tg, chat_ids, 2 * r * MESSAGES, mentions=True))
                quiet.append(await _round(bench, tg, chat_ids, (2 * r + 1) * MESSAGES, mentions=False))
            turns = await _turns(bench)
            replies = await tg.sent()
    ctx.note(
        f"{rounds} round(s) of {MESSAGES} messages over {CHATS} chats, with and without mentions; turns {turns}; "
        f"{replies} replies sent (Telegram limits: 20 messages a minute per group, 30 a second overall)"
    )
    raw = Measure.rates(raw_rates)
    label = f"{MESSAGES:,} messages over {CHATS} chats"
    return [
        Row(
            bench=NAME,
            metric=f"{label}, 1/{MENTION_EVERY} mentions: PTB → store",
            unit="msg/s",
            result=Measure.rates([rate for rate, _ in mixed]),
            baseline_label="MessageStore.add in a loop",
            baseline=raw,
        ),
        Row(
            bench=NAME,
            metric=f"{label}, no mentions (no turns): PTB → store",
            unit="msg/s",
            result=Measure.rates([rate for rate, _ in quiet]),
            baseline_label="MessageStore.add in a loop",
            baseline=raw,
        ),
        Row(
            bench=NAME,
            metric="the router's store work per message: ChatStore.ensure + MessageStore.add in a loop",
            unit="msg/s",
            result=Measure.rates(router_rates),
            baseline_label="MessageStore.add in a loop",
            baseline=raw,
        ),
        Row(
            bench=NAME,
            metric=f"{label}, 1/{MENTION_EVERY} mentions: push → every triggered turn answered",
            unit="s",
            result=Measure.of([seconds for _, seconds in mixed]),
        ),
    ]
