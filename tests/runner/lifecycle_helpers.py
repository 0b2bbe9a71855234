"""The real subagent service (real SQLite, real run channels on Unix sockets, the real container client)
on the in-memory container runtime: each "container" is a coroutine that talks to its run channel."""

from __future__ import annotations

import asyncio
import contextvars
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from container.channel import RunChannel
from container.protocol import CHANNEL_DIR, CHANNEL_SOCKET_FILE, SpawnRequest
from container.task import RunResult
from core.allowances import Allowances
from core.delivery import Delivery
from core.outbox import DeliveryError
from core.settings import Settings
from core.store.chats import Chat
from core.store.spend import SpendStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from runner.ipc.batch import RequestOutcome
from runner.kube.job_spec import JobOptions
from runner.kube.kube_runtime import KubeRuntime
from runner.runtimes.runtime import ContainerRuntime
from runner.service import SubagentService
from runner.storage.paths import DataPaths
from tests.bot.helpers import RecordingChannel, make_delivery
from tests.fakes.memory_kube import MemoryKube, no_bridge
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import make_settings

CHAT_ID = -1001
OTHER_CHAT_ID = -1002
WAIT_SECONDS = 10.0  # only so a broken test fails instead of hanging
POLL_SECONDS = 0.01  # the store has no change events: states are looked at this often

Behaviour = Callable[[RunChannel, MemoryContainer], Awaitable[int | None]]
# Which runtime the service runs on: "docker" (the memory runtime itself) or "kubernetes" (the real Job runtime
# over tests/fakes/memory_kube.py, whose pods are the memory runtime's containers); set by tests/runner/lifecycle's
# `both_backends` fixture.
BACKEND: contextvars.ContextVar[str] = contextvars.ContextVar("lifecycle_backend", default="docker")
KUBE_WAIT_SLICE_SECONDS = 1  # the fake's watch slices: short, so a stopping test never waits on one


def completing(text: str = "all done", session: bytes | None = None):  # type: ignore[no-untyped-def]
    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        task = await channel.task()
        if session is not None:
            await channel.save_session(session)
        await channel.report(RunResult(status="completed", result=f"{text}: {task.task}"))
        return 0

    return behaviour


def forever(reported: asyncio.Event | None = None):  # type: ignore[no-untyped-def]
    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        if reported is not None:
            reported.set()
        await asyncio.Event().wait()
        return None

    return behaviour


def reports_then_hangs(result: str, reported: asyncio.Event | None = None):  # type: ignore[no-untyped-def]
    """Reports a completed result, then never exits (the engine is slow, or the container lingers)."""

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        await channel.report(RunResult(status="completed", result=result))
        if reported is not None:
            reported.set()
        await asyncio.Event().wait()
        return None

    return behaviour


def socket_of(container: MemoryContainer) -> Path:
    assert container.spec is not None
    mount = next(m for m in container.spec.mounts if m.target == CHANNEL_DIR)
    return mount.source / CHANNEL_SOCKET_FILE


@contextmanager
def mounted_socket(container: MemoryContainer) -> Iterator[Path]:
    """The run socket as the container's agent reaches it: through its channel folder's bind mount, which follows
    the folder when the host renames it (a warm pool claim, before the channel answers the member's task). A
    descriptor of the folder, opened as the container starts, follows it the same way; the path it was started
    with would be missing until the memory runtime's claim() and the agent's next request would wait out a retry."""
    path = socket_of(container)
    try:
        folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:  # no folder to follow (a test's container started without one)
        yield path
        return
    try:
        yield Path(f"/proc/self/fd/{folder}") / path.name
    finally:
        os.close(folder)


