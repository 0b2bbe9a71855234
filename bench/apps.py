"""The real app for benchmarks (real PTB, SQLite, task manager, Docker), with timing taps at its edges.

The taps observe, they do not change behaviour: `TimedDockerRuntime` is the product's Docker runtime
noting when a container's start returned and when a kill was asked for, `FirstCallProbe` notes when
a run's first request reached the LLM proxy (the proxy asks the run gate `is_live` before anything else),
and `TimedFileSource` is the chat channel as the runs' file source (as the product wires it), noting when
each download was asked for and when its bytes were in hand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.channels.telegram import TelegramChannel
from core.delivery import Delivery
from core.mcp_servers import McpServers
from core.settings import Settings
from core.store.mcp_calls import McpCallStore
from core.store.runs import FINAL_STATUSES
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.app import App
from crewbot.serve import ObservedSubagents, unguarded
from runner.runs.file_source import FileSource
from runner.runs.live_runs import LiveRuns
from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.runtime import ContainerRuntime, ContainerSpec
from runner.service import SubagentService

if TYPE_CHECKING:
    from pydantic_ai.models import Model

POLL_TIMEOUT_SECONDS = 1  # short long-polls keep the app's shutdown quick


class TimedDockerRuntime(DockerRuntime):
    """The product's runtime; notes (perf_counter) when start() returned and when kill() was first asked."""

    def __init__(self, max_concurrency: int) -> None:
        super().__init__(max_concurrency=max_concurrency)
        self.started: dict[str, tuple[str, float]] = {}  # container name -> (id, when start returned)
        self.kill_asked: dict[str, float] = {}  # container id -> first kill() call

    async def start(self, spec: ContainerSpec) -> str:
        container_id = await super().start(spec)
        self.started[spec.name] = (container_id, time.perf_counter())
        return container_id

    async def kill(self, container_id: str) -> None:
        self.kill_asked.setdefault(container_id, time.perf_counter())
        await super().kill(container_id)


class FirstCallProbe:
    """When each run's first LLM request arrived at the proxy: the subagent's process is really running."""

    def __init__(self, live: LiveRuns) -> None:
        self._is_live = live.is_live
        self.first: dict[str, float] = {}
        self._changed = asyncio.Event()
        # An instance attribute shadows the method for every caller holding this LiveRuns (the proxy's gate).
        setattr(live, "is_live", self)  # noqa: B010

    def __call__(self, run_id: str) -> bool:
        if run_id not in self.first:
            self.first[run_id] = time.perf_counter()
            self._changed.set()
        return self._is_live(run_id)

    async def wait(self, run_id: str, timeout_seconds: float) -> float:
        deadline = time.monotonic() + timeout_seconds
        while run_id not in self.first:
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"run {run_id} made no LLM request within {timeout_seconds:g} s")
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                continue
        return self.first[run_id]


class TimedFileSource:
    """The channel's download_file; notes (perf_counter) when each download was asked and when it returned."""

    def __init__(self, source: FileSource) -> None:
        self._source = source
        self.downloads: list[tuple[str, float, float]] = []  # (file_id, asked, bytes in hand)

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        asked = time.perf_counter()
        data = await self._source.download_file(file_id, max_bytes)
        self.downloads.append((file_id, asked, time.perf_counter()))
        return data


@dataclass(slots=True)
class BenchApp:
    app: App
    service: SubagentService | None
    runtime: TimedDockerRuntime | None
    downloads: TimedFileSource | None = None

    def subagents(self) -> tuple[SubagentService, TimedDockerRuntime]:
        if self.service is None or self.runtime is None:
            raise RuntimeError("this app was built without subagents")
        return self.service, self.runtime

    async def wait_run_done(self, run_id: str, timeout_seconds: float) -> str:
        """Until the run has its final status and its container is cleaned up; returns the status."""
        service, _ = self.subagents()
        deadline = time.monotonic() + timeout_seconds
        while True:
            record = await service.runs.get(run_id)
            if record is not None and record.status in FINAL_STATUSES and run_id not in service.live:
                return record.status
            if time.monotonic() > deadline:
                status = record.status if record else "no record"
                raise TimeoutError(f"run {run_id} not done within {timeout_seconds:g} s (status {status})")
            await asyncio.sleep(0.05)


def _mcp(settings: Settings, stores: Stores) -> McpServers | None:
    """The operator's MCP servers as crewbot/serve.py wires them for the main agent (calls recorded), when set."""
    if settings.mcp_servers is None:
        return None

    async def platform_of(chat_id: int) -> int:
        return (await stores.chats.address(chat_id)).platform_chat_id

    return McpServers(settings.mcp_servers, store=McpCallStore(stores.db), platform_of=platform_of)


@asynccontextmanager
async def bench_app(
    settings: Settings,
    *,
    model: Model | None = None,
    with_subagents: bool = False,
    runtime: ContainerRuntime | None = None,
) -> AsyncIterator[BenchApp]:
    """As tests.harness.telegram_app, but with the timing runtime and a typed handle on the service. `runtime`:
    the subagents' runtime instead of the timing Docker one (subagents implied; BenchApp.runtime is then None)."""
    stores = await Stores.open(settings)
    if settings.telegram_bot_token is None:
        raise ValueError("the benchmark app needs TELEGRAM_BOT_TOKEN (the fake server's)")
    channel = TelegramChannel(
        settings.telegram_bot_token.get_secret_value(),
        settings.telegram_api_base_url,
        poll_timeout_seconds=POLL_TIMEOUT_SECONDS,
    )
    timed = TimedDockerRuntime(settings.max_concurrent_subagents) if with_subagents and runtime is None else None
    engine = runtime or timed
    downloads = TimedFileSource(channel)
    built: list[SubagentService] = []

    def factory(delivery: Delivery, typing: TypingIndicator) -> ObservedSubagents:
        assert engine is not None
        service = SubagentService(settings, stores, delivery, typing, engine, file_source=downloads)
        built.append(service)
        return unguarded(settings, stores, service)

    app = App(
        settings, channel, stores, factory if engine is not None else None, model=model, mcp=_mcp(settings, stores)
    )
    try:
        await app.start()
    except BaseException:
        await app.stop()  # as the CLI does: otherwise the database thread keeps the process alive
        raise
    try:
        yield BenchApp(app, built[0] if built else None, timed, downloads)
    finally:
        await app.stop()
