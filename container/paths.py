"""Where the agent finds its run channel and workspace: the image's mount points, or env overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from container.contract import CHANNEL_DIR, CHANNEL_SOCKET_FILE, EGRESS_SOCKET_FILE, WORKSPACE_DIR

CHANNEL_SOCKET_ENV = "CREWBOT_CHANNEL_SOCKET"
WORKSPACE_DIR_ENV = "CREWBOT_WORKSPACE_DIR"


@dataclass(frozen=True, slots=True)
class ContainerPaths:
    channel_socket: Path
    workspace_dir: Path

    @property
    def egress_socket(self) -> Path:
        """The door to the web: beside the run socket (it listens only when the run has egress)."""
        return self.channel_socket.parent / EGRESS_SOCKET_FILE

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ContainerPaths:
        """The mount points, unless the environment names others (tests run the agent on the host)."""
        return cls(
            channel_socket=Path(environ.get(CHANNEL_SOCKET_ENV) or f"{CHANNEL_DIR}/{CHANNEL_SOCKET_FILE}"),
            workspace_dir=Path(environ.get(WORKSPACE_DIR_ENV) or WORKSPACE_DIR),
        )
