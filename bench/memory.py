"""Host memory: the bot process's peak resident memory with 1,000 chats that have history and had a turn.

The full app with subagents enabled (no container runs), the offline model, the fake Bot API in its own
process (so its memory is not counted). Each chat gets 19 stored messages (bulk insert) and then one
mention through the real PTB path, which runs one main-agent turn per chat (prompt from the store,
reply stored and sent). Measured with `ru_maxrss` (peak resident set of this worker process, which runs
nothing else) and VmRSS from /proc/self/status for the current size. Baseline: the same process right
after the app started, before any chat existed.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import time
from pathlib import Path

from bench.apps import bench_app
from bench.common import BenchContext, bench_settings, poll_until
from bench.report import Measure, Row
from bench.tg_process import TelegramProcess
from core.store.messages import NewMessage, insert_params

NAME = "memory"
HISTORY_PER_CHAT = 19  # plus the mention: 20 stored user messages per chat
WAIT_SECONDS = 240.0
_INSERT = (
    "INSERT INTO messages (chat_id, platform_message_id, sender_id, sender_name, content, timestamp, "
    "is_bot, is_trigger, reply_to, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run(ctx: BenchContext) -> list[Row]:
    chats = ctx.scaled(1_000, 200)
    chat_ids = [ctx.chat_id(i) for i in range(chats)]
    async with TelegramProcess() as tg:
        settings = bench_settings(ctx.work_dir / "data", token=tg.token, base_url=tg.base_url, ALLOW_ALL_CHATS=True)
        async with bench_app(settings, with_subagents=True) as bench:
            stores = bench.app.stores
            gc.collect()
            idle_peak, idle_now = peak_rss_mib(), current_rss_mib()

            now = time.time() - 3600
            for chat_id in chat_ids:
                await stores.chats.ensure(chat_id, "supergroup", f"bench memory {chat_id}")
            history = [
                insert_params(
                    NewMessage(
                        chat_id=chat_id,
                        sender_name=f"User {k % 5}",
                        content=f"history line {k} of chat {chat_id}: a sentence of ordinary length for a chat",
                        sender_id=2000 + k % 5,
                        timestamp=now + k,
                    )
                )
                for chat_id in chat_ids
                for k in range(HISTORY_PER_CHAT)
            ]
            async with stores.db.transaction() as conn:
                await conn.executemany(_INSERT, history)
            del history  # the benchmark's own 19,000 rows are not the bot's memory

            t0 = time.perf_counter()
            await tg.push([(chat_id, f"@{tg.bot_username} what did we decide?") for chat_id in chat_ids])

            async def all_answered() -> bool | None:
                return True if await tg.sent() >= chats else None

            await poll_until(all_answered, WAIT_SECONDS, f"{chats} replies", 0.25)
            for chat_id in chat_ids:
                await asyncio.wait_for(bench.app.wait_quiet(chat_id), WAIT_SECONDS)
            answered_seconds = time.perf_counter() - t0
            gc.collect()
            peak, after = peak_rss_mib(), current_rss_mib()
    ctx.note(
        f"{chats} chats × {HISTORY_PER_CHAT + 1} messages, one turn each, all answered in {answered_seconds:.1f} s "
        f"(the replies go through Telegram's 30/s overall limit); RSS at idle {idle_now:.1f} MiB, after {after:.1f} MiB"
    )
    return [
        Row(
            bench=NAME,
            metric=f"host peak RSS (ru_maxrss), {chats:,} chats with history, each had a turn",
            unit="MiB",
            result=Measure.figure(peak),
            baseline_label="same process, app just started (ru_maxrss)",
            baseline=Measure.figure(idle_peak),
        ),
        Row(
            bench=NAME,
            metric="resident memory (VmRSS) added per chat",
            unit="KiB",
            result=Measure.figure((after - idle_now) * 1024 / chats, chats),
        ),
    ]
