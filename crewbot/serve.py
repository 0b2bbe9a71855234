"""Running the bot from the CLI: wiring the subagent system in, the console session, and stopping on a signal.

Part of the composition root (only `crewbot.cli` imports it), so it may build runner objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from bot.agent.memory import Memory, MemoryLimits
from bot.agent.spawn_guard import CapCheckedSpawner
from bot.channels.base import Channel, WatchedChannel
from bot.channels.console import CONSOLE_CHAT_ID, ConsoleChannel
from bot.commands import RunControl, WorkspaceControl
from bot.ports.spawner import Spawner
from bot.run_output import ContainerLogs, RunOutputReader, RunsView
from bot.senses.sent_photos import SentOrPosted
from core.allowances import Allowances
from core.delivery import Delivery
from core.live_config import LiveConfig
from core.logging import get_logger
from core.mcp_config import environ_with_env_file
from core.mcp_servers import McpServers, PlatformOf
from core.questions import Questions
from core.setting_runtime import RuntimeKind
from core.settings import Settings
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.egress import EgressStore
from core.store.mcp_calls import McpCallStore
from core.store.questions import QuestionStore
from core.store.run_files import RunFileStore
from core.store.runs import FINAL_STATUSES, RunStore
from core.store.spend import SpendStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.app import App
from crewbot.doctor_mcp import settings_env_file
from crewbot.operations import Operations
from crewbot.subagent_system import SubagentFactory

if TYPE_CHECKING:
    from runner.lifecycle.metrics import RunMetrics
    from runner.runs.file_source import FileSource
    from runner.runtimes.runtime import ContainerRuntime
    from runner.service import SubagentService

log = get_logger("crewbot")

CONSOLE_SETTLE_SECONDS = 1.5  # after piped input ends, how long the chat must stay quiet before exiting
ENGINE_PROBE_SECONDS = 3.0  # the console's "are subagents ready" line waits this long for the engine
FORCED_EXIT_CODE = 130  # a second Ctrl-C: 128 + SIGINT
MAX_FAREWELL_RUNS = 100


class StartFailed(Exception):
    """The bot did not come up; `__cause__` says why."""


class Crashed(Exception):
    """The bot stopped with an error after it had started; `__cause__` says why."""


class ObservedSubagents:
    """The subagent service as the app sees it: spawns answered early when the caps are full, and run
    control that also shows when runs ended and what they printed."""

    def __init__(self, service: SubagentService, spawner: Spawner, control: RunsView) -> None:
        self._service = service
        self._spawner = spawner
        self._control = control

    @property
    def spawner(self) -> Spawner:
        return self._spawner

    @property
    def control(self) -> RunControl:
        return self._control

    @property
    def workspaces(self) -> WorkspaceControl:
        return self._service.workspaces

    @property
    def service(self) -> SubagentService:
        return self._service

    @property
    def desk(self) -> RunsView:
        return self._control

    @property
    def questions(self) -> Questions:
        return self._service.questions

    def watch_runs(self, on_change: Callable[[str], None]) -> None:
        self._service.watch_runs(on_change)

    async def wait_ended(self, chat_id: int) -> None:
        await self._service.wait_ended(chat_id)

    async def start(self) -> None:
        await self._service.start()

    async def stop(self) -> None:
        await self._service.stop()


def subagent_runtime(settings: Settings) -> ContainerRuntime:
    """SUBAGENT_RUNTIME's backend (runner.kube.kube_errors.KubeConfigError when a cluster cannot be loaded)."""
    from runner.service import build_runtime

    return build_runtime(settings)


def output_reader(settings: Settings, db: Database, runtime: ContainerLogs) -> RunOutputReader:
    from runner.storage.paths import DataPaths
    from runner.storage.run_files import LOG_FILE

    paths = DataPaths(settings.data_dir)
    return RunOutputReader(
        RunStore(db),
        runtime,
        lambda run_id: paths.run_dir(run_id) / LOG_FILE,
        files=RunFileStore(db),
        egress=EgressStore(db),
        questions=QuestionStore(db),
    )


def unguarded(settings: Settings, stores: Stores, service: SubagentService) -> ObservedSubagents:
    """The service with the chat side's view of its runs, spawning without the early cap check (benchmarks)."""
    return ObservedSubagents(service, service.spawner, runs_view(settings, stores, service))


def runs_view(settings: Settings, stores: Stores, service: SubagentService) -> RunsView:
    output = output_reader(settings, stores.db, service.runtime)
    return RunsView(service.control, service.runs, output, send=service.send_to_run)


