"""Fixtures of the container agent tests (test_agent_*.py): the container's paths under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

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
