"""Suite-wide guards and fixtures: no test reaches beyond loopback, none leaves anything behind
(tests/leak_guard.py), Docker tests fail (not skip) under CI=true, no operator setting leaks in from the
environment, and a real SQLite store for the tests that need one."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from core.store import ChatStore, Database, MessageStore
from tests.fakes.loopback_guard import install_loopback_guard

install_loopback_guard()

# A test that leaves a container, a process, a listening socket or a temporary file behind fails, naming it.
pytest_plugins = ["tests.leak_guard"]


def docker_engine_available() -> str | None:
    """None when the engine answers, else the reason it does not."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"Docker engine not reachable: {exc}"
    return None


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """Use in every Docker test. Under CI=true a missing engine is a failure, elsewhere a skip."""
    reason = docker_engine_available()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI=true: Docker tests must not skip)")
        pytest.skip(reason)
    yield


@pytest.fixture(scope="session")
def subagent_image(docker_engine: None) -> str:
    """The real subagent image, built once if missing or stale (`make test` builds it beforehand)."""
    from runner.runtimes.image import DEFAULT_IMAGE, build_image

    build_image(DEFAULT_IMAGE, log=lambda line: None)
    return DEFAULT_IMAGE


def settings_env_names() -> set[str]:
    return {field.alias for field in Settings.model_fields.values() if field.alias}


@pytest.fixture(autouse=True)
def _isolated_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are read case-insensitively: drop every variant of every setting's variable."""
    names = settings_env_names()
    for key in list(os.environ):
        if key.upper() in names:
            monkeypatch.delenv(key)
    # No warm pool unless a test asks for one (SUBAGENT_WARM_POOL=n to load_settings): a pool of real containers
    # per bot-level test would swamp the suite. The product's default stays DEFAULT_WARM_POOL.
    monkeypatch.setenv("SUBAGENT_WARM_POOL", "0")


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
