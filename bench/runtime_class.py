"""SUBAGENT_RUNTIME_CLASS=runsc (gVisor) against the engine's default runc: what the second kernel costs at start.

Containers: the product's `DockerRuntime.start` with a subagent-image spec (every hardening, `--network none`),
its entrypoint the image's Python connecting to a host Unix socket bind-mounted read-only (as the run channel
is) and then sleeping. Stamps: create called → start returned, → the process connected (it runs), and the
kill asked → the engine reported it exited. A real subagent: the full app (one per runtime, each with its
own fake Telegram), a spawn request file renamed into tasks/ → the run's first LLM request at its proxy.
Samples alternate runc, runsc, one container at a time, so a change in the machine's load hits both alike.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

from bench.apps import BenchApp, FirstCallProbe, bench_app
from bench.common import BenchContext, bench_settings, ms
from bench.engine import engine_client
from bench.report import Measure, Row
from bench.spawn import Arrivals
from container.protocol import SpawnRequest
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID, ContainerSpec, Mount
from runner.storage.paths import CONTAINER_GID, CONTAINER_UID, container_user
from tests.fakes.telegram_server import FakeTelegram

NAME = "runtime_class"
RUNSC = "runsc"
RUNTIMES: tuple[str | None, ...] = (None, RUNSC)  # None: the engine's default (runc), the baseline
WARMUP = 1
RUN_TIMEOUT_SECONDS = 120.0
SOCKET_DIR_IN_CONTAINER = "/bench"
# Connect (the process runs), then sleep until killed: the same container serves the kill sample.
CONNECT_THEN_SLEEP = (
    "import socket, sys, time\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect('/bench/s.sock')\n"
    "s.sendall(sys.argv[1].encode())\n"
    "s.close()\n"
    "time.sleep(300)\n"
)


def label(runtime_class: str | None) -> str:
    return runtime_class or "runc"


async def _container_sample(
    runtime: DockerRuntime, arrivals: Arrivals, base: ContainerSpec, runtime_class: str | None, token: str
) -> dict[str, float]:
    """One container: ms from create to start returned and to its process connecting; kill → exited."""
    spec = replace(base, name=f"crewbot-bench-{token}", command=[token], runtime_class=runtime_class)
    t0 = time.perf_counter()
    container_id = await runtime.start(spec)
    t_started = time.perf_counter()
    try:
        t_running = await arrivals.wait(token, RUN_TIMEOUT_SECONDS)
        t_kill = time.perf_counter()
        await runtime.kill(container_id)
        await runtime.wait(container_id, RUN_TIMEOUT_SECONDS)
        t_exited = time.perf_counter()
    finally:
        await runtime.remove(container_id)
    return {"started": ms(t_started - t0), "running": ms(t_running - t0), "killed": ms(t_exited - t_kill)}


async def _containers(ctx: BenchContext, image: str, count: int) -> dict[str | None, list[dict[str, float]]]:
    socket_dir = ctx.work_dir / "sock"
    socket_dir.mkdir()
    if os.getuid() == 0:
        os.chown(socket_dir, CONTAINER_UID, CONTAINER_GID)
    arrivals = Arrivals()
    server = await asyncio.start_unix_server(arrivals.handle, path=str(socket_dir / "s.sock"))
    os.chmod(socket_dir / "s.sock", 0o666)
    client = await asyncio.to_thread(engine_client)
    entrypoint = client.images.get(image).attrs["Config"].get("Entrypoint") or ["python3"]
    client.close()
    base = ContainerSpec(
        name="",
        image=image,
        command=[],
        entrypoint=[str(entrypoint[0]), "-P", "-c", CONNECT_THEN_SLEEP],
        labels={LABEL_APP: "1", LABEL_CHAT_ID: str(ctx.chat_id(9)), "crewbot.bench": "1"},
        mounts=[Mount(socket_dir, SOCKET_DIR_IN_CONTAINER, read_only=True)],
        user=container_user(),
        workdir="/tmp",
    )
    samples: dict[str | None, list[dict[str, float]]] = {runtime_class: [] for runtime_class in RUNTIMES}
    runtime = DockerRuntime(max_concurrency=2)
    batch = secrets.token_hex(3)
    try:
        for i in range(WARMUP + count):
            for runtime_class in RUNTIMES:
                token = f"{batch}-{label(runtime_class)}-{i:03d}"
                sample = await _container_sample(runtime, arrivals, base, runtime_class, token)
                if i >= WARMUP:
                    samples[runtime_class].append(sample)
    finally:
        await runtime.close()
        server.close()
        await server.wait_closed()
    return samples


async def _first_calls(ctx: BenchContext, count: int) -> dict[str | None, list[float]]:
    """Request file renamed → the run's first LLM request, for a real subagent (`$ true`) under each runtime."""
    apps: dict[str | None, tuple[BenchApp, FirstCallProbe, Path, str]] = {}
    samples: dict[str | None, list[float]] = {runtime_class: [] for runtime_class in RUNTIMES}
    async with AsyncExitStack() as stack:
        for index, runtime_class in enumerate(RUNTIMES):
            chat_id = ctx.chat_id(index)
            tg = await stack.enter_async_context(FakeTelegram())
            tg.add_chat(chat_id, title=f"bench {label(runtime_class)}")
            settings = bench_settings(
                ctx.work_dir / f"data-{label(runtime_class)}",
                token=tg.token,
                base_url=tg.base_url,
                ALLOWED_CHAT_IDS=str(chat_id),
                SUBAGENT_RUNTIME_CLASS=runtime_class or "",
            )
            bench = await stack.enter_async_context(bench_app(settings, with_subagents=True))
            service, _ = bench.subagents()
            chat = await bench.app.stores.chats.ensure(chat_id, "supergroup", f"bench {label(runtime_class)}")
            await asyncio.to_thread(ensure_chat_dirs, service.paths.ipc_root, chat.folder)
            apps[runtime_class] = (bench, FirstCallProbe(service.live), service.paths.ipc_root, chat.folder)
        await asyncio.sleep(0.5)  # the watchers restart for the new folders; let them settle
        batch = secrets.token_hex(3)
        for i in range(WARMUP + count):
            for runtime_class, (bench, probe, ipc_root, folder) in apps.items():
                run_id = f"rc-{batch}-{label(runtime_class)}-{i:03d}"
                write_spawn_request(ipc_root, folder, SpawnRequest(request_id=run_id, task="$ true", label="rc"))
                t0 = time.perf_counter()  # the rename is write_spawn_request's last step
                first = await probe.wait(run_id, RUN_TIMEOUT_SECONDS)
                status = await bench.wait_run_done(run_id, RUN_TIMEOUT_SECONDS)
                if status != "completed":
                    ctx.note(f"run {run_id} ended {status}")
                if i >= WARMUP:
                    samples[runtime_class].append(ms(first - t0))
    return samples


