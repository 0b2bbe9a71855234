"""`crewbot stats [--since 7d] [--chat ID] [--json] [--plot FILE.png]`: what runs used, and a cap to set;
what the LLM calls cost, and the daily allowances to set.

Reads the database only (the bot may be running). The cap in force over time comes from the log of live
changes, so "time at the cap" is right across `crewbot config set`; the prices and allowances are the live ones.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, replace
from pathlib import Path

from bot.run_web import totals_text
from core.live_config import LiveConfig
from core.settings import Settings
from core.store.chat_files import size_text
from core.store.db import Database
from core.store.egress import EgressStore
from core.store.run_files import FileTotals, RunFileStore
from core.store.runs import RunStore
from core.store.setting_overrides import SettingChange, SettingOverrideStore
from core.store.spend import SpendStore
from crewbot.allowance_advice import AllowanceAdvice, advise_allowances, suggestions_json
from crewbot.cap_advice import Advice, Host, advise
from crewbot.mcp_stats import McpUse, gather_mcp, mcp_json, render_mcp
from crewbot.memory_stats import MemoryUse, gather_memory, memory_json, render_memory
from crewbot.spend_stats import DailyUse, Prices, SpendStats, compute_spend, day_of, render_spend, spend_json
from crewbot.stream_stats import StreamUse, gather_streams, render_streams, streams_json
from crewbot.usage_stats import CapAt, Spread, UsageStats, compute
from runner.lifecycle.pool_status import describe, read_status, status_file

SINCE_UNITS_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
SINCE_SHAPE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
CAP_SETTING = "MAX_CONCURRENT_SUBAGENTS"
MIB = 1024 * 1024
TIME_FORMAT = "%Y-%m-%d %H:%M UTC"


def parse_since(text: str) -> float:
    """`7d`, `24h`, `30m`, `90s`, `2w` as seconds; ValueError otherwise."""
    match = SINCE_SHAPE.match(text.strip().lower())
    if match is None:
        raise ValueError(f"--since {text!r}: write a number and a unit s, m, h, d or w, e.g. 7d")
    return float(match.group(1)) * SINCE_UNITS_SECONDS[match.group(2)]


def cap_history(changes: list[SettingChange], current: int) -> CapAt:
    """The cap in force at a moment: the last change before it, else the value the first change replaced."""

    def cap_at(at: float) -> int:
        before = [c for c in changes if c.changed_at <= at]
        if before:
            return int(before[-1].new_value)
        after = [c for c in changes if c.changed_at > at and c.old_value]
        return int(after[0].old_value) if after and after[0].old_value else current

    return cap_at


async def gather(settings: Settings, since_seconds: float, chat_id: int | None) -> tuple[UsageStats, Advice]:
    db = await Database.open(settings.db_path)
    try:
        config = LiveConfig(settings, SettingOverrideStore(db))
        await config.load()  # the live values the bot has, not only the environment's
        now = time.time()
        records = await RunStore(db).created_since(now - since_seconds, chat_id)
        files = await RunFileStore(db).totals(now - since_seconds, chat_id)
        egress = await EgressStore(db).totals(now - since_seconds, chat_id)
        changes = await SettingOverrideStore(db).changes(name=CAP_SETTING)
    finally:
        await db.close()
    start = min([r.created_at for r in records], default=now)
    cap_at = cap_history(changes, settings.max_concurrent_subagents)
    stats = compute(records, start, now, cap_at, [c.changed_at for c in changes if start <= c.changed_at <= now])
    stats = replace(stats, files=files, egress=egress)
    advice = advise(
        stats,
        current_cap=settings.max_concurrent_subagents,
        memory_limit=settings.subagent_memory,
        cpus_limit=settings.subagent_cpus,
        host=Host.this_machine(),
    )
    return stats, advice


async def gather_spend(
    settings: Settings, since_seconds: float, chat_id: int | None, now: float | None = None
) -> tuple[SpendStats, AllowanceAdvice]:
    """The days from the one `since_seconds` ago to today, in TIMEZONE, whole: spend is counted per day."""
    now = time.time() if now is None else now
    db = await Database.open(settings.db_path)
    try:
        await LiveConfig(settings, SettingOverrideStore(db)).load()  # the live prices and allowances
        spend = SpendStore(db)
        since_day, until_day = day_of(now - since_seconds, settings.timezone), day_of(now, settings.timezone)
        rows = [row for row in await spend.rows(since_day) if row.day <= until_day]
        own: dict[int, int] = {}
        for chat in sorted({row.chat_id for row in rows}):
            allowance = await spend.chat_allowance(chat)
            if allowance is not None:
                own[chat] = allowance
    finally:
        await db.close()
    shown = [row for row in rows if chat_id is None or row.chat_id == chat_id]
    stats = compute_spend(shown, Prices.of(settings), settings.timezone, since_day, until_day)
    advice = advise_allowances(
        DailyUse.of(rows),  # every chat's: the bot's daily totals need them all
        chat_daily_tokens=settings.chat_daily_tokens,
        daily_tokens=settings.daily_tokens,
        own_allowances=own,
        chat_id=chat_id,
    )
    return stats, advice


def _spread(spread: Spread, unit: str, scale: float = 1.0) -> str:
    if spread.p50 is None or spread.p95 is None:
        return f"unknown ({spread.unknown} runs without the figure)" if spread.unknown else "no runs"
    known = f"{spread.known} known" + (f", {spread.unknown} unknown" if spread.unknown else "")
    return f"p50 {spread.p50 / scale:.1f} {unit}, p95 {spread.p95 / scale:.1f} {unit} ({known})"


def _files(totals: FileTotals) -> str:
    return (
        f"{totals.files_in} in ({size_text(totals.bytes_in)}), {totals.files_out} out ({size_text(totals.bytes_out)})"
    )


def render(stats: UsageStats, advice: Advice, chat_id: int | None, current_cap: int) -> list[str]:
    outcomes = ", ".join(f"{name} {count}" for name, count in sorted(stats.by_outcome.items())) or "none"
    tokens = ", ".join(f"{chat}: {count:,}" for chat, count in sorted(stats.tokens_by_chat.items())) or "none"
    period = (
        f"{time.strftime(TIME_FORMAT, time.gmtime(stats.start))} - {time.strftime(TIME_FORMAT, time.gmtime(stats.end))}"
    )
    return [
        f"period: {period} ({'chat ' + str(chat_id) if chat_id is not None else 'all chats'})",
        f"runs: {stats.requests} requests: {outcomes}",
        f"queue wait: {_spread(stats.queue_wait_seconds, 's')}; {stats.waited} waited over 5 s",
        f"start latency: {_spread(stats.start_latency_seconds, 's')}",
        f"run duration: {_spread(stats.duration_seconds, 's')}",
        f"refusals: {stats.refusals}",
        f"at the cap (now {current_cap}): {100 * stats.share_at_cap:.0f}% of the time; peak concurrency "
        f"{stats.peak_running}, peak queue {stats.peak_queued}",
        f"memory per run: {_spread(stats.memory_peak_bytes, 'MiB', MIB)}",
        f"cpu per run: {_spread(stats.cpu_seconds, 's')}; cores busy {_spread(stats.cpu_cores, 'cores')}",
        f"tokens per chat: {tokens}",
        f"files: {_files(stats.files)}",
        f"web: {totals_text(stats.egress)}",
        *advice.lines,
        f"apply without a restart: crewbot config set {CAP_SETTING}={advice.suggested}",
    ]


def as_json(
    stats: UsageStats,
    advice: Advice,
    chat_id: int | None,
    spend: SpendStats,
    allowances: AllowanceAdvice,
    streams: StreamUse | None = None,
    memory: MemoryUse | None = None,
    mcp: McpUse | None = None,
    pool: dict[str, object] | None = None,
) -> str:
    data = asdict(stats)
    data.pop("timeline")
    data["tokens_by_chat"] = {str(k): v for k, v in stats.tokens_by_chat.items()}
    data["chat_id"] = chat_id
    data["advice"] = asdict(advice)
    data["spend"] = {**spend_json(spend), "suggestions": suggestions_json(allowances)}
    if streams is not None:
        data["streams"] = streams_json(streams)
    if memory is not None:
        data["memory"] = memory_json(memory)
    if mcp is not None:
        data["mcp"] = mcp_json(mcp)
    if pool is not None:
        data["warm_pool"] = pool
    return json.dumps(data, indent=2, sort_keys=True)


async def show_stats(
    settings: Settings, since: str, chat_id: int | None, as_json_output: bool, plot: Path | None
) -> int:
    stats, advice = await gather(settings, parse_since(since), chat_id)
    spend, allowances = await gather_spend(settings, parse_since(since), chat_id)
    streams = await gather_streams(settings, parse_since(since), chat_id)
    memory = await gather_memory(settings, chat_id)  # what is kept now, whatever the period
    mcp = await gather_mcp(settings, parse_since(since), chat_id)
    pool = read_status(status_file(settings.data_dir))  # the running bot's last word on its warm pool
    if plot is not None:
        from crewbot.stats_plot import draw

        draw(stats.timeline, stats.start, stats.end, plot)
    if as_json_output:
        pool_json = None if pool is None else {**asdict(pool[0]), "current": pool[1]}
        print(as_json(stats, advice, chat_id, spend, allowances, streams, memory, mcp, pool_json))
    else:
        lines = render(stats, advice, chat_id, settings.max_concurrent_subagents)
        more = [*render_streams(streams), *render_memory(memory), *render_mcp(mcp), *render_spend(spend)]
        if pool is not None:
            more.append(f"Warm pool{'' if pool[1] else ' (when the bot last ran)'}: {describe(pool[0])}")
        print("\n".join([*lines, *more, *allowances.lines]))
        if plot is not None:
            print(f"plot: {plot}")
    return 0
