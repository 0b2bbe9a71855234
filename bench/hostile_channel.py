"""A hostile run on its channel: what one chat's subagent can do to the bot for every other chat.

The subagent (bench.hostile_container, a process of its own) sends the reviewers' reproductions, one
hostile run each: at a run's maximum (`bodies`: a step and a session as large as the caps allow, every model
step it may ask for as 8 MB of `{}`, every session upload as 4 MB of `{}`, a junk progress message and
result), an upload with a preamble of 8 MB of line feeds, plain (`preamble`) and deflated into 8 KB
(`deflate`), and a progress message in 1-byte chunks (`chunks`). A run is stopped after its third invalid
request; the rest find its socket gone. The follow-up allowance race is bench/allowance_race.py.

The host is the full app (real PTB against the fake Bot API in a process of its own, SQLite, the task manager,
the run channels) on the in-memory container runtime, so no engine work is in the figures. Per round, against
the same app idle in the same round (another chat's replies timed in a chat of their own each window):

- the longest event-loop gap (a probe wakes every 5 ms; goal <= 50 ms), the `/healthz` answer's bound;
- the host's peak RSS over the window (VmHWM after /proc/self/clear_refs), less its RSS when the window
  began (goal <= +64 MiB);
- another chat's reply time: a mention pushed to the fake Bot API until the bot's answer is there, the
  first pushed with the spawn request, then one after another, at least five (goal <= 1.5x idle).
"""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.allowance_race import allowance_race
from bench.common import BenchContext, bench_settings, ms, poll_until
from bench.hostile_container import ATTACKS, hostile_container
from bench.loop_probe import GcRecorder, Window, measured
from bench.report import Measure, Row
from bench.stall_pass import stall_app
from bench.stall_peer import WAIT_SECONDS, Peer
from bench.tg_process import TelegramProcess
from container.protocol import CHANNEL_DIR, CHANNEL_SOCKET_FILE, SpawnRequest
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.runtimes.runtime import LABEL_RUN_ID
from runner.service import SubagentService
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime

NAME = "hostile"
STALL_GOAL_MS = 50.0
RSS_GOAL_MIB = 64.0
REPLY_GOAL_RATIO = 1.5
MIB = 1024 * 1024
MIN_REPLIES = 5  # per window, at least
WINDOWS = ("idle", *ATTACKS)
SETTLE_SECONDS = 1.0  # after the chats' folders appear: the watcher restarts and sweeps
REPLY_POLL_SECONDS = 0.01
WATCH_SECONDS = 0.02
ATTACK_NAMES = {
    "bodies": "a hostile run at its maximum",
    "preamble": "uploads with 8 MB preambles of line feeds",
    "deflate": "the same uploads deflated into 8 KB",
    "chunks": "500 KB messages in 1-byte chunks",
}


