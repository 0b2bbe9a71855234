"""Spawn overhead: a spawn request file until the subagent's first LLM request, and where the time goes.

Start: the request's atomic rename into the chat's tasks/ folder (runner.ipc.requests.write_spawn_request), with
the full app running (real watcher, task manager, LLM proxy, Docker runtime; offline provider).
Stops: the run's first LLM request arriving at its proxy socket (by then the container's process has
started, loaded its task and asked for its first model step, which the host turned into that request);
and, for the breakdown, when the watcher handed the request over, when the run was marked running (its
channel open) and when the engine's start returned.

Baselines, measured in the same run with the same image and `--network none`:
- bare: create + start of `python -c "<connect to a socket>"` with the image's interpreter as entrypoint,
  stopped when the host accepts its connection (the process runs), or when start() returned;
- bare + imports: the same, but the process first imports what the agent imports before its first call,
  so the ratio against it is crewbot's own orchestration on top of "docker run + Python start-up".
Samples are interleaved (a run, a bare container, a bare container with imports, ...), one container at a
time, so a change in the machine's load hits all three alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import time
from types import TracebackType
from typing import Self

import docker

from bench.apps import FirstCallProbe, bench_app
from bench.common import BenchContext, bench_settings, ms
from bench.engine import BareMount, bare_start, engine_client, image_interpreter, remove_container
from bench.report import Measure, Row
from container.protocol import SpawnRequest
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.runtimes.runtime import container_name
from runner.storage.paths import CONTAINER_GID, CONTAINER_UID, container_user
from tests.fakes.telegram_server import FakeTelegram

NAME = "spawn"
WARMUP = 1
RUN_TIMEOUT_SECONDS = 120.0
SOCKET_DIR_IN_CONTAINER = "/bench"
CONNECT_CODE = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect('/bench/s.sock')\n"
    "s.sendall(sys.argv[1].encode())\n"
    "s.close()\n"
)
# What `python -m container` has imported when it asks for its first model step (the standard library only).
AGENT_IMPORTS = "import container.__main__, container.run\n"


class Arrivals:
    """A Unix socket server noting when each container's process connected (by the token it sends)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self._changed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        at = time.perf_counter()
        token = (await reader.read(128)).decode(errors="replace")
        self.at[token] = at
        self._changed.set()
        writer.close()

    async def wait(self, token: str, timeout_seconds: float) -> float:
        deadline = time.monotonic() + timeout_seconds
        while token not in self.at:
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"container {token} did not connect within {timeout_seconds:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return self.at[token]


class _BareRunner:
    """Runs bare containers of the image one at a time and times them against a mounted Unix socket."""

    def __init__(self, ctx: BenchContext, image: str) -> None:
        self._ctx = ctx
        self._image = image
        self._socket_dir = ctx.work_dir / "bare"
        self._arrivals = Arrivals()
        self._server: asyncio.Server | None = None
        self._client: docker.DockerClient | None = None
        self._interpreter = ""
        self._batch = secrets.token_hex(3)
        self._count = 0

    async def __aenter__(self) -> Self:
        self._socket_dir.mkdir()
        if os.getuid() == 0:
            os.chown(self._socket_dir, CONTAINER_UID, CONTAINER_GID)
        socket_path = str(self._socket_dir / "s.sock")
        self._server = await asyncio.start_unix_server(self._arrivals.handle, path=socket_path)
        os.chmod(socket_path, 0o666)
        self._client = await asyncio.to_thread(engine_client)
        self._interpreter = await asyncio.to_thread(image_interpreter, self._client, self._image)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._client is not None:
            self._client.close()

    async def sample(self, code: str) -> tuple[float, float]:
        """(create + start returned, process connected) in ms after the create call, for one container."""
        assert self._client is not None
        client = self._client
        self._count += 1
        token = f"{self._batch}-{self._count:03d}"
        t0 = time.perf_counter()
        container_id = await asyncio.to_thread(
            functools.partial(
                bare_start,
                client,
                self._image,
                name=f"crewbot-bench-{token}",
                entrypoint=[self._interpreter, "-P", "-c", code],
                command=[token],
                chat_id=self._ctx.chat_id(1),
                user=container_user(),
                mounts=[BareMount(str(self._socket_dir), SOCKET_DIR_IN_CONTAINER)],  # absolute (mkdtemp)
            )
        )
        t_started = time.perf_counter()
        try:
            t_running = await self._arrivals.wait(token, RUN_TIMEOUT_SECONDS)
            await asyncio.to_thread(functools.partial(client.api.wait, container_id, timeout=60))
        finally:
            await asyncio.to_thread(remove_container, client, container_id)
        return ms(t_started - t0), ms(t_running - t0)


