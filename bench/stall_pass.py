"""One pass of the stall benchmark: a fresh host app, and every window measured on it in turn.

The host is the full app (real PTB against the fake Bot API in a process of its own, SQLite, outbox, the
SubagentService with its IPC watcher, LLM proxy and run channels as runner/service.py builds them) on the
in-memory container runtime (tests.fakes.memory_runtime), so no engine work is in the figures. Windows:
the probe alone (before the app), the app idle, (a) junk files, (b) a subagent with the default message
budget and with the ceiling, and a forced full collection. MODE_FROZEN runs `gc.collect(); gc.freeze()`
once start-up is done (a mitigation to compare; the bot does not call it).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.common import BenchContext, bench_settings, ms
from bench.loop_probe import GcPause, GcRecorder, Window, measured
from bench.stall_junk import junk_work
from bench.stall_peer import Peer
from bench.stall_subagent import CEILING_MAX_MESSAGES, DEFAULT_MAX_MESSAGES, Containers, subagent_work
from bench.tg_process import TelegramProcess
from bot.channels.telegram import TelegramChannel
from core.delivery import Delivery
from core.settings import Settings
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.app import App
from crewbot.serve import ObservedSubagents, unguarded
from runner.ipc.requests import ensure_chat_dirs
from runner.service import SubagentService
from tests.fakes.memory_runtime import MemoryRuntime

POLL_TIMEOUT_SECONDS = 1  # the app's long poll, as in bench/apps.py: its shutdown stays quick
SETTLE_SECONDS = 1.0  # after the chats' folders appear: the watcher restarts and sweeps

MODE_TODAY = "today"
MODE_FROZEN = "frozen"
MODES = (MODE_TODAY, MODE_FROZEN)


@dataclass(slots=True)
class Chats:
    junk: int
    subagent: int
    ceiling: int
    folders: dict[int, str] = field(default_factory=dict)


@asynccontextmanager
async def stall_app(settings: Settings, runtime: MemoryRuntime) -> AsyncIterator[tuple[App, SubagentService]]:
    """The app as bench/apps.py builds it, on the in-memory runtime."""
    stores = await Stores.open(settings)
    assert settings.telegram_bot_token is not None
    channel = TelegramChannel(
        settings.telegram_bot_token.get_secret_value(),
        settings.telegram_api_base_url,
        poll_timeout_seconds=POLL_TIMEOUT_SECONDS,
    )
    built: list[SubagentService] = []

    def factory(delivery: Delivery, typing: TypingIndicator) -> ObservedSubagents:
        service = SubagentService(settings, stores, delivery, typing, runtime)
        built.append(service)
        return unguarded(settings, stores, service)

    app = App(settings, channel, stores, factory)
    try:
        await app.start()
    except BaseException:
        await app.stop()
        raise
    try:
        yield app, built[0]
    finally:
        await app.stop()
        await runtime.stop_behaviours()


async def _idle(seconds: float) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    await asyncio.sleep(seconds)
    return {}, []


async def _full_collection() -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """What an automatic full collection does to the loop when it comes: the same work, on the loop's thread."""
    await asyncio.sleep(0.1)  # the probe is running
    started = time.monotonic()
    gc.collect()
    return {"collect_ms": round(ms(time.monotonic() - started), 3)}, [("gc.collect()", started)]


@dataclass(slots=True)
class Pass:
    mode: str
    windows: dict[str, Window] = field(default_factory=dict)
    heap_objects: int = 0
    automatic_gen2: list[GcPause] = field(default_factory=list)  # after start-up, the forced one left out


async def run_pass(
    ctx: BenchContext,
    tg: TelegramProcess,
    peers: tuple[Peer, Peer],
    recorder: GcRecorder,
    mode: str,
    index: int,
    idle_seconds: float,
) -> Pass:
    junk_peer, container_peer = peers
    result = Pass(mode)
    chats = Chats(ctx.chat_id(3 * index), ctx.chat_id(3 * index + 1), ctx.chat_id(3 * index + 2))
    chat_ids = [chats.junk, chats.subagent, chats.ceiling]

    result.windows["alone"] = await measured("alone", recorder, lambda: _idle(idle_seconds))

    settings = bench_settings(
        ctx.work_dir / f"data-{index}",
        token=tg.token,
        base_url=tg.base_url,
        LOG_LEVEL="INFO",
        ALLOWED_CHAT_IDS=",".join(str(c) for c in chat_ids),
        SUBAGENT_MAX_MESSAGES=CEILING_MAX_MESSAGES,  # the budget; each case sends its own count
    )
    await tg.add_chats(chat_ids)
    containers = Containers(container_peer)
    runtime = MemoryRuntime(on_start=containers.behave)
    async with stall_app(settings, runtime) as (app, service):
        for chat_id in chat_ids:
            chat = await app.stores.chats.ensure(chat_id, "supergroup", f"bench stall {chat_id}")
            chats.folders[chat_id] = chat.folder
            await asyncio.to_thread(ensure_chat_dirs, service.paths.ipc_root, chat.folder)
        await asyncio.sleep(SETTLE_SECONDS)
        result.heap_objects = len(gc.get_objects())
        if mode == MODE_FROZEN:
            gc.collect()
            gc.freeze()
        measuring = time.monotonic()
        try:
            result.windows["idle"] = await measured("idle", recorder, lambda: _idle(idle_seconds))
            result.windows["junk"] = await measured(
                "junk",
                recorder,
                lambda: junk_work(junk_peer, service.paths.ipc_root, chats.folders[chats.junk], chats.subagent, index),
            )
            result.windows["subagent"] = await measured(
                "subagent",
                recorder,
                lambda: subagent_work(
                    app, service, containers, chats.subagent, chats.folders[chats.subagent], DEFAULT_MAX_MESSAGES, True
                ),
            )
            ceiling = await measured(
                "ceiling",
                recorder,
                lambda: subagent_work(
                    app, service, containers, chats.ceiling, chats.folders[chats.ceiling], CEILING_MAX_MESSAGES, False
                ),
            )
            result.windows["ceiling"] = ceiling
            await app.delivery.drop_run_messages(str(ceiling.facts["run_id"]), "benchmark over")
            result.windows["collect"] = await measured("collect", recorder, _full_collection)
            measured_until = time.monotonic()
        finally:
            if mode == MODE_FROZEN:
                gc.unfreeze()
    forced = result.windows["collect"]
    result.automatic_gen2 = [
        pause
        for pause in recorder.between(measuring, measured_until)
        if pause.generation == 2 and pause not in forced.pauses
    ]
    return result
