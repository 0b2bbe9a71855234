"""A push the host refused as stale (container/contract.py, WORKSPACE_STALE_STATUS): another run of the chat saved
the workspace after this run fetched it. This run's changes are put on the newer workspace: what the run added,
modified or deleted since its pull (the workspace compared with the manifest taken at the pull) stays as the run
left it; everything the run left alone is removed, and the newer archive unpacked in its place. Per file the run,
which saves last, wins. Then it pushes again, based on the newer archive's version (container/workspace_sync.py).

All of it runs in the container, on the archive the host serves unopened: the host never merges anything. A
manifest entry is a file's kind, inode, size, modification and change times: writing, renaming or changing the
mode of a file gives it a new change time, which no program sets, so nothing the run touched passes for
untouched, and no file is read to find out.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http.client
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from container.channel import ChannelRefused, RunChannel
from container.channel_files import LocalFileFailed
from container.workspace_stream import StreamBody
from container.workspace_tar import Skips, open_way, unpack

Stamp = tuple[int, int, int, int, int]  # kind, inode, size, modified ns, changed ns
DIR_STAMP: Stamp = (stat.S_IFDIR, 0, 0, 0, 0)  # a folder is the same folder while it is one
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def manifest(root: Path) -> dict[str, Stamp]:
    """Blocking: every entry below `root` by its relative name (`a/b`), links never followed."""
    found: dict[str, Stamp] = {}
    stack: list[tuple[str, str]] = [("", os.fspath(root))]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            with os.scandir(abs_dir) as listing:
                entries = list(listing)
        except OSError:
            continue  # unlisted: its entries count as the run's own (deleted), so never taken from another
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                found[rel] = DIR_STAMP
                stack.append((rel, entry.path))
            else:
                found[rel] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return found


@dataclass(slots=True)
class Changes:
    own: frozenset[str]  # names the run added, modified or deleted since its pull: never taken from another archive
    base: set[str]  # names the archive under the run's changes holds, which the run left alone


def changes_since(root: Path, pulled: dict[str, Stamp]) -> Changes:
    """Blocking: the run's changes to `root` since its pull, whose manifest is `pulled`."""
    now = manifest(root)
    own = {name for name, stamp in now.items() if pulled.get(name) != stamp}
    own.update(name for name in pulled if name not in now)
    return Changes(frozenset(own), set(pulled) - own)


def take_newer(body: StreamBody | None, root: Path, skips: Skips, changes: Changes) -> int:
    """Blocking: the newer archive streamed by `body` (None: the chat has none now) placed in `root` under the run's
    own changes; the entries placed.

    What the run left alone goes first, so that an entry the other run turned into another kind (a folder into a
    file, a file or link into a folder) finds its name free instead of being skipped. `changes.base` gathers each
    name as the archive brings it, even when the download is cut: a retried download (channel.fetch_workspace
    calls this again) first removes what the cut attempt placed, and starts from the run's own changes alone."""
    _remove(root, changes.base)
    seen: set[str] = set()
    try:
        return unpack(body, root, skips, keep=changes.own, seen=seen) if body is not None else 0
    finally:
        changes.base = seen - changes.own


async def rebase(channel: RunChannel, root: Path, changes: Changes) -> tuple[str | None, Skips]:
    """Fetch the chat's workspace as it is now and put it under the run's changes in `root`; its version, and
    its entries that could not be placed (the download's last attempt's: a retried one starts over).

    tarfile.TarError: the newer archive cannot be unpacked. LocalFileFailed: the workspace could not be written.
    ChannelRefused or OSError: it could not be fetched."""
    skips = [Skips()]

    def apply(response: http.client.HTTPResponse) -> int:
        length = response.getheader("Content-Length", "")
        if not (length.isascii() and length.isdigit()):
            raise ChannelRefused("the host's workspace came without its length")
        skips[0] = Skips()
        return take_newer(StreamBody(response, int(length)), root, skips[0], changes)

    version, placed = await channel.fetch_workspace(apply)
    if placed is None:  # the chat has no stored workspace now: only the run's own changes remain
        skips[0] = Skips()
        await asyncio.to_thread(take_newer, None, root, skips[0], changes)
    return version, skips[0]


def _remove(root: Path, names: set[str]) -> None:
    """Remove each of `names` below `root`, the deepest first, through folders opened without following a link; a
    folder only when empty (what is left in it is the run's own)."""
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise LocalFileFailed(exc) from exc
    try:
        for name in sorted(names, reverse=True):
            *folders, last = name.split("/")
            try:
                parent = open_way(root_fd, folders)
            except OSError:
                continue  # its folder is gone, or a link or a file now: nothing of it to remove
            try:
                if stat.S_ISDIR(os.stat(last, dir_fd=parent, follow_symlinks=False).st_mode):
                    with contextlib.suppress(OSError):  # not empty: it holds the run's own files
                        os.rmdir(last, dir_fd=parent)
                else:
                    os.unlink(last, dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise LocalFileFailed(exc) from exc
            finally:
                os.close(parent)
    finally:
        os.close(root_fd)
