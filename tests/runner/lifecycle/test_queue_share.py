"""One chat's burst cannot fill the shared queue: each chat has at most half of it, so another chat still
gets a place."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.store.runs import RunStatus
from tests.runner.lifecycle.test_queue import Gates
from tests.runner.lifecycle_helpers import OTHER_CHAT_ID, rig

pytestmark = pytest.mark.timeout(60)


async def test_one_chat_cannot_take_the_whole_queue(tmp_path: Path) -> None:
    gates = Gates()
    async with rig(
        tmp_path, gates.behaviour, MAX_CONCURRENT_SUBAGENTS=2, MAX_SUBAGENTS_PER_CHAT=2, SUBAGENT_QUEUE_LIMIT=4
    ) as r:
        mine = [await r.spawn(f"a{i}") for i in range(6)]  # 2 run, 4 wait: the whole queue
        other = await r.spawn("b0", chat_id=OTHER_CHAT_ID)
        status = await r.status(other)
        for run_id in [*mine, other]:
            gates.open(run_id)
        await r.settled()
    assert status == RunStatus.QUEUED, f"another chat's request was {status}: one chat holds the whole queue"
