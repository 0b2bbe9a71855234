"""Subagents cannot spawn subagents, by construction: a container gets its workspace and its run's channel
folder and nothing else (no IPC folder to write a spawn request into), and its channel serves no spawn.
The real-container version of this is tests/runner/test_hostile_subagents.py; this one is fast."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest

from container.channel import RunChannel
from container.protocol import CHANNEL_DIR, WORKSPACE_DIR
from tests.fakes.memory_runtime import MemoryContainer
from tests.runner.lifecycle_helpers import rig, socket_of

pytestmark = pytest.mark.timeout(60)

SPAWN_PATHS = ("/run/spawn", "/run/spawn_subagent", "/run/tasks", "/ipc/tasks", "/v1/spawn")


async def test_a_container_has_no_way_to_write_a_spawn_request(tmp_path: Path) -> None:
    answers: dict[str, int] = {}
    probed = asyncio.Event()

    async def behaviour(channel: RunChannel, container: MemoryContainer) -> int | None:
        await channel.task()
        transport = httpx2.AsyncHTTPTransport(uds=str(socket_of(container)))
        async with httpx2.AsyncClient(transport=transport, base_url="http://run") as client:
            for path in SPAWN_PATHS:
                answers[path] = (await client.post(path, json={"task": "nested"})).status_code
        probed.set()
        await asyncio.Event().wait()
        return None

    async with rig(tmp_path, behaviour) as r:
        run_id = await r.spawn("try to nest")
        await asyncio.wait_for(probed.wait(), 10)
        [spec] = r.runtime.started_specs
        targets = {m.target: m for m in spec.mounts}
        assert set(targets) == {WORKSPACE_DIR, CHANNEL_DIR}
        assert targets[CHANNEL_DIR].read_only
        ipc_root = r.service.paths.ipc_root.resolve()
        for mount in spec.mounts:
            source = mount.source.resolve()
            # Neither the IPC root nor anything inside it or above it is reachable from the container.
            assert not source.is_relative_to(ipc_root) and not ipc_root.is_relative_to(source)
        assert all(status in (403, 404, 405) for status in answers.values()), answers
        await r.service.manager.cancel_run(r.chat.id, run_id)
        await r.settled()
