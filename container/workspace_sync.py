"""The workspace synced over the run channel, for backends whose containers share no folder with the host
(`WORKSPACE_SYNC_ENV=1`, Kubernetes): the chat's stored workspace is pulled into the empty /workspace before the
task, and pushed back whole before the result (`GET`/`PUT /run/workspace`). The host keeps the archive as bytes
and never opens it; container/workspace_tar.py makes and unpacks it.

A pull that fails ends the run before its task: a run that went on would push a partial workspace over the
stored one. A push the host refuses (over WORKSPACE_QUOTA_MB) or that fails leaves the stored one as it was,
and the result says so.
"""

from __future__ import annotations

import dataclasses
import http.client
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from container.channel import ChannelRefused, RunChannel
from container.channel_files import LocalFileFailed
from container.contract import MAX_ERROR_CHARS, MAX_RESULT_CHARS, WORKSPACE_SYNC_ENV
from container.run import describe_error
from container.task import RunResult
from container.workspace_stream import StreamBody
from container.workspace_tar import Skips, empty, pack, unpack

SYNC_ON = "1"


def sync_enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(WORKSPACE_SYNC_ENV) == SYNC_ON


async def pull_workspace(channel: RunChannel, workspace_dir: Path, log: Callable[[str], None]) -> str | None:
    """Fill `workspace_dir` with the chat's stored workspace. None when done (or the chat has none yet); else
    why it could not be, and the run must stop."""
    skips = [Skips()]

    def unpack_into(response: http.client.HTTPResponse) -> int:
        length = response.getheader("Content-Length", "")
        if not (length.isascii() and length.isdigit()):
            raise tarfile.ReadError("the host's workspace came without its length")
        skips[0] = Skips()
        empty(workspace_dir)  # a download tried again starts over
        return unpack(StreamBody(response, int(length)), workspace_dir, skips[0])

    started = time.monotonic()
    try:
        placed = await channel.fetch_workspace(unpack_into)
    except LocalFileFailed as exc:
        return f"the workspace could not be written: {describe_error(exc.error)}"
    except (ChannelRefused, OSError, tarfile.TarError) as exc:
        return f"the workspace could not be fetched: {describe_error(exc)}"
    if placed is None:
        log("no workspace stored for this chat yet: starting with an empty one")
    else:
        log(f"workspace fetched: {placed} entries in {time.monotonic() - started:.1f} s")
    if skips[0].count:
        log(f"workspace: {skips[0].count} entries not restored: {skips[0].describe()}")
    return None


async def push_workspace(
    channel: RunChannel, workspace_dir: Path, result: RunResult, log: Callable[[str], None]
) -> RunResult:
    """Send `workspace_dir` to the host as the chat's workspace; `result`, with a note when it was not kept."""
    skips = [Skips()]

    def body() -> Iterator[bytes]:
        skips[0] = Skips()
        return pack(workspace_dir, skips[0])

    started = time.monotonic()
    try:
        detail = await channel.send_workspace(body)
    except LocalFileFailed as exc:
        return _noted(result, _not_saved(describe_error(exc.error), log))
    except ChannelRefused as exc:
        return _noted(result, _not_saved(str(exc), log))
    except OSError as exc:
        return _noted(result, _not_saved(describe_error(exc), log))
    log(f"workspace saved: {detail} in {time.monotonic() - started:.1f} s")
    if skips[0].count:
        log(f"workspace: {skips[0].count} entries not saved: {skips[0].describe()}")
    return result


def _not_saved(reason: str, log: Callable[[str], None]) -> str:
    log(f"the workspace was not saved: {reason}")
    return f"The workspace was not saved ({reason}); the chat keeps the one it had before this run."


def _noted(result: RunResult, note: str) -> RunResult:
    """The note at the end of the answer (or the error), which is cut to leave it room."""
    if result.status == "completed":
        block = f"\n\n[{note}]"
        text = result.result[: max(MAX_RESULT_CHARS - len(block), 0)] + block
        return dataclasses.replace(result, result=text[-MAX_RESULT_CHARS:])
    error = f"{result.error or 'failed'}; {note}"
    return dataclasses.replace(result, error=error[:MAX_ERROR_CHARS])
