"""Shared fixtures for tests/bot: no operator settings leak in from the environment; a real SQLite store."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.settings import Settings
from bot.store import ChatStore, Database, MessageStore


def settings_env_names() -> set[str]:
    return {field.alias for field in Settings.model_fields.values() if field.alias}


@pytest.fixture(autouse=True)
def _isolated_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are read case-insensitively: drop every variant of every setting's variable."""
    names = settings_env_names()
    for key in list(os.environ):
        if key.upper() in names:
            monkeypatch.delenv(key)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "crewbot.sqlite3")
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
def messages(db: Database) -> MessageStore:
    return MessageStore(db)


@pytest.fixture
def chats(db: Database) -> ChatStore:
    return ChatStore(db)