def subagent_factory(
    settings: Settings,
    stores: Stores,
    runtime: ContainerRuntime,
    metrics: RunMetrics | None = None,
    config: LiveConfig | None = None,
    file_source: FileSource | None = None,
    allowances: Allowances | None = None,
    mcp: McpServers | None = None,
) -> SubagentFactory:
    from runner.service import SubagentService

    def build(delivery: Delivery, typing: TypingIndicator) -> ObservedSubagents:
        # Each run is handed the chat's notes as they are when it starts (never stored with the run).
        memory = Memory(stores.notes, stores.history, MemoryLimits.from_settings(settings))
        service = SubagentService(
            settings,
            stores,
            delivery,
            typing,
            runtime,
            metrics,
            file_source,
            allowances=allowances,
            chat_notes=memory.subagent_notes,
            mcp=mcp,
        )
        spawner = CapCheckedSpawner(
            service.spawner,
            service.live.count,
            service.picked_up,
            max_total=lambda: settings.max_concurrent_subagents,  # read at each spawn: changeable live
            max_per_chat=lambda: settings.max_subagents_per_chat,
            queued=service.queued_count,
            queue_limit=lambda: settings.subagent_queue_limit,
            on_refused=lambda chat_cap: service.metrics.refused(chat_cap),
        )
        if config is not None:  # a cap or the queue limit raised live: waiting runs may start now
            config.watch(lambda _name: service.manager.drain_queue())
        return ObservedSubagents(service, spawner, runs_view(settings, stores, service))

    return build


async def subagents_readiness(settings: Settings, runtime: ContainerRuntime) -> str:
    """One line for the console's intro: can subagents run here, and if not, what to do."""
    image = settings.subagent_image
    endpoint = getattr(runtime, "endpoint", "the Docker engine")
    engine = "Kubernetes" if settings.subagent_runtime == RuntimeKind.KUBERNETES else "Docker engine"
    try:
        async with asyncio.timeout(ENGINE_PROBE_SECONDS):
            await runtime.ping()
            if not await runtime.image_exists(image):
                return f"Subagents: the image {image} is missing, so they fail: run `crewbot image build`."
    except Exception as exc:
        log.info("subagents_not_ready", error=str(exc))
        return (
            f"Subagents: no {engine} answers at {endpoint}, so they fail until one does "
            + ("(`make engine` starts one, as root); " if engine == "Docker engine" else f"({exc}); ")
            + "chatting works."
        )
    where = endpoint if engine == "Kubernetes" else f"Docker at {endpoint}"
    return f"Subagents: ready ({where}, image {image})."


def _platform_of(chats: ChatStore) -> PlatformOf:
    """A conversation's platform chat (a forum topic's group): what an MCP server's `chats` names."""

    async def platform_of(chat_id: int) -> int:
        return (await chats.address(chat_id)).platform_chat_id

    return platform_of


def _install_signals(stop: asyncio.Event, on_second: Callable[[], None]) -> None:
    """SIGINT/SIGTERM ask for a clean stop; a second one leaves at once (everything stored is crash-safe)."""
    loop = asyncio.get_running_loop()

    def handle() -> None:
        if stop.is_set():
            on_second()
            os._exit(FORCED_EXIT_CODE)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handle)


async def _start(app: App, stop: asyncio.Event) -> bool:
    """Start the app unless a stop comes first; False if it did (the start is abandoned, cleanly)."""
    starting = asyncio.create_task(app.start(), name="app-start")
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
        return False
    starting.result()  # raises what stopped the start
    return True


