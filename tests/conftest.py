"""Suite-wide guards: no test reaches beyond loopback, and Docker tests fail (not skip) under CI=true."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fakes.loopback_guard import install_loopback_guard

install_loopback_guard()


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
    from runner.image import DEFAULT_IMAGE, build_image

    build_image(DEFAULT_IMAGE, log=lambda line: None)
    return DEFAULT_IMAGE