def _row(metric: str, runsc: list[float], runc: list[float]) -> Row:
    return Row(
        bench=NAME,
        metric=f"{metric} under runsc (gVisor, ptrace)",
        unit="ms",
        result=Measure.of(runsc),
        baseline_label="the same under runc (the engine's default)",
        baseline=Measure.of(runc),
    )


async def run(ctx: BenchContext) -> list[Row]:
    client = await asyncio.to_thread(engine_client)
    try:
        runtimes = (await asyncio.to_thread(client.info)).get("Runtimes") or {}
    finally:
        client.close()
    if RUNSC not in runtimes:
        raise RuntimeError("the engine has no runtime runsc: `make engine` installs and registers it")
    count = ctx.scaled(10, 3)
    image = bench_settings(ctx.work_dir / "probe").subagent_image
    containers = await _containers(ctx, image, count)
    first_calls = await _first_calls(ctx, ctx.scaled(6, 2))

    def of(runtime_class: str | None, key: str) -> list[float]:
        return [sample[key] for sample in containers[runtime_class]]

    ctx.note(
        f"{count} container samples and {len(first_calls[RUNSC])} subagent runs per runtime (after {WARMUP} "
        f"warm-up), alternating runc and runsc one at a time; image {image}; runsc as `make engine` registers it"
    )
    return [
        _row("create → start returned", of(RUNSC, "started"), of(None, "started")),
        _row("create → the process runs (python -c connect)", of(RUNSC, "running"), of(None, "running")),
        _row("kill → the engine reports it exited", of(RUNSC, "killed"), of(None, "killed")),
        _row("request file → a real subagent's first LLM request", first_calls[RUNSC], first_calls[None]),
    ]
