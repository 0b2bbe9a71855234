"""`both_backends`: a scenario module uses it (`pytestmark = pytest.mark.usefixtures("both_backends")`) to run
each of its tests on the Docker runtime's in-memory engine and on the Kubernetes Job runtime over a fake API.
`quick_engine_retries`: for a scenario that takes the engine away and brings it back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runner.lifecycle_helpers import BACKEND

ENGINE_RETRY_SECONDS_IN_TESTS = 0.05


@pytest.fixture(params=["docker", "kubernetes"])
def both_backends(request: pytest.FixtureRequest) -> Iterator[str]:
    token = BACKEND.set(request.param)
    try:
        yield request.param
    finally:
        BACKEND.reset(token)


@pytest.fixture
def quick_engine_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor asks an engine that is away again every 2 s (runner/lifecycle/supervisor.py); a scenario
    that brings it back would wait out that pause for nothing: here it asks every 50 ms."""
    monkeypatch.setattr("runner.lifecycle.supervisor.ENGINE_RETRY_SECONDS", ENGINE_RETRY_SECONDS_IN_TESTS)
