"""The warm pool on the real engine and image: the real service, the offline subagent model (a task `$ cmd`
runs `cmd` in the container), real SQLite. One run per container, a hostile run that tries to outlive it, a
member killed from outside while idle, a chat whose folder holds files (mounted, a miss, never emptied) that
uses the pool once an admin cleared it, two runs of one chat at once (both of whose files are kept), and a crash
between a claim and its run's start."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import NotFound

from container.protocol import SpawnRequest
from core.store.runs import RunStatus, RunStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from runner.ipc.batch import RequestOutcome
from runner.lifecycle.warm_pool import WarmPool
from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.runtime import LABEL_INSTANCE, LABEL_POOL
from runner.service import SubagentService
from runner.storage.paths import DataPaths
from runner.storage.run_files import LOG_FILE
from tests.bot.helpers import RecordingChannel, make_delivery
from tests.harness import make_settings
from tests.runner.docker_helpers import remove_instance_containers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

CHAT_ID = -1001
WAIT_SECONDS = 90.0  # a container's Python start-up is slow on a loaded 2-core machine
EXIT_BAD_TASK = 2  # container/__main__.py: the channel gave no usable task


@dataclass
class DockerRig:
    service: SubagentService
    stores: Stores
    folder: str

    @property
    def pool(self) -> WarmPool:
        assert self.service.pool is not None
        return self.service.pool

    async def run(self, task: str) -> tuple[str, str]:
        """Spawn `task`, wait for its outcome and its container's removal: (status, result or error)."""
        run_id = secrets.token_hex(6)
        outcome = await self.service.manager.on_request(CHAT_ID, SpawnRequest(request_id=run_id, task=task))
        assert outcome is RequestOutcome.ACCEPTED
        deadline = time.monotonic() + WAIT_SECONDS
        while (record := await self.service.runs.get(run_id)) is None or record.status in ("queued", "running"):
            assert time.monotonic() < deadline, f"run {run_id} did not finish"
            await asyncio.sleep(0.1)
        while run_id in self.service.live:
            assert time.monotonic() < deadline, f"run {run_id} was not cleaned up"
            await asyncio.sleep(0.1)
        return record.status, record.result or record.error or ""

    async def until_ready(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while self.pool.counts()[0] < count:
            assert time.monotonic() < deadline, f"pool not ready: {await self.pool.stats()}"
            await asyncio.sleep(0.1)

    def members(self) -> list[str]:
        return [c.id for c in _containers(self.service.paths.instance_id) if LABEL_POOL in c.labels]


def _containers(instance: str) -> list[docker.models.containers.Container]:
    client = docker.from_env()
    try:
        return list(client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}))
    finally:
        client.close()


def _exists(container_id: str) -> bool:
    client = docker.from_env()
    try:
        client.containers.get(container_id)
    except NotFound:
        return False
    finally:
        client.close()
    return True


@asynccontextmanager
async def docker_rig(tmp_path: Path, image: str, **overrides: Any) -> AsyncIterator[DockerRig]:
    settings = make_settings(tmp_path / "data", SUBAGENT_IMAGE=image, **overrides)
    stores = await Stores.open(settings)
    channel = RecordingChannel()
    typing = TypingIndicator(channel.send_typing, settings.typing_interval_seconds)
    runtime = DockerRuntime(max_concurrency=8)
    service = SubagentService(settings, stores, make_delivery(stores.db, channel), typing, runtime)
    chat = await stores.chats.ensure(CHAT_ID, "group", "main")
    await service.start()
    try:
        yield DockerRig(service, stores, chat.folder)
    finally:
        await service.stop()
        await typing.close()
        await stores.db.close()
        await asyncio.to_thread(remove_instance_containers, service.paths.instance_id)


async def test_a_hostile_run_cannot_keep_its_container_or_leave_a_process_for_another_chat(
    tmp_path: Path, subagent_image: str
) -> None:
    async with docker_rig(tmp_path, subagent_image, SUBAGENT_WARM_POOL=1) as r:
        await r.until_ready(1)
        (member,) = r.members()
        # A background process that outlives the agent, and a try to hand the container back: exit 0 early.
        status, result = await r.run("$ (nohup sleep 1000 >/dev/null 2>&1 &); echo left-behind > /tmp/mark; echo ok")
        assert status == RunStatus.COMPLETED, result
        assert not await asyncio.to_thread(_exists, member)  # removed with its run, its sleep with it
        await r.until_ready(1)
        (fresh,) = r.members()
        assert fresh != member
        status, result = await r.run("$ cat /tmp/mark 2>&1; ps -eo comm | grep -c sleep || true")
        assert status == RunStatus.COMPLETED
        assert "left-behind" not in result and "No such file" in result


async def test_a_member_killed_from_outside_while_idle_is_replaced(tmp_path: Path, subagent_image: str) -> None:
    async with docker_rig(tmp_path, subagent_image, SUBAGENT_WARM_POOL=1) as r:
        await r.until_ready(1)
        (member,) = r.members()
        client = docker.from_env()
        try:
            await asyncio.to_thread(lambda: client.containers.get(member).kill())
        finally:
            client.close()
        deadline = time.monotonic() + WAIT_SECONDS
        while member in r.members() or r.pool.counts()[0] < 1:
            assert time.monotonic() < deadline, "the killed member was not replaced"
            await asyncio.sleep(0.1)
        status, result = await r.run("$ echo fine")
        assert status == RunStatus.COMPLETED and "fine" in result
        assert r.pool.counts()[2] == 1  # a hit, on the new member


