"""The app's spawner as serve.py wires it: the early cap check and the manager count each run once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from core.store.runs import RunStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.serve import subagent_factory
from tests.bot.helpers import RecordingChannel, make_delivery
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import make_settings

pytestmark = pytest.mark.timeout(30)

CHAT_ID = -3001
WAIT_SECONDS = 10.0


async def test_a_request_the_manager_took_but_not_yet_recorded_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The manager holds a run's slot a moment before it writes the run's row. A spawn checked in that moment
    # once counted the run twice (held, and still waiting for pickup) and refused a chat with a free slot.
    settings = make_settings(
        tmp_path / "data", MAX_CONCURRENT_SUBAGENTS=2, MAX_SUBAGENTS_PER_CHAT=2, ALLOWED_CHAT_IDS=str(CHAT_ID)
    )
    stores = await Stores.open(settings)
    await stores.chats.ensure(CHAT_ID, "group", "main")
    channel = RecordingChannel()
    typing = TypingIndicator(channel.send_typing, settings.typing_interval_seconds)

    async def on_start(container: MemoryContainer) -> int | None:
        await asyncio.Event().wait()
        return None

    runtime = MemoryRuntime(on_start=on_start)
    subagents = subagent_factory(settings, stores, runtime)(make_delivery(stores.db, channel), typing)
    gate = asyncio.Event()
    recording: list[str] = []
    taken = asyncio.Event()
    create = RunStore.create

    async def slow_create(self: RunStore, run_id: str, **fields: Any) -> None:
        recording.append(run_id)
        taken.set()
        await gate.wait()
        await create(self, run_id, **fields)

    monkeypatch.setattr(RunStore, "create", slow_create)
    await subagents.start()
    try:
        first = await subagents.spawner.spawn(CHAT_ID, "turn-1", "first", None, False)
        async with asyncio.timeout(WAIT_SECONDS):
            await taken.wait()  # taken by the manager, its row not written yet
        assert recording == [first]
        second = await subagents.spawner.spawn(CHAT_ID, "turn-2", "second", None, False)
        gate.set()
        runs = RunStore(stores.db)
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                if await runs.exists(first) and await runs.exists(second):
                    break
                await asyncio.sleep(0.01)
        assert first != second
    finally:
        gate.set()
        await subagents.stop()
        await runtime.stop_behaviours()
        await stores.db.close()