# Where the time goes: each stage from the stamp before it (ms after the request file's rename).
STAGES = (
    ("picked_up", "", "request file → the watcher handed it to the task manager"),
    ("running", "picked_up", "→ run marked running (task, session and channel ready)"),
    ("started", "running", "→ the engine's container start returned"),
    ("first_call", "started", "→ the container's first LLM request at the proxy socket (Python, imports)"),
)


async def run(ctx: BenchContext) -> list[Row]:
    count = ctx.scaled(10, 3)
    chat_id = ctx.chat_id(0)
    stamps: list[dict[str, float]] = []
    bare_samples: dict[str, list[float]] = {"bare_started": [], "bare": [], "imports": []}
    statuses: list[str] = []
    async with FakeTelegram() as tg:
        settings = bench_settings(
            ctx.work_dir / "data", token=tg.token, base_url=tg.base_url, ALLOWED_CHAT_IDS=str(chat_id)
        )
        tg.add_chat(chat_id, title="bench spawn")
        async with (
            bench_app(settings, with_subagents=True) as bench,
            _BareRunner(ctx, settings.subagent_image) as bare,
        ):
            service, runtime = bench.subagents()
            probe = FirstCallProbe(service.live)
            chat = await bench.app.stores.chats.ensure(chat_id, "supergroup", "bench spawn")
            ipc_root = service.paths.ipc_root
            await asyncio.to_thread(ensure_chat_dirs, ipc_root, chat.folder)
            await asyncio.sleep(0.5)  # the watcher restarts for the new folder; let it settle
            batch = secrets.token_hex(3)
            # Interleaved, one container at a time, so a change in the machine's load hits all three alike.
            for i in range(WARMUP + count):
                run_id = f"sp-{batch}-{i:03d}"
                write_spawn_request(
                    ipc_root, chat.folder, SpawnRequest(request_id=run_id, task="$ true", label="spawn")
                )
                t0, t0_wall = time.perf_counter(), time.time()  # the rename is write_spawn_request's last step
                first = await probe.wait(run_id, RUN_TIMEOUT_SECONDS)
                status = await bench.wait_run_done(run_id, RUN_TIMEOUT_SECONDS)
                record = await service.runs.get(run_id)
                bare_started, bare_running = await bare.sample(CONNECT_CODE)
                _, imports_running = await bare.sample(AGENT_IMPORTS + CONNECT_CODE)
                if i < WARMUP:
                    continue
                _, start_returned = runtime.started[container_name(run_id)]
                stamp = {"started": ms(start_returned - t0), "first_call": ms(first - t0)}
                if record is not None and record.started_at is not None:
                    stamp |= {
                        "picked_up": ms(record.created_at - t0_wall),
                        "running": ms(record.started_at - t0_wall),
                    }
                stamps.append(stamp)
                bare_samples["bare_started"].append(bare_started)
                bare_samples["bare"].append(bare_running)
                bare_samples["imports"].append(imports_running)
                statuses.append(status)
    if any(status != "completed" for status in statuses):
        ctx.note(f"not every run completed: {statuses}")
    ctx.note(
        f"{count} samples each (after {WARMUP} warm-up), interleaved one container at a time; "
        f"image {settings.subagent_image}"
    )
    return _rows(stamps, bare_samples)


def _rows(stamps: list[dict[str, float]], bare: dict[str, list[float]]) -> list[Row]:
    def of(key: str) -> Measure:
        return Measure.of([stamp[key] for stamp in stamps if key in stamp])

    rows = [
        Row(
            bench=NAME,
            metric="request file → container started (engine start returned)",
            unit="ms",
            result=of("started"),
            baseline_label="bare docker create + start returned",
            baseline=Measure.of(bare["bare_started"]),
        ),
        Row(
            bench=NAME,
            metric="request file → the container's first LLM request at the proxy socket",
            unit="ms",
            result=of("first_call"),
            baseline_label="bare docker run: python -c connect, until it connects",
            baseline=Measure.of(bare["bare"]),
        ),
        Row(
            bench=NAME,
            metric="the same (request file → the container's first LLM request)",
            unit="ms",
            result=of("first_call"),
            baseline_label="bare docker run: the agent's imports, then connect",
            baseline=Measure.of(bare["imports"]),
        ),
    ]
    for key, since, label in STAGES:
        durations = [
            stamp[key] - (stamp[since] if since else 0.0)
            for stamp in stamps
            if key in stamp and (not since or since in stamp)
        ]
        if durations:
            rows.append(
                Row(bench=NAME, metric=f"where the time goes: {label}", unit="ms", result=Measure.of(durations))
            )
    return rows
