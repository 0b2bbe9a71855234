"""What the operator's numbers say about the queue: waits observed, cancels and refusals counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.store.runs import RunStatus
from tests.runner.lifecycle.test_queue import Gates, started
from tests.runner.lifecycle_helpers import Rig, rig

pytestmark = pytest.mark.timeout(60)


def sample(r: Rig, name: str, **labels: str) -> float:
    return r.service.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_run_that_waited_in_the_queue_has_its_queue_wait_observed(tmp_path: Path) -> None:
    gates = Gates()
    async with rig(tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=10) as r:
        first, second = await r.spawn("first"), await r.spawn("second")
        await r.until(lambda: len(started(r)) == 1)
        gates.open(first)
        await r.until(lambda: len(started(r)) == 2)
        gates.open(second)
        await r.settled()
        # Two runs started; the one that waited is the one whose wait the histogram exists for.
        assert sample(r, "crewbot_subagent_queue_wait_seconds_count") == 2


async def test_a_run_cancelled_while_waiting_is_counted_as_cancelled(tmp_path: Path) -> None:
    gates = Gates()
    async with rig(tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=10) as r:
        first, waiting = await r.spawn("first"), await r.spawn("waiting")
        await r.until(lambda: len(started(r)) == 1)
        assert await r.service.manager.cancel_run(-1001, waiting) is RunStatus.CANCELLED
        gates.open(first)
        await r.settled()
        assert await r.status(waiting) == RunStatus.CANCELLED
        assert sample(r, "crewbot_subagent_runs_total", outcome="cancelled") == 1


async def test_a_spawn_refused_because_caps_and_queue_are_full_is_counted(tmp_path: Path) -> None:
    from bot.agent.spawn_guard import CapCheckedSpawner
    from bot.ports.spawner import SpawnRefused
    from tests.runner.lifecycle_helpers import CHAT_ID

    gates = Gates()
    async with rig(tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=1, SUBAGENT_QUEUE_LIMIT=1) as r:
        s, service = r.settings, r.service
        spawner = CapCheckedSpawner(  # as crewbot/serve.py subagent_factory builds it for the main agent and tasks
            service.spawner,
            service.live.count,
            service.picked_up,
            max_total=lambda: s.max_concurrent_subagents,
            max_per_chat=lambda: s.max_subagents_per_chat,
            queued=service.queued_count,
            queue_limit=lambda: s.subagent_queue_limit,
            on_refused=service.metrics.refused,
        )
        running, waiting = await r.spawn("running"), await r.spawn("waiting")
        await r.until(lambda: len(started(r)) == 1)
        with pytest.raises(SpawnRefused):
            await spawner.spawn(CHAT_ID, "turn-x", "one more", None, False)
        refused = sample(r, "crewbot_subagent_refusals_total", cap="global")
        gates.open(running)
        gates.open(waiting)
        await r.settled()
    assert refused == 1  # crewbot_subagent_refusals: "Spawn requests refused by a cap"
