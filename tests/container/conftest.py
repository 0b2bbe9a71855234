"""Fixtures of the container agent tests (test_agent_*.py): the container's paths under tmp_path, and model
requests allowed while a test uses `allow_requests_to_the_local_fake` (the scripted host is local)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic_ai.models import override_allow_model_requests

from container.paths import ContainerPaths
from container.protocol import CHANNEL_SOCKET_FILE


@pytest.fixture
def paths(tmp_path: Path) -> ContainerPaths:
    paths = ContainerPaths(
        channel_socket=tmp_path / "channel" / CHANNEL_SOCKET_FILE, workspace_dir=tmp_path / "workspace"
    )
    paths.channel_socket.parent.mkdir()
    paths.workspace_dir.mkdir()
    return paths


@pytest.fixture
def allow_requests_to_the_local_fake() -> Iterator[None]:
    with override_allow_model_requests(True):
        yield
