"""Host memory: the bot process's peak resident memory with 1,000 chats that have history and had a turn.

The full app with subagents enabled (no container runs), the offline model, the fake Bot API in its own process
(so its memory is not counted), and the features a turn meets: answers streamed (STREAM_REPLIES, the default, said
here so a changed default cannot drop it), a warm pool of 2, MAX_CONCURRENT_TURNS at its default, and each chat
with notes (3 of the chat's, 2 about members). bench/memory_mcp.py runs the same with an MCP server configured for
every chat (the tests' stdio server, in a process of its own: its tool list is fetched and offered at each turn),
in a worker process of its own, since its peak is that process's. Each chat gets 19 stored messages (bulk insert)
and then one mention through the real PTB path, which runs one main-agent turn per chat (prompt and notes from the
store, reply streamed, stored and sent). Measured with `ru_maxrss` (peak resident set of this worker process,
which runs nothing else) and VmRSS from /proc/self/status for the current size. Baseline: the same process right
after the app started, before any chat existed.

"Just started" is also measured as an operator sees it: `python -m crewbot run` as a process of its own (VmHWM
once it logged `crewbot_started`), whose memory holds only what the bot itself imported; this worker process has
the benchmark's and the test fakes' imports too. Baseline: a bare interpreter's VmHWM.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path

from bench.apps import bench_app
from bench.common import BenchContext, bench_settings, poll_until
from bench.report import Measure, Row
from bench.tg_process import TelegramProcess
from core.mcp_config import Use
from core.settings import without_settings
from core.store.messages import NewMessage, insert_params
from core.store.notes import NewNote

NAME = "memory"
HISTORY_PER_CHAT = 19  # plus the mention: 20 stored user messages per chat
INSERT_BATCH_CHATS = 50
CHAT_NOTES, MEMBER_NOTES = 3, 2  # per chat: notes its prompt carries
POOL_MEMBERS = 2  # SUBAGENT_WARM_POOL: containers started ahead, idle through the benchmark
REPO = Path(__file__).resolve().parents[1]
WAIT_SECONDS = 240.0
START_WAIT_SECONDS = 60.0
SETTLE_SECONDS = 2.0  # after `crewbot_started`: the first getUpdates and the watcher's first scan are done
STOP_WAIT_SECONDS = 20.0
_INSERT = (
    "INSERT INTO messages (chat_id, platform_message_id, sender_id, sender_name, content, timestamp, "
    "is_bot, is_trigger, reply_to, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def feature_settings(work_dir: Path, *, mcp: bool) -> dict[str, str]:
    """The features a turn meets, for the app in this process and for `crewbot run` alike, with a warm pool of
    POOL_MEMBERS: its idle containers are the engine's memory, its bookkeeping the host's."""
    features = {"STREAM_REPLIES": "true", "SUBAGENT_WARM_POOL": str(POOL_MEMBERS)}
    if mcp:
        servers = work_dir / "mcp.json"
        entry = {"command": sys.executable, "args": ["-m", "tests.fakes.mcp_server"], "cwd": str(REPO)}
        servers.write_text(json.dumps({"mcpServers": {"notes": {**entry, "tools": ["echo", "add"]}}}))
        features["MCP_SERVERS"] = str(servers)
    return features


def status_mib(pid: int | str, field: str) -> float:
    """A memory figure (VmHWM, VmRSS) of a process from /proc, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_rss_mib() -> float:
    return status_mib("self", "VmRSS")


def _bot_env(tg: TelegramProcess, data_dir: Path, features: dict[str, str]) -> dict[str, str]:
    """This process's environment minus any crewbot setting, plus the fake's address, the offline model and the
    features."""
    env = without_settings(os.environ)
    env.update(features)
    env.update(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        DATA_DIR=str(data_dir),
        LLM_PROVIDER="offline",
        ALLOW_ALL_CHATS="true",
        SUBAGENT_NETWORK="none",
        LOG_FORMAT="json",
        LOG_LEVEL="INFO",
    )
    return env