async def test_a_chats_folder_with_files_stays_mounted_and_once_cleared_the_chat_uses_the_pool(
    tmp_path: Path, subagent_image: str
) -> None:
    async with docker_rig(tmp_path, subagent_image, SUBAGENT_WARM_POOL=1) as r:
        folder = r.service.paths.workspace(r.folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "notes.txt").write_text("kept from before the pool\n")
        await r.until_ready(1)
        status, result = await r.run("$ cat notes.txt; echo second > more.txt")  # cold: the folder mounted
        assert status == RunStatus.COMPLETED and "kept from before the pool" in result
        assert r.pool.counts()[2:] == (0, 1)  # a miss: a member cannot mount the chat's folder
        assert sorted(p.name for p in folder.iterdir()) == ["more.txt", "notes.txt"]  # never emptied nor moved
        assert await r.service.workspaces.clear(CHAT_ID) == "Cleared this chat's workspace."
        await r.until_ready(1)
        status, result = await r.run("$ echo pooled > kept.txt; echo ok")  # pooled: its push archives the chat
        assert status == RunStatus.COMPLETED and r.pool.counts()[2] == 1
        await r.until_ready(1)
        status, result = await r.run("$ cat kept.txt")  # pooled again: from the archive
        assert status == RunStatus.COMPLETED and "pooled" in result and r.pool.counts()[2] == 2
        assert list(folder.iterdir()) == []


async def test_two_runs_of_a_chat_at_once_both_keep_their_files(tmp_path: Path, subagent_image: str) -> None:
    """Both pull the chat's (empty) workspace before either pushes: the later push is stale, puts its files on the
    earlier one's in its container and pushes again (review N2: it used to replace them)."""
    async with docker_rig(tmp_path, subagent_image, SUBAGENT_WARM_POOL=2) as r:
        await r.until_ready(2)
        (first, one), (second, two) = await asyncio.gather(
            r.run("$ echo one > one.txt; sleep 20; echo first-done"),  # pushes while the second still sleeps
            r.run("$ echo two > two.txt; sleep 45; echo second-done"),
        )
        assert first == RunStatus.COMPLETED and "first-done" in one and "not saved" not in one, one
        assert second == RunStatus.COMPLETED and "second-done" in two and "not saved" not in two, two
        logs = [path.read_text() for path in (r.service.paths.data_dir / "runs").glob(f"*/{LOG_FILE}")]
        assert any("another run of this chat saved the workspace" in log for log in logs), logs  # they overlapped
        status, listing = await r.run("$ cat one.txt two.txt")
        assert status == RunStatus.COMPLETED and "one" in listing and "two" in listing, listing


async def test_a_crash_between_a_claim_and_its_runs_start_leaks_no_member_and_the_run_starts_again(
    tmp_path: Path, subagent_image: str
) -> None:
    """The state such a crash leaves (the member's id on its still-queued run's record, as the claim writes it at
    once; the process's sockets closed with it): the member's agent gives up by itself, and the next start
    removes the member and runs the run."""
    run_id = "claimed-then-crashed"
    settings = make_settings(tmp_path / "data", SUBAGENT_IMAGE=subagent_image, SUBAGENT_WARM_POOL=1)
    stores = await Stores.open(settings)
    runtime = DockerRuntime(max_concurrency=2)
    pool = WarmPool(settings, runtime, DataPaths(settings.data_dir), image_id=runtime.image_id)
    try:
        await stores.chats.ensure(CHAT_ID, "group", "main")
        runs = RunStore(stores.db)
        await runs.create(
            run_id, chat_id=CHAT_ID, turn_id=None, task="$ echo restarted", label="crash",
            include_context=False, status=RunStatus.QUEUED,
        )  # fmt: skip
        pool.start()
        deadline = time.monotonic() + WAIT_SECONDS
        while pool.counts()[0] < 1:
            assert time.monotonic() < deadline, f"pool not ready: {await pool.stats()}"
            await asyncio.sleep(0.1)
        claimed = await pool.claim(run_id)
        assert claimed is not None
        await runs.set_container(run_id, claimed.container_id)  # as RunContainers.claim records it
        claimed.listening.close()  # the process dies: its sockets close with it
        assert await runtime.wait(claimed.container_id, WAIT_SECONDS) == EXIT_BAD_TASK
    finally:
        await pool.close()  # a real crash leaves its idle members too: recovery drains those as well
        await runtime.close()
        await stores.db.close()
    async with docker_rig(tmp_path, subagent_image, SUBAGENT_WARM_POOL=1) as r:
        assert not await asyncio.to_thread(_exists, claimed.container_id)  # removed by recovery, before any run
        deadline = time.monotonic() + WAIT_SECONDS
        while (record := await r.service.runs.get(run_id)) is None or record.status in ("queued", "running"):
            assert time.monotonic() < deadline, "the run did not start again"
            await asyncio.sleep(0.1)
        assert record.status == RunStatus.COMPLETED and "restarted" in (record.result or ""), record
        assert record.container_id != claimed.container_id