async def serve(
    settings: Settings, channel: Channel, runtime: ContainerRuntime, on_started: Callable[[], None] | None = None
) -> int:
    """Run until a signal (or the console ends); `on_started` runs once the bot is up."""
    stop = asyncio.Event()
    _install_signals(stop, channel.abandon if isinstance(channel, ConsoleChannel) else lambda: None)
    stores: Stores | None = None
    ops = Operations(settings)
    try:
        stores = await Stores.open(settings)
        config = await ops.open(stores)  # stored live overrides apply before anything reads the settings
        # Every LLM call of the process reserves from this one object: the main agent's and the subagents'.
        allowances = Allowances(settings, SpendStore(stores.db))
        # The operator's MCP servers: one object for the main agent's tools and the calls subagents make through
        # the host, so each server has one connection and one count.
        mcp = McpServers(
            settings.mcp_servers,
            functools.partial(environ_with_env_file, settings_env_file()),  # `${VAR}` as the settings read them
            on_call=ops.metrics.count_mcp_call,
            store=McpCallStore(stores.db),
            platform_of=_platform_of(stores.chats),
        )
        await mcp.config()  # read once now: a missing or invalid file is reported at start-up, not at a turn
        # The chat channel downloads the files people post when a run needs them; a photo an earlier run sent is
        # read from the host's own copy (bot/senses/sent_photos.py).
        from runner.storage.paths import DataPaths

        source = SentOrPosted(channel, DataPaths(settings.data_dir).files_out_dir)
        subagents = subagent_factory(
            settings, stores, runtime, ops.metrics, config, file_source=source, allowances=allowances, mcp=mcp
        )
        app = App(
            settings,
            channel,
            stores,
            subagents,
            config=config,
            allowances=allowances,
            count_tokens=ops.metrics.count_llm_tokens,
            count_stream=ops.metrics.count_stream,
            mcp=mcp,
        )
        ops.metrics.watch_turns(app.engine.turn_counts, settings.max_concurrent_turns)
    except Exception as exc:
        await runtime.close()
        if stores is not None:
            await stores.db.close()
        raise StartFailed from exc
    try:
        await ops.start(app.stores.db, channel)
        started = await _start(app, stop)
    except Exception as exc:
        await ops.stop()
        await app.stop()
        raise StartFailed from exc
    ops.ready = started
    if started:
        # What start-up made (libraries, settings, the store) lives as long as the bot: frozen, a full
        # garbage collection no longer walks it, which alone stalled the event loop ~200 ms (bench: stall).
        gc.collect()
        gc.freeze()
    if started and on_started is not None:
        on_started()
    try:
        if isinstance(channel, ConsoleChannel):
            if started:
                await _until_console_done(app, channel, stop)
            channel.finish(await _farewell(app))
        elif started:
            await _until_stopped(channel, stop)
    except Exception as exc:
        raise Crashed from exc
    finally:
        log.info("shutting_down")
        ops.ready = False
        try:
            await ops.stop()
            await app.stop()
        except Exception as exc:
            raise Crashed from exc  # after start: not "cannot start", whatever it is
    return 0


async def _until_stopped(channel: Channel, stop: asyncio.Event) -> None:
    """Until a signal asks for a stop; raises what ended the channel's receiving if that came first (a bot
    that takes no message must exit, so that its supervisor restarts it)."""
    if not isinstance(channel, WatchedChannel):
        await stop.wait()
        return
    stopping = asyncio.create_task(stop.wait())
    failing = asyncio.create_task(channel.wait_receiving_failure())
    try:
        await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        failing.cancel()
    if failing.done() and not failing.cancelled() and not stop.is_set():
        raise failing.result()


async def _until_console_done(app: App, channel: ConsoleChannel, stop: asyncio.Event) -> None:
    waiter = asyncio.create_task(stop.wait())
    eof = asyncio.create_task(channel.eof.wait())
    try:
        await asyncio.wait({waiter, eof}, return_when=asyncio.FIRST_COMPLETED)
        if channel.interactive:
            return  # a person said /quit, Ctrl-D or Ctrl-C: leave now, running work carries on
        # Piped input ended: let the chat's turn and subagents finish so a scripted demo shows their results.
        while not stop.is_set():
            done = asyncio.create_task(app.wait_quiet(CONSOLE_CHAT_ID))
            await asyncio.wait({done, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                done.cancel()
                break
            await asyncio.sleep(CONSOLE_SETTLE_SECONDS)
            if app.typing.holders(CONSOLE_CHAT_ID) == 0 and app.engine.idle(CONSOLE_CHAT_ID):
                break
    finally:
        waiter.cancel()
        eof.cancel()


async def _farewell(app: App) -> str:
    """What keeps running after the console ends, and where its results will show."""
    live = 0
    if app.subagents is not None:
        try:
            runs = await app.subagents.control.list_runs(CONSOLE_CHAT_ID, MAX_FAREWELL_RUNS)
            live = sum(1 for r in runs if r.status not in FINAL_STATUSES)
        except Exception:  # a farewell must not fail the exit
            log.warning("farewell_runs_unknown", exc_info=True)
    words = ["Bye."]
    if not app.engine.idle(CONSOLE_CHAT_ID):
        words.append("The answer in progress was stopped (send the message again for one).")
    if live:
        runs_text = "1 subagent run keeps" if live == 1 else f"{live} subagent runs keep"
        words.append(f"{runs_text} running in Docker; the next `crewbot console` on this DATA_DIR shows the results.")
    else:
        words.append("Nothing is left running.")
    return " ".join(words)
