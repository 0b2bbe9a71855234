"""The `ContainerRuntime` protocol: what the task manager needs from a container engine, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from runner.runtimes.resource_use import ResourceSample

LABEL_APP = "crewbot"
LABEL_RUN_ID = "crewbot.run_id"
LABEL_CHAT_ID = "crewbot.chat_id"
LABEL_INSTANCE = "crewbot.instance"  # which deployment (data dir) owns it: recovery touches only its own
# A warm pool member (runner/lifecycle/warm_pool.py): its member id, and a short fingerprint of what it was made with
# (image id, limits, runtime class, network, egress mode, user); a run takes only a member whose fingerprint matches.
LABEL_POOL = "crewbot.pool"
LABEL_POOL_CONFIG = "crewbot.pool_config"


CONTAINER_NAME_PREFIX = "crewbot-run-"
POOL_NAME_PREFIX = "crewbot-pool-"


def container_name(run_id: str) -> str:
    """The engine-side name of a run's container (a Job's on Kubernetes): unique per run, recognisable."""
    return f"{CONTAINER_NAME_PREFIX}{run_id}"


def pool_container_name(member_id: str) -> str:
    """A warm pool member's engine-side name: it keeps it after a run claims it (names cannot change on a Job)."""
    return f"{POOL_NAME_PREFIX}{member_id}"


class ContainerGone(LookupError):
    """The container no longer exists (removed outside crewbot); its exit code cannot be known.

    Raised by `wait()`: the engine forgets a removed container's exit code, and inventing one would
    report a failure as a success or the reverse. The caller treats the run as failed.
    """


class RuntimeUnavailable(Exception):
    """The engine cannot be reached (daemon down, socket missing); the message says which and how."""


class ContainerStartError(Exception):
    """The engine answered but refused to start the container (missing image, bad limits, ...)."""


@dataclass(frozen=True, slots=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    image: str
    command: list[str]
    labels: dict[str, str]
    mounts: list[Mount]
    user: str
    network: str = "none"
    memory: str = "512m"
    cpus: float = 1.0
    pids: int = 256
    environment: dict[str, str] = field(default_factory=dict)
    workdir: str = "/workspace"
    entrypoint: list[str] | None = None  # None: the image's own (the subagent's agent loop)
    # A second kernel boundary: Docker's --runtime (e.g. runsc) or Kubernetes' runtimeClassName (e.g. gvisor).
    runtime_class: str | None = None


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    id: str
    name: str
    labels: dict[str, str]
    status: str  # engine's word: created, running, exited, dead, ...
    exit_code: int | None
    started_at: float | None  # unix seconds, None if it never started


class ContainerRuntime(Protocol):
    async def ping(self) -> None:
        """Raise RuntimeUnavailable when the engine does not answer."""

    async def start(self, spec: ContainerSpec) -> str:
        """Create and start a container; return its id."""

    async def wait(self, container_id: str, timeout_seconds: float | None = None) -> int | None:
        """Exit code once it stops; None if `timeout_seconds` passed first (it keeps running)."""

    async def kill(self, container_id: str) -> None:
        """SIGKILL at once; a container that is already gone or stopped is not an error."""

    async def logs(self, container_id: str) -> bytes:
        """stdout and stderr so far; empty if the container is gone."""

    async def remove(self, container_id: str) -> None:
        """Remove it (force); gone is not an error."""

    async def list(self, labels: dict[str, str]) -> list[ContainerInfo]:
        """Containers (running or not) carrying all of these labels."""

    async def usage(self, container_id: str) -> ResourceSample | None:
        """Its peak memory and CPU time so far; None once it has exited or is gone (the engine forgets them)."""

    async def claim(self, container_id: str, channel_dir: Path) -> None:
        """A pooled container is now a run's: its channel folder, which the host has just renamed to `channel_dir`,
        is where its sockets are. Docker: nothing to do (the bind mount follows the renamed folder). Kubernetes:
        the pod's bridge connects to `channel_dir`'s sockets from now on."""

    async def image_exists(self, image: str) -> bool: ...

    async def close(self) -> None: ...
