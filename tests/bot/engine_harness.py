"""The harness of the ChatEngine tests (test_engine.py, test_engine_slots.py): a controlled runner, a recording
lifecycle, typing sends and a clock the test moves."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bot.turns.engine import ChatEngine
from core.typing_indicator import TypingIndicator
from tests.bot.helpers import WAIT_SECONDS, ControlledRunner, Recorder, RecordingLifecycle

MERGE_WINDOW = 3.0
CHAT = -100
OTHER = -200


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TypingSends(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    async def __call__(self, chat_id: int) -> None:
        self.calls.append(chat_id)
        self.changed()


@dataclass
class Harness:
    engine: ChatEngine
    runner: ControlledRunner
    lifecycle: RecordingLifecycle
    typing: TypingIndicator
    sends: TypingSends
    clock: FakeClock

    async def idle(self, chat_id: int) -> None:
        await asyncio.wait_for(self.typing.wait_idle(chat_id), WAIT_SECONDS)
        assert self.engine.idle(chat_id)
