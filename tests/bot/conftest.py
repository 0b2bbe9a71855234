"""Fixtures of the InboundRouter tests (test_router_*.py): `bot`, a router for the ALLOWED chat with ADMIN
as a configured admin, over the real store and recording edges."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.commands import Commands
from bot.flood import FloodGuard
from bot.router import InboundRouter
from bot.turns.engine import ChatEngine
from core.live_config import LiveConfig
from core.settings import load_settings
from core.store import ChatStore, MessageStore
from core.store.db import Database
from core.store.setting_overrides import SettingOverrideStore
from core.typing_indicator import TypingIndicator
from tests.bot.engine_harness import MERGE_WINDOW, FakeClock, Harness, TypingSends
from tests.bot.helpers import ControlledRunner, FakeRunControl, RecordingChannel, RecordingLifecycle, make_delivery
from tests.bot.router_helpers import ADMIN, ALLOWED, Bot, RecordingWorkspaces


@pytest.fixture
async def bot(db: Database, chats: ChatStore, messages: MessageStore) -> AsyncIterator[Bot]:
    settings = load_settings(_env_file=None, ALLOWED_CHAT_IDS=f"{ALLOWED}", ADMIN_USER_IDS=f"{ADMIN}")
    channel = RecordingChannel(admin=False)
    typing = TypingIndicator(channel.send_typing, interval_seconds=1.0)
    runner = ControlledRunner()
    engine = ChatEngine(
        runner,
        RecordingLifecycle(),
        typing,
        settings.merge_window_seconds,
        max_concurrent_turns=settings.max_concurrent_turns,
    )
    delivery = make_delivery(db, channel, settings.assistant_name)
    runs = FakeRunControl()
    workspaces = RecordingWorkspaces()
    config = LiveConfig(settings, SettingOverrideStore(db))
    commands = Commands(channel, delivery, engine, runs, settings.admin_user_ids, workspaces=workspaces, config=config)
    router = InboundRouter(
        settings,
        chats=chats,
        messages=messages,
        engine=engine,
        commands=commands,
        delivery=delivery,
        flood=FloodGuard(),
    )
    yield Bot(settings, channel, chats, messages, runner, engine, typing, runs, router, workspaces)
    await engine.close()
    await typing.close()


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    """A ChatEngine over a controlled runner (test_engine.py, test_engine_slots.py)."""
    sends = TypingSends()
    typing = TypingIndicator(sends, interval_seconds=0.01)
    runner, lifecycle, clock = ControlledRunner(), RecordingLifecycle(), FakeClock()
    engine = ChatEngine(runner, lifecycle, typing, MERGE_WINDOW, clock=clock)
    yield Harness(engine, runner, lifecycle, typing, sends, clock)
    await engine.close()
    await typing.close()
