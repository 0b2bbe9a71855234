"""An in-memory `ContainerRuntime` for Docker-free tests of the run lifecycle and its races.

It keeps `DockerRuntime`'s semantics while the test decides what the engine would: when a container exits
and how, when the engine is away, which call fails, how long a start takes. Blocked calls are futures the
test's decisions resolve, so no test sleeps to synchronise; `until()` waits for any state."""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from runner.runtimes.resource_use import ResourceSample
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_RUN_ID,
    ContainerGone,
    ContainerInfo,
    ContainerSpec,
    ContainerStartError,
    RuntimeUnavailable,
    container_name,
)

SIGKILL_EXIT_CODE = 137  # what Docker reports for a container ended by kill() or a forced remove()
CRASH_EXIT_CODE = 1  # a behaviour that raises stands for a process that crashed

# A container's process: may write its logs; returns its exit code, or None to run until finished or killed.
Behaviour = Callable[["MemoryContainer"], Awaitable[int | None]]
Status = Literal["running", "exited"]


@dataclass(eq=False)
class MemoryContainer:
    id: str
    name: str
    labels: dict[str, str]
    spec: ContainerSpec | None  # None for one made by add_existing (started by "an earlier process")
    started_at: float
    status: Status = "running"
    exit_code: int | None = None
    logs: bytes = b""
    removed: bool = False
    waiters: list[asyncio.Future[int]] = field(default_factory=list)
    behaviour: asyncio.Task[None] | None = None
    usage: ResourceSample | None = None  # what `usage()` reports while it runs (the test sets it)


