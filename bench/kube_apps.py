"""The app harness of bench/kube.py: the full app on one backend (Kubernetes as the product builds it from the
settings, or bench/apps.py's Docker app), one chat, its first-call probe, and stamps of KubeRuntime.start."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.apps import FirstCallProbe, bench_app
from bench.common import BenchContext, bench_settings
from core.settings import Settings
from core.store.runs import FINAL_STATUSES
from crewbot.app import App
from runner.ipc.requests import ensure_chat_dirs
from runner.runtimes.runtime import ContainerRuntime, ContainerSpec
from runner.service import SubagentService, build_runtime
from tests.fakes.telegram_server import FakeTelegram

if TYPE_CHECKING:
    from pydantic_ai.models import Model

GVISOR = "gvisor"  # the kit's RuntimeClass (handler runsc)
KUBE, DOCKER, KUBE_GVISOR = "kubernetes", "docker", "kubernetes+gvisor"
RUN_TIMEOUT_SECONDS = 120.0
MERGE_WINDOW_SECONDS = 120.0  # as bench/cancel.py: the merging message always lands inside the window
HELD_RUN_TIMEOUT_SECONDS = 600  # SUBAGENT_TIMEOUT_SECONDS while a run sleeps until it is cancelled


class StartStamps:
    """When the runtime's start was called and when it returned (perf_counter, by spec name). Observes only."""

    def __init__(self, runtime: ContainerRuntime) -> None:
        self.called: dict[str, float] = {}
        self.returned: dict[str, float] = {}
        self._start = runtime.start
        setattr(runtime, "start", self)  # noqa: B010 (an instance attribute shadows the method for every caller)

    async def __call__(self, spec: ContainerSpec) -> str:
        self.called[spec.name] = time.perf_counter()
        container_id = await self._start(spec)
        self.returned[spec.name] = time.perf_counter()
        return container_id


class KillStamps:
    """When the runtime's kill was called (perf_counter, by container id; the first call). Observes only."""

    def __init__(self, runtime: ContainerRuntime) -> None:
        self.called: dict[str, float] = {}
        self._kill = runtime.kill
        setattr(runtime, "kill", self)  # noqa: B010 (as StartStamps)

    async def __call__(self, container_id: str) -> None:
        self.called.setdefault(container_id, time.perf_counter())
        await self._kill(container_id)


@dataclass(slots=True)
class Subagents:
    """One app on one backend: its service, first-call probe and chat (folder in the IPC root)."""

    app: App
    service: SubagentService
    probe: FirstCallProbe
    tg: FakeTelegram
    chat_id: int
    folder: str
    starts: StartStamps | None = None  # Kubernetes' start stamps
    kills: KillStamps | None = None  # Kubernetes' kill stamps
    docker_started: dict[str, tuple[str, float]] = field(default_factory=dict)  # Docker's, by name (id, when)

    async def wait_done(self, run_id: str) -> str:
        """Until the run has its final status and its container or Job is cleaned up; returns the status."""
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while True:
            record = await self.service.runs.get(run_id)
            if record is not None and record.status in FINAL_STATUSES and run_id not in self.service.live:
                return record.status
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} not done within {RUN_TIMEOUT_SECONDS:g} s")
            await asyncio.sleep(0.05)

    async def wait_pool(self, ready: int) -> None:
        """Until the warm pool has `ready` members ready (after a claim it makes a new one in the background)."""
        pool = self.service.pool
        assert pool is not None, "SUBAGENT_WARM_POOL did not make a pool on this backend"
        async with asyncio.timeout(RUN_TIMEOUT_SECONDS):
            while pool.counts()[0] < ready:  # noqa: ASYNC110 (the pool has no event for it; a bench polls)
                await asyncio.sleep(0.05)


@asynccontextmanager
async def kube_app(
    settings: Settings, *, model: Model | None = None
) -> AsyncIterator[tuple[App, SubagentService, StartStamps, KillStamps]]:
    """bench/apps.py's `bench_app` with the runtime the product builds from the settings (here: Kubernetes)."""
    runtime = await asyncio.to_thread(build_runtime, settings)
    starts, kills = StartStamps(runtime), KillStamps(runtime)
    async with bench_app(settings, model=model, runtime=runtime) as bench:
        assert bench.service is not None
        yield bench.app, bench.service, starts, kills


async def subagents(
    stack: AsyncExitStack,
    ctx: BenchContext,
    index: int,
    backend: str,
    namespace: str,
    model: Model | None = None,
    *,
    warm_pool: int = 0,
) -> Subagents:
    """The app on `backend` in `stack` (Kubernetes runs in `namespace`), with chat `index` allowed and its folders
    made; `model` is the main agent's (a merge window long enough for bench/cancel.py's holding turn);
    `warm_pool` its SUBAGENT_WARM_POOL (off by default: today's cold path)."""
    chat_id = ctx.chat_id(index)
    tg = await stack.enter_async_context(FakeTelegram())
    tg.add_chat(chat_id, title=f"bench {backend}")
    overrides: dict[str, object] = {"ALLOWED_CHAT_IDS": str(chat_id), "SUBAGENT_WARM_POOL": warm_pool}
    if model is not None:
        overrides |= {
            "MERGE_WINDOW_SECONDS": MERGE_WINDOW_SECONDS,
            "SUBAGENT_TIMEOUT_SECONDS": HELD_RUN_TIMEOUT_SECONDS,
        }
    if backend != DOCKER:
        overrides |= {
            "SUBAGENT_RUNTIME": "kubernetes",
            "KUBECONFIG": os.environ.get("KUBECONFIG", ""),
            "KUBE_NAMESPACE": namespace,
            "KUBE_IMAGE_PULL_POLICY": "Never",
            "SUBAGENT_RUNTIME_CLASS": GVISOR if backend == KUBE_GVISOR else "",
        }
    data_dir = ctx.work_dir / f"data-{index}"
    settings = bench_settings(data_dir, token=tg.token, base_url=tg.base_url, **overrides)
    starts: StartStamps | None = None
    kills: KillStamps | None = None
    docker_started: dict[str, tuple[str, float]] = {}
    if backend == DOCKER:
        bench = await stack.enter_async_context(bench_app(settings, model=model, with_subagents=True))
        app, (service, runtime) = bench.app, bench.subagents()
        docker_started = runtime.started
    else:
        app, service, starts, kills = await stack.enter_async_context(kube_app(settings, model=model))
    chat = await app.stores.chats.ensure(chat_id, "supergroup", f"bench {backend}")
    await asyncio.to_thread(ensure_chat_dirs, service.paths.ipc_root, chat.folder)
    probe = FirstCallProbe(service.live)
    return Subagents(app, service, probe, tg, chat_id, chat.folder, starts, kills, docker_started)
