"""Suite-wide guards: no test reaches beyond loopback, and Docker tests fail (not skip) under CI=true."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic_ai import models

# Real model classes refuse to run unless a test opts in (only ever for a fake server on 127.0.0.1).
models.ALLOW_MODEL_REQUESTS = False

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check_address(sock: socket.socket, address: Any) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # Unix sockets: the Docker engine and the LLM proxy
    host = address[0]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConnectionRefusedError(f"tests may only connect to loopback, not {host!r}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _check_address(self, address)
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _check_address(self, address)
    return _real_connect_ex(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign,assignment]
socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign,assignment]


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