class MemoryRuntime:
    """`runner.runtimes.runtime.ContainerRuntime` in memory, driven by the test: `images` are those the "engine" has
    (None: all), `on_start` the behaviour each started container runs as its own task. As an async context
    manager it cancels running behaviours at exit and re-raises the first that crashed, failing its test."""

    def __init__(self, *, images: set[str] | None = None, on_start: Behaviour | None = None) -> None:
        self.images = images
        self.on_start = on_start
        self.started_specs: list[ContainerSpec] = []
        self.kills: list[str] = []  # every kill the engine answered, no-ops included, in order
        self.removed: list[str] = []  # every container actually removed, in order
        self.max_running = 0
        self.claims: list[tuple[str, Path]] = []  # (container id, channel folder) of every claim, in order
        self.image_generation = 0  # image_id() changes with it: a test's image rebuilt under the same tag
        self.container_usage: ResourceSample | None = None  # what containers started from now on report while running
        self.behaviour_errors: list[Exception] = []
        self._containers: dict[str, MemoryContainer] = {}  # removed ones too, for inspection afterwards
        self._down = False
        self._closed = False
        self._start_failures: deque[BaseException] = deque()
        self._kill_failures: deque[BaseException] = deque()
        self._holding = False
        self._held: list[asyncio.Future[None]] = []
        self._changed = asyncio.Event()

    async def __aenter__(self) -> MemoryRuntime:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop_behaviours()
        if exc_info[0] is None and self.behaviour_errors:
            raise self.behaviour_errors[0]

    # -- the test's controls --------------------------------------------------------------------------

    def container(self, container_id: str) -> MemoryContainer:
        """Any container this runtime ever had, removed ones included (KeyError for an unknown id)."""
        return self._containers[container_id]

    def running_count(self) -> int:
        return sum(1 for c in self._live() if c.status == "running")

    @property
    def held_starts(self) -> int:
        return sum(1 for gate in self._held if not gate.done())

    def finish(self, container_id: str, exit_code: int, logs: bytes = b"") -> bool:
        """The container's process exits; False if it had already exited or been removed."""
        container = self._containers[container_id]
        if container.status != "running":  # removed ones were killed first
            return False
        container.logs += logs
        self._exit(container, exit_code)
        return True

    def set_engine_down(self, down: bool) -> None:
        """While down every call raises RuntimeUnavailable; calls blocked in the engine fail at once,
        as the SDK's do when their connection drops. Containers keep running and can still finish."""
        self._down = down
        self._fail_blocked()

    def fail_next_start(self, exc: BaseException) -> None:
        self._start_failures.append(exc)

    def fail_next_kill(self, exc: BaseException) -> None:
        self._kill_failures.append(exc)

    def hold_starts(self) -> None:
        """From now on start() waits, before the container exists, until release_starts()."""
        self._holding = True

    def release_starts(self) -> None:
        self._holding = False
        held, self._held = self._held, []
        for future in held:
            if not future.done():
                future.set_result(None)
        self._notify()

    def add_existing(
        self, labels: dict[str, str], status: Status = "running", exit_code: int | None = None, started_at: float = 0.0
    ) -> str:
        """A container left by an earlier process, for recovery: labels stored as given, named as the
        manager names a run's container, started now unless `started_at` says when."""
        if (status == "exited") != (exit_code is not None):
            raise ValueError("an exited container needs an exit code, and only an exited one has one")
        name = container_name(labels[LABEL_RUN_ID]) if LABEL_RUN_ID in labels else f"existing-{len(self._containers)}"
        container = MemoryContainer(self._new_id(name), name, dict(labels), None, started_at or time.time())
        container.status, container.exit_code = status, exit_code
        self._add(container)
        return container.id

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds; it is checked again after every change of state."""
        while not predicate():
            await self._changed.wait()

    async def stop_behaviours(self) -> None:
        """Cancel the behaviours still running (test teardown); the containers stay as they are."""
        tasks = [c.behaviour for c in self._containers.values() if c.behaviour is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- ContainerRuntime ---------------------------------------------------------------------------

    async def ping(self) -> None:
        self._check_engine()

    async def start(self, spec: ContainerSpec) -> str:
        self._check_engine()
        if self._holding:
            # Parked on a future so an engine outage (or close) fails the held call as it would a real
            # one; cancelling the caller cancels the future, which then no longer counts as held.
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._held.append(gate)
            self._notify()
            await gate
        if self._start_failures:
            raise self._start_failures.popleft()
        if self.images is not None and spec.image not in self.images:
            raise ContainerStartError(f"image {spec.image!r} not found on the engine")
        if any(c.name == spec.name for c in self._live()):
            # Docker answers 409 to a create whose name is taken, even by an exited container.
            raise ContainerStartError(f"engine refused to create container {spec.name!r}: name already in use")
        labels = {LABEL_APP: "1", **spec.labels}  # as DockerRuntime's create_options
        container = MemoryContainer(
            self._new_id(spec.name), spec.name, labels, spec, time.time(), usage=self.container_usage
        )
        self.started_specs.append(spec)
        self._add(container)
        if self.on_start is not None:
            container.behaviour = asyncio.create_task(self._behave(container, self.on_start))
        return container.id

    async def wait(self, container_id: str, timeout_seconds: float | None = None) -> int | None:
        if timeout_seconds is not None and timeout_seconds <= 0:
            return None  # DockerRuntime's deadline has passed before it asks the engine anything
        self._check_engine()
        container = self._get(container_id)
        if container is None:
            raise ContainerGone(f"container {container_id[:12]} no longer exists; its exit code is unknown")
        if container.exit_code is not None:
            return container.exit_code
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        container.waiters.append(future)
        try:  # a time-out cancels the future: _exit and _fail_blocked pass over it
            async with asyncio.timeout(timeout_seconds):
                return await future
        except TimeoutError:
            return None

    async def kill(self, container_id: str) -> None:
        self._check_engine()
        if self._kill_failures:
            raise self._kill_failures.popleft()
        self.kills.append(container_id)
        container = self._get(container_id)
        if container is not None and container.status == "running":
            self._exit(container, SIGKILL_EXIT_CODE)

    async def logs(self, container_id: str) -> bytes:
        self._check_engine()
        container = self._get(container_id)
        return b"" if container is None else container.logs

    async def remove(self, container_id: str) -> None:
        self._check_engine()
        container = self._get(container_id)
        if container is None:
            return
        if container.status == "running":  # force: killed first, so a blocked wait() sees 137
            self._exit(container, SIGKILL_EXIT_CODE)
        container.removed = True
        self.removed.append(container_id)
        self._notify()

    async def usage(self, container_id: str) -> ResourceSample | None:
        """As the engine: figures while it runs, none once it has exited (its cgroup is gone)."""
        self._check_engine()
        container = self._containers.get(container_id)
        if container is None or container.removed or container.status != "running":
            return None
        return container.usage

    async def claim(self, container_id: str, channel_dir: Path) -> None:
        """As DockerRuntime's (nothing to tell the engine), recorded for the test. A bind mount follows the folder
        the host renamed; a behaviour here reaches its socket by the path it was started with: a link from that
        path to the run's folder stands for the mount."""
        self._check_engine()
        self.claims.append((container_id, channel_dir))
        container = self._get(container_id)
        if container is not None and container.spec is not None:
            for mount in container.spec.mounts:
                if mount.read_only and not mount.source.exists():
                    mount.source.symlink_to(channel_dir, target_is_directory=True)

    async def image_id(self, image: str) -> str | None:
        """A stable id per image name and `image_generation` (bump it to stand for a rebuild under the same tag)."""
        self._check_engine()
        if self.images is not None and image not in self.images:
            return None
        return hashlib.sha256(f"{image}:{self.image_generation}".encode()).hexdigest()

    async def image_exists(self, image: str) -> bool:
        self._check_engine()
        return self.images is None or image in self.images

    async def close(self) -> None:
        """As DockerRuntime.close: later calls and blocked waits raise RuntimeUnavailable; containers run on."""
        self._closed = True
        self._fail_blocked()

    async def list(self, labels: dict[str, str]) -> builtins.list[ContainerInfo]:
        self._check_engine()
        # Newest first, as the engine lists them.
        found = [c for c in reversed(self._live()) if all(c.labels.get(k) == v for k, v in labels.items())]
        return [ContainerInfo(c.id, c.name, dict(c.labels), c.status, c.exit_code, c.started_at) for c in found]

    # -- plumbing -------------------------------------------------------------------------------------

    def _live(self) -> builtins.list[MemoryContainer]:
        return [c for c in self._containers.values() if not c.removed]

    def _get(self, container_id: str) -> MemoryContainer | None:
        return next((c for c in self._live() if c.id == container_id), None)

    def _engine_error(self) -> RuntimeUnavailable | None:
        if self._closed:
            return RuntimeUnavailable("the Docker runtime is closed")
        if self._down:
            return RuntimeUnavailable("Docker engine not reachable at memory://: taken down by the test")
        return None

    def _check_engine(self) -> None:
        if (error := self._engine_error()) is not None:
            raise error

    def _fail_blocked(self) -> None:
        if (error := self._engine_error()) is not None:
            blocked: builtins.list[asyncio.Future[Any]] = [*self._held]
            blocked += (future for c in self._containers.values() for future in c.waiters)
            for future in blocked:
                if not future.done():
                    future.set_exception(error)
        self._notify()

    def _new_id(self, name: str) -> str:
        # 64 hex digits like Docker's (callers print id[:12]); deterministic, so runs are repeatable.
        return hashlib.sha256(f"{len(self._containers)}:{name}".encode()).hexdigest()

    def _add(self, container: MemoryContainer) -> None:
        self._containers[container.id] = container
        self.max_running = max(self.max_running, self.running_count())
        self._notify()

    def _exit(self, container: MemoryContainer, exit_code: int) -> None:
        container.status, container.exit_code = "exited", exit_code
        for future in container.waiters:
            if not future.done():
                future.set_result(exit_code)
        container.waiters.clear()
        task = container.behaviour
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # the process died with its container
        self._notify()

    async def _behave(self, container: MemoryContainer, behaviour: Behaviour) -> None:
        try:
            exit_code = await behaviour(container)
        except Exception as exc:
            self.behaviour_errors.append(exc)
            container.logs += f"{type(exc).__name__}: {exc}\n".encode()
            exit_code = CRASH_EXIT_CODE
        if exit_code is not None and container.status == "running":
            self._exit(container, exit_code)

    def _notify(self) -> None:
        # Wake every until() now; each then waits on the fresh event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()
