"""A warm pool member's host folders: its channel folder (the host's, mounted read-only) with the run socket
bound and listening in it before the container starts, and its scratch workspace (the container's user's); the
socket's readiness, and the folders' moves and removals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from container.contract import CHANNEL_SOCKET_FILE
from runner.storage.paths import CONTAINER_GID, POOL_PREFIX, DataPaths, hand_to_container, host_is_root

SOCKET_MODE = 0o666  # as a run's socket: the channel folder's mode guards who reaches it
CHANNEL_DIR_MODE = 0o750  # as a run's channel folder (runner/storage/run_files.py)
LISTEN_BACKLOG = 16


def make_member_folders(channel_dir: Path, scratch: Path) -> socket.socket:
    """Its channel folder (the host's, mounted read-only) with the run socket listening in it, and its scratch
    workspace (the container's user's); blocking."""
    channel_dir.mkdir(parents=True, mode=CHANNEL_DIR_MODE)
    if host_is_root():
        os.chown(channel_dir, 0, CONTAINER_GID, follow_symlinks=False)
    channel_dir.chmod(CHANNEL_DIR_MODE)
    scratch.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    scratch.mkdir()
    hand_to_container(scratch)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        path = channel_dir / CHANNEL_SOCKET_FILE
        listening.bind(str(path))
        os.chmod(path, SOCKET_MODE)
        listening.listen(LISTEN_BACKLOG)
        listening.setblocking(False)
    except BaseException:
        listening.close()
        raise
    return listening


def remove_folders(*folders: Path) -> None:
    """shutil.rmtree opens each folder by descriptor and never follows a link (the scratch is the container's)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def move_member_folders(member_channel: Path, member_scratch: Path, paths: DataPaths, run_id: str) -> None:
    """The member's folders renamed to the run's (one parent each: atomic; the bind mounts follow). Whatever sits
    at the run's names (an earlier attempt's, left by a crash; the host's folders, or a fresh empty scratch) is
    removed first, never followed, so a re-queued run's claim cannot fail on it. Blocking."""
    channel_dir, scratch = paths.channel_dir(run_id), paths.run_scratch(run_id)
    remove_folders(channel_dir, scratch)
    os.rename(member_channel, channel_dir)
    try:
        os.rename(member_scratch, scratch)
    except OSError:
        os.rename(channel_dir, member_channel)
        raise


def sweep_leftovers(paths: DataPaths, is_live: Callable[[str], bool]) -> int:
    """At a start, after recovery (with the pool on or off): the folders of members an earlier process made
    (their containers recovery removed) and the scratch workspaces of runs no longer live; their count.
    Blocking; removed by descriptor, never following a link. `is_live` is asked per folder, as late as can be: a
    run that started meanwhile is live before its scratch folder is made."""
    removed = 0
    for parent in (paths.channels_dir, paths.scratch_dir):
        with contextlib.suppress(FileNotFoundError), os.scandir(parent) as entries:
            for entry in entries:
                member = entry.name.startswith(POOL_PREFIX)
                stale_scratch = parent == paths.scratch_dir and not is_live(entry.name)
                if (member or stale_scratch) and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
    return removed


async def until_connected(listening: socket.socket, exited: asyncio.Task[None], timeout_seconds: float) -> str | None:
    """Until the member's agent connects (its waiting connection makes the socket readable): None; else why not
    (its container exited first, or the time ran out)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    fd = listening.fileno()
    loop.add_reader(fd, _resolve, readable)
    try:
        done, _ = await asyncio.wait({readable, exited}, timeout=timeout_seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(fd)
        readable.cancel()
    if readable in done:
        return None
    return "its container exited" if exited in done else f"not ready in {timeout_seconds:g} s"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