async def _peak_of(command: list[str], env: dict[str, str], cwd: Path, ready: bytes | None) -> float:
    """VmHWM (MiB) of `command` once it printed `ready` (or at once) and settled; then it is stopped."""
    process = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    drain: asyncio.Task[bytes] | None = None
    try:
        async with asyncio.timeout(START_WAIT_SECONDS):
            while ready is not None:
                line = await process.stdout.readline()
                if not line:
                    raise RuntimeError(f"{command} exited before it printed {ready!r}")
                if ready in line:
                    break
        drain = asyncio.create_task(process.stdout.read())  # its later log lines must not fill the pipe
        await asyncio.sleep(SETTLE_SECONDS)
        return status_mib(process.pid, "VmHWM")
    finally:
        if process.returncode is None:
            process.terminate()  # our own child
            try:
                await asyncio.wait_for(process.wait(), STOP_WAIT_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()
        if drain is not None:
            await drain


async def _process_rows(ctx: BenchContext, tg: TelegramProcess) -> list[Row]:
    data_dir = ctx.work_dir / "data-process"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = _bot_env(tg, data_dir, feature_settings(ctx.work_dir, mcp=True))  # the SDK must not load at start
    bot = await _peak_of([sys.executable, "-m", "crewbot", "run"], env, data_dir, b'"crewbot_started"')
    bare = await _peak_of([sys.executable, "-c", "import time; time.sleep(5)"], env, data_dir, None)
    return [
        Row(
            bench=NAME,
            metric="host RSS just started: `python -m crewbot run` (peak, VmHWM), Telegram connected, no message yet",
            unit="MiB",
            result=Measure.figure(bot),
            baseline_label="bare Python interpreter (VmHWM)",
            baseline=Measure.figure(bare),
        )
    ]


async def run(ctx: BenchContext) -> list[Row]:
    async with TelegramProcess() as tg:
        return [*await _process_rows(ctx, tg), *await burst_rows(ctx, tg, NAME, mcp=False)]


async def burst_rows(ctx: BenchContext, tg: TelegramProcess, name: str, *, mcp: bool) -> list[Row]:
    """The 1,000 chats' turns in this process (whose peak it measures), with or without an MCP server."""
    chats = ctx.scaled(1_000, 200)
    chat_ids = [ctx.chat_id(i) for i in range(chats)]
    features = feature_settings(ctx.work_dir, mcp=mcp)
    settings = bench_settings(
        ctx.work_dir / "data", token=tg.token, base_url=tg.base_url, ALLOW_ALL_CHATS=True, **features
    )
    async with bench_app(settings, with_subagents=True) as bench:
        stores = bench.app.stores
        gc.collect()
        idle_peak, idle_now = peak_rss_mib(), current_rss_mib()

        now = time.time() - 3600
        for chat_id in chat_ids:
            await stores.chats.ensure(chat_id, "supergroup", f"bench memory {chat_id}")
        # The benchmark's own rows are not the bot's memory: a batch of chats at a time, so what Python and
        # SQLite's thread keep of the largest batch (freed, not returned) stays small (all 19,000 at once: ~3 MiB).
        for first in range(0, chats, INSERT_BATCH_CHATS):
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
                for chat_id in chat_ids[first : first + INSERT_BATCH_CHATS]
                for k in range(HISTORY_PER_CHAT)
            ]
            async with stores.db.transaction() as conn:
                await conn.executemany(_INSERT, history)
            del history
        for chat_id in chat_ids:
            for k in range(CHAT_NOTES + MEMBER_NOTES):
                about = 2000 + k if k >= CHAT_NOTES else None
                text = f"note {k} of chat {chat_id}: the team decided to ship on Fridays, never on Mondays"
                note = NewNote(chat_id, text, caused_by_id=2000, caused_by_name="User 0", about_user_id=about)
                limit = settings.memory_max_notes if about is None else settings.memory_max_member_notes
                await stores.notes.add(note, limit)

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
        client = bench.app.mcp
        offered = len((await client.tools_for(chat_ids[-1], Use.MAIN)).tools) if client is not None else 0
        if offered != (2 if mcp else 0):  # the turns were measured without the MCP server's tools, or with
            raise RuntimeError(f"the MCP server offered {offered} tools, not {2 if mcp else 0}")
    offered_text = " with an MCP server's tools offered" if mcp else ""
    ctx.note(
        f"{chats} chats × {HISTORY_PER_CHAT + 1} messages and {CHAT_NOTES + MEMBER_NOTES} notes, one streamed turn "
        f"each{offered_text} and a warm pool of {POOL_MEMBERS} idle, "
        f"all answered in {answered_seconds:.1f} s "
        f"(the replies go through Telegram's 30/s overall limit); RSS at idle {idle_now:.1f} MiB, after {after:.1f} MiB"
    )
    configured = ", an MCP server configured" if mcp else ""
    return [
        Row(
            bench=name,
            metric=f"host peak RSS (ru_maxrss), {chats:,} chats with history, each had a turn{configured}",
            unit="MiB",
            result=Measure.figure(peak),
            baseline_label="same process, app just started (ru_maxrss)",
            baseline=Measure.figure(idle_peak),
        ),
        Row(
            bench=name,
            metric=f"resident memory (VmRSS) added per chat{configured}",
            unit="KiB",
            result=Measure.figure((after - idle_now) * 1024 / chats, chats),
        ),
    ]