def reset_peak_rss() -> int:
    """Start a new peak (the kernel sets VmHWM to the current RSS) and return that RSS in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") * 1024


def peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


def _status_kib(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no {field} in /proc/self/status")
    return int(found.group(1))


class Attacks:
    """The in-memory runtime's behaviour: each started container is one attack by the helper process. The
    attack goes on when the host kills the container (it stops the run): the helper answers when it is done."""

    def __init__(self, peer: Peer) -> None:
        self._peer = peer
        self.kinds: dict[str, str] = {}  # run id -> its attack (bench/hostile_container.py ATTACKS)
        self.done: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def behave(self, container: MemoryContainer) -> int | None:
        assert container.spec is not None
        mount = next(m for m in container.spec.mounts if m.target == CHANNEL_DIR)
        run_id = container.labels[LABEL_RUN_ID]
        command = {"socket": str(mount.source / CHANNEL_SOCKET_FILE), "attack": self.kinds[run_id]}
        call = asyncio.ensure_future(self._peer.call(command))
        self.done[run_id] = call
        await asyncio.shield(call)
        return 0


async def replies(tg: TelegramProcess, chat_id: int, until: asyncio.Future[Any] | None) -> list[float]:
    """Seconds from a mention pushed to the bot's answer in `chat_id`, one after another, until `until` is done
    (and at least MIN_REPLIES)."""
    times: list[float] = []
    while len(times) < MIN_REPLIES or (until is not None and not until.done()):
        before = await tg.sent(chat_id)
        asked = time.monotonic()
        await tg.push([(chat_id, f"@{tg.bot_username} ping {len(times)}")])
        await poll_until(
            functools.partial(_answered, tg, chat_id, before),
            WAIT_SECONDS,
            f"the bot's answer in chat {chat_id}",
            REPLY_POLL_SECONDS,
        )
        times.append(time.monotonic() - asked)
    return times


async def _answered(tg: TelegramProcess, chat_id: int, before: int) -> bool | None:
    return True if await tg.sent(chat_id) > before else None


async def idle_work(
    tg: TelegramProcess, peer_chat: int, times: list[float]
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    started_rss = reset_peak_rss()
    times += await replies(tg, peer_chat, None)
    return {"rss_growth": peak_rss() - started_rss}, []


async def one_attack(service: SubagentService, attacks: Attacks, folder: str, kind: str) -> tuple[dict[str, Any], str]:
    """One hostile run from spawn request to cleanup: what its container got, and how the run ended."""
    run_id = f"hostile-{secrets.token_hex(6)}"
    attacks.kinds[run_id] = kind
    request = SpawnRequest(request_id=run_id, task="Do as the chat said.", label="hostile")
    await asyncio.to_thread(write_spawn_request, service.paths.ipc_root, folder, request)

    async def attack_started() -> asyncio.Future[dict[str, Any]] | None:
        return attacks.done.get(run_id)

    answer = await (await poll_until(attack_started, WAIT_SECONDS, "the hostile container to start", WATCH_SECONDS))

    async def cleaned_up() -> bool | None:
        return True if run_id not in service.live else None

    await poll_until(cleaned_up, WAIT_SECONDS, "the hostile run to be cleaned up", WATCH_SECONDS)
    record = await service.runs.get(run_id)
    return answer, f"{record.status}: {record.error}" if record is not None else "no record"


async def attack_work(
    tg: TelegramProcess,
    service: SubagentService,
    attacks: Attacks,
    peer_chat: int,
    folder: str,
    kind: str,
    times: list[float],
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """One hostile run from its spawn request to its cleanup; the other chat's replies are timed from the
    same moment (the first mention goes out with the spawn request)."""
    started_rss = reset_peak_rss()
    started = time.monotonic()
    attacking = asyncio.ensure_future(one_attack(service, attacks, folder, kind))
    times += await replies(tg, peer_chat, attacking)
    answer, ended = await attacking
    facts = {
        "rss_growth": peak_rss() - started_rss,
        "attack_s": round(answer["finished"] - answer["started"], 3),
        "statuses": str(answer["statuses"]),
        "run": ended,
    }
    return facts, [("attack", started)]


@dataclass(slots=True)
class Round:
    windows: dict[str, Window]  # idle, then one per attack
    replies: dict[str, list[float]]


async def run_round(ctx: BenchContext, tg: TelegramProcess, peer: Peer, recorder: GcRecorder, index: int) -> Round:
    # Another chat per window: Telegram lets a bot send a group about 20 messages a minute, and the outbox keeps
    # to that (bot/channels/telegram_limits.py), so one chat asked in every window would time the throttle.
    first_chat = len(WINDOWS) * 2 * index
    attacker = ctx.chat_id(first_chat)
    peers = {window: ctx.chat_id(first_chat + 1 + number) for number, window in enumerate(WINDOWS)}
    settings = bench_settings(
        ctx.work_dir / f"data-{index}",
        token=tg.token,
        base_url=tg.base_url,
        LOG_LEVEL="INFO",
        ALLOWED_CHAT_IDS=",".join(str(chat_id) for chat_id in [attacker, *peers.values()]),
    )
    await tg.add_chats([attacker, *peers.values()])
    attacks = Attacks(peer)
    runtime = MemoryRuntime(on_start=attacks.behave)
    async with stall_app(settings, runtime) as (app, service):
        chat = await app.stores.chats.ensure(attacker, "supergroup", f"bench hostile {attacker}")
        await asyncio.to_thread(ensure_chat_dirs, service.paths.ipc_root, chat.folder)
        await asyncio.sleep(SETTLE_SECONDS)
        for peer_chat in peers.values():
            await replies(tg, peer_chat, None)  # warm: the first turn loads what later ones reuse
        done = Round({}, {window: [] for window in WINDOWS})
        done.windows["idle"] = await measured(
            "idle", recorder, lambda: idle_work(tg, peers["idle"], done.replies["idle"])
        )
        for kind in ATTACKS:
            done.windows[kind] = await measured(
                kind,
                recorder,
                functools.partial(
                    attack_work, tg, service, attacks, peers[kind], chat.folder, kind, done.replies[kind]
                ),
            )
    return done


def _row(metric: str, unit: str, result: list[float], label: str, baseline: list[float]) -> Row:
    return Row(
        bench=NAME,
        metric=metric,
        unit=unit,
        result=Measure.of(result),
        baseline_label=label,
        baseline=Measure.of(baseline),
    )


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(3, 1)
    results: list[Round] = []
    with GcRecorder() as recorder:
        async with TelegramProcess() as tg, hostile_container() as peer:
            for index in range(rounds):
                results.append(await run_round(ctx, tg, peer, recorder, index))
    gap = {w: [r.windows[w].max_ms for r in results] for w in WINDOWS}
    rss = {w: [float(r.windows[w].facts["rss_growth"]) / MIB for r in results] for w in WINDOWS}
    reply = {w: [ms(statistics.median(r.replies[w])) for r in results] for w in WINDOWS}
    first = {w: [ms(r.replies[w][0]) for r in results] for w in WINDOWS}
    for r in results:
        for kind in ATTACKS:
            facts = r.windows[kind].facts
            ctx.note(
                f"round, {kind}: longest gap {r.windows[kind].max_ms:.1f} ms ({r.windows[kind].longest_gap_phase()}; "
                f"idle {r.windows['idle'].max_ms:.1f} ms); the hostile run's {facts['attack_s']} s of requests got "
                f"{facts['statuses']}; it ended {facts['run']}"
            )
    worst_gap = max(max(gap[kind]) for kind in ATTACKS)
    worst_rss = max(max(rss[kind]) for kind in ATTACKS)
    ratio = max(statistics.median(reply[kind]) for kind in ATTACKS) / statistics.median(reply["idle"])
    ctx.note(
        f"goals: longest gap <= {STALL_GOAL_MS:g} ms {'met' if worst_gap <= STALL_GOAL_MS else 'NOT met'} "
        f"(worst {worst_gap:.1f} ms); RSS growth <= {RSS_GOAL_MIB:g} MiB "
        f"{'met' if worst_rss <= RSS_GOAL_MIB else 'NOT met'} (worst {worst_rss:.1f} MiB); another chat's reply "
        f"<= {REPLY_GOAL_RATIO:g}x idle {'met' if ratio <= REPLY_GOAL_RATIO else 'NOT met'} "
        f"({ratio:.2f}x, the worst attack)"
    )
    idle = "the app idle, same round"
    rows: list[Row] = []
    for kind in ATTACKS:
        hostile = ATTACK_NAMES[kind]
        rows += [
            _row(f"{hostile}: longest event-loop gap", "ms", gap[kind], idle, gap["idle"]),
            _row(f"{hostile}: host peak RSS growth", "MiB", rss[kind], idle, rss["idle"]),
            _row(
                f"{hostile}: the first reply in another chat (asked with the spawn)",
                "ms",
                first[kind],
                idle,
                first["idle"],
            ),
            _row(f"{hostile}: another chat's reply time (median)", "ms", reply[kind], idle, reply["idle"]),
        ]
    return rows + await allowance_race(ctx)
