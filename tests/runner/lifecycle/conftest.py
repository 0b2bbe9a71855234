"""`both_backends`: a scenario module uses it (`pytestmark = pytest.mark.usefixtures("both_backends")`) to run
each of its tests on the Docker runtime's in-memory engine and on the Kubernetes Job runtime over a fake API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runner.lifecycle_helpers import BACKEND


@pytest.fixture(params=["docker", "kubernetes"])
def both_backends(request: pytest.FixtureRequest) -> Iterator[str]:
    token = BACKEND.set(request.param)
    try:
        yield request.param
    finally:
        BACKEND.reset(token)