class FlakyChannel(RecordingChannel):
    """Telegram as a test wants it: `fail_sends` makes every send a transient failure (rows wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_sends = False

    async def send_part(self, chat_id: int, part: str, reply_to: int | None = None) -> int | None:
        if self.fail_sends:
            raise DeliveryError("Telegram is slow today", permanent=False, retry_after_seconds=0.01)
        return await super().send_part(chat_id, part)


@dataclass
class Rig:
    settings: Settings
    stores: Stores
    channel: FlakyChannel
    delivery: Delivery
    runtime: MemoryRuntime
    service: SubagentService
    chat: Chat
    typing: TypingIndicator
    allowances: Allowances | None = None

    async def spawn(self, task: str = "do it", *, chat_id: int = CHAT_ID, turn_id: str | None = None) -> str:
        run_id = secrets.token_hex(6)
        request = SpawnRequest(request_id=run_id, task=task, turn_id=turn_id)
        assert await self.service.manager.on_request(chat_id, request) is RequestOutcome.ACCEPTED
        return run_id

    async def status(self, run_id: str) -> str:
        record = await self.service.runs.get(run_id)
        assert record is not None
        return record.status

    async def until_status(self, run_id: str, *statuses: str) -> str:
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                status = await self.status(run_id)
                if status in statuses:
                    return status
                await asyncio.sleep(POLL_SECONDS)

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                if predicate():
                    return
                await asyncio.sleep(POLL_SECONDS)

    async def settled(self) -> None:
        """Every run of this process has ended and been cleaned up."""
        await self.until(lambda: not self.service.live.all())

    def texts(self, chat_id: int = CHAT_ID) -> list[str]:
        return self.channel.texts(chat_id)


Prepare = Callable[[Stores, MemoryRuntime, str], Awaitable[None]]


def kube_over(runtime: MemoryRuntime, settings: Settings) -> ContainerRuntime:
    """The Job runtime on a fake API whose pods are `runtime`'s containers."""
    paths = DataPaths(settings.data_dir)

    def options() -> JobOptions:
        return JobOptions(
            namespace=MemoryKube.namespace,
            pull_policy=settings.kube_image_pull_policy,
            ttl_seconds=settings.kube_job_ttl_seconds,
            deadline_seconds=settings.subagent_timeout_seconds,
            workspace_quota_mb=settings.workspace_quota_mb,
        )

    api = MemoryKube(runtime, asyncio.get_running_loop(), paths.channel_dir)
    return KubeRuntime(
        api,
        max_concurrency=8,
        options=options,
        bridges=no_bridge,
        channel_dir=paths.channel_dir,
        wait_slice_seconds=KUBE_WAIT_SLICE_SECONDS,
    )


@asynccontextmanager
async def rig(
    tmp_path: Path,
    behaviour: Behaviour,
    *,
    prepare: Prepare | None = None,
    with_allowances: bool = False,
    **overrides: Any,
) -> AsyncIterator[Rig]:
    """`prepare` sets the scene an earlier process left (runs in the store, containers in the engine),
    given the stores, the runtime and this deployment's instance label, before the service starts.
    `with_allowances`: the service's runs spend daily allowances (CHAT_DAILY_TOKENS, DAILY_TOKENS in `overrides`)."""
    settings = make_settings(tmp_path / "data", **overrides)
    stores = await Stores.open(settings)
    channel = FlakyChannel()
    delivery = make_delivery(stores.db, channel)
    typing = TypingIndicator(channel.send_typing, settings.typing_interval_seconds)

    async def on_start(container: MemoryContainer) -> int | None:
        with mounted_socket(container) as path:
            async with RunChannel(path) as run_channel:
                return await behaviour(run_channel, container)

    runtime = MemoryRuntime(on_start=on_start)
    allowances = Allowances(settings, SpendStore(stores.db)) if with_allowances else None
    engine = kube_over(runtime, settings) if BACKEND.get() == "kubernetes" else runtime
    service = SubagentService(settings, stores, delivery, typing, engine, file_source=channel, allowances=allowances)
    chat = await stores.chats.ensure(CHAT_ID, "group", "main")
    await stores.chats.ensure(OTHER_CHAT_ID, "group", "other")
    if prepare is not None:
        await prepare(stores, runtime, service.paths.instance_id)
    await service.start()
    try:
        yield Rig(settings, stores, channel, delivery, runtime, service, chat, typing, allowances)
    finally:
        await service.stop()
        await runtime.stop_behaviours()
        await typing.close()
        await stores.db.close()
