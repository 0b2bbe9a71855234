"""Where subagent data lives under DATA_DIR, and handing folders to the container's user."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

CONTAINER_UID = 1000  # the image's non-root `agent` user
CONTAINER_GID = 1000
POOL_PREFIX = ".pool."  # a warm pool member's folders: a dot, which no run id has


@dataclass(frozen=True, slots=True)
class DataPaths:
    data_dir: Path

    @property
    def instance_id(self) -> str:
        """Stable per data dir, so two deployments on one engine never adopt each other's containers."""
        return hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:16]

    @property
    def ipc_root(self) -> Path:
        return self.data_dir / "ipc"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def workspaces_dir(self) -> Path:
        return self.data_dir / "workspaces"

    @property
    def sessions_dir(self) -> Path:
        return self.data_dir / "sessions"

    @property
    def channels_dir(self) -> Path:
        return self.data_dir / "channels"

    @property
    def files_in_dir(self) -> Path:
        """Chat files downloaded for runs, one copy per platform file: host-only, never mounted."""
        return self.data_dir / "files" / "in"

    @property
    def files_seen_dir(self) -> Path:
        """Posted images prepared for the main agent's model, one per platform file (bot/senses/seen_images.py)."""
        return self.data_dir / "files" / "seen"

    @property
    def files_out_dir(self) -> Path:
        return self.data_dir / "files" / "out"

    def run_files_out(self, run_id: str) -> Path:
        """The files a run sent, as the host received them over its channel: host-only, never mounted."""
        return self.files_out_dir / run_id

    def channel_dir(self, run_id: str) -> Path:
        """The run's socket folder: the host's alone, mounted read-only into the container."""
        return self.channels_dir / run_id

    def pool_channel_dir(self, member_id: str) -> Path:
        """A warm pool member's socket folder, beside the runs' so that a claim renames it to `channel_dir(run_id)`
        atomically. Its name has a dot, which no run id has (ID_PATTERN): the two can never collide."""
        return self.channels_dir / f"{POOL_PREFIX}{member_id}"

    @property
    def scratch_dir(self) -> Path:
        """Workspaces of synced runs on Docker (an archived chat's, or a pool member's): each run's /workspace is a
        folder here, mounted read-write, that the host only measures and removes (storage/workspace_placement)."""
        return self.data_dir / "scratch"

    def run_scratch(self, run_id: str) -> Path:
        return self.scratch_dir / run_id

    def pool_scratch(self, member_id: str) -> Path:
        return self.scratch_dir / f"{POOL_PREFIX}{member_id}"

    def run_dir(self, run_id: str) -> Path:
        """The run's host-side record (task, container log): never mounted into a container."""
        return self.runs_dir / run_id

    def workspace(self, folder: str) -> Path:
        return self.workspaces_dir / folder

    def session_file(self, folder: str, session_id: str) -> Path:
        return self.sessions_dir / folder / f"{session_id}.json"


def host_is_root() -> bool:
    """Decides who containers run as, and whether host-made folders must be handed to that user."""
    return os.geteuid() == 0  # the effective uid is what may chown


def container_user() -> str:
    """Containers never run as root: as the image's user when the host is root, else as the host's user."""
    if host_is_root():
        return f"{CONTAINER_UID}:{CONTAINER_GID}"
    return f"{os.geteuid()}:{os.getegid()}"


def hand_to_container(path: Path) -> None:
    """Make a host-created folder writable by the container's user (only needed when the host is root)."""
    path.mkdir(parents=True, exist_ok=True)
    # Its parent is the host's alone, so nothing can swap it for a link; refuse one all the same.
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link, not a folder")
    if host_is_root():
        os.chown(path, CONTAINER_UID, CONTAINER_GID, follow_symlinks=False)
    path.chmod(0o770)
