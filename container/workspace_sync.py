"""The workspace synced over the run channel, for backends whose containers share no folder with the host
(`WORKSPACE_SYNC_ENV=1`, Kubernetes): the chat's stored workspace is pulled into the empty /workspace before the
task, and pushed back whole before the result (`GET`/`PUT /run/workspace`). The host keeps the archive as bytes
and never opens it; container/workspace_tar.py makes and unpacks it.

A pull that fails ends the run before its task: a run that went on would push a partial workspace over the
stored one. But an archive that cannot be unpacked (not a tar stream, or past unpack's bounds) would fail every
later run of the chat the same way: the run tells the host (`POST /run/workspace`, naming the archive by the id
its GET's answer gave), which sets that archive aside for an admin, and goes on in an empty workspace with a
note at the head of its task; its push then stores the chat's new workspace. A host that does not set it aside
(another run's push replaced it meanwhile, or the channel is down) ends the run as any failed pull does.

A push names the version it stands on (the pull's); one the host refuses as stale, because another run of the
chat saved the workspace meanwhile, takes that newer workspace under this run's own changes and is sent again
(container/workspace_rebase.py), MAX_REBASES times at most. A push the host refuses otherwise (over WORKSPACE_QUOTA_MB),
or that fails, leaves the stored one as it was, and the result says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import http.client
import random
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from container.channel import ChannelRefused, RunChannel
from container.channel_files import LocalFileFailed
from container.contract import (
    EMPTY_VERSION,
    MAX_ERROR_CHARS,
    MAX_RESULT_CHARS,
    MAX_UNREADABLE_REASON_CHARS,
    MAX_WORKSPACE_REBASES,
    WORKSPACE_SERVED_HEADER,
    WORKSPACE_STALE_STATUS,
    WORKSPACE_SYNC_ENV,
)
from container.run import describe_error
from container.task import RunResult, Task
from container.workspace_pack import plan
from container.workspace_rebase import Changes, Stamp, changes_since, manifest, rebase
from container.workspace_stream import StreamBody
from container.workspace_tar import Skips, empty, unpack

SYNC_ON = "1"
MAX_REBASES = MAX_WORKSPACE_REBASES  # a push found stale this many times more is given up, and the result says so
# Before each rebase a random wait below this, doubled per rebase up to the cap: runs that finish together and
# keep refusing each other fall out of step instead of racing in lockstep.
REBASE_BACKOFF_SECONDS = 0.05
REBASE_BACKOFF_MAX_SECONDS = 2.0
STALE_NOTE = (
    "The workspace was not saved: other runs of this chat saved theirs {tries} times while this run was putting its "
    "changes on theirs, so this run's changes are not in the chat's workspace (it keeps the other runs')."
)
NOT_TAKEN_NOTE = (
    "Note: {count} entries of the chat's workspace as another run of this chat saved it meanwhile could not be put "
    "beside this run's changes, and are not in the saved workspace: {names}"
)
UNREADABLE_NOTE = (
    "Note: the chat's stored workspace could not be unpacked ({reason}); this run starts with an empty "
    "workspace. The unreadable archive was kept aside for an admin."
)


class PullState(enum.Enum):
    RESTORED = "restored"  # the stored workspace is in place (or the chat had none yet: it is empty)
    SET_ASIDE = "set aside"  # it could not be unpacked: the host set it aside, the workspace is empty
    FAILED = "failed"  # the run must stop before its task


@dataclasses.dataclass(frozen=True, slots=True)
class Pulled:
    """How a pull ended; `text` is why it failed, or the note for the task of a run whose archive was set aside.
    `base`: the version of the archive the workspace holds (None: the host named none); `pulled`: the workspace's
    manifest as it was pulled, which a stale push's rebase compares it with (container/workspace_rebase.py)."""

    state: PullState
    text: str = ""
    base: str | None = dataclasses.field(default=None, compare=False)
    pulled: dict[str, Stamp] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def noted(self, task: Task) -> Task:
        """`task`, with the note at its head when the run starts without the chat's stored workspace."""
        if self.state is not PullState.SET_ASIDE:
            return task
        return dataclasses.replace(task, task=f"{self.text}\n\n{task.task}")


def sync_enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(WORKSPACE_SYNC_ENV) == SYNC_ON


async def pull_workspace(channel: RunChannel, workspace_dir: Path, log: Callable[[str], None]) -> Pulled:
    """Fill `workspace_dir` with the chat's stored workspace (or leave it empty when the chat has none yet, or
    when the stored one cannot be unpacked and the host set it aside)."""
    skips = [Skips()]
    served = [""]

    def unpack_into(response: http.client.HTTPResponse) -> int:
        served[0] = response.getheader(WORKSPACE_SERVED_HEADER, "")
        length = response.getheader("Content-Length", "")
        if not (length.isascii() and length.isdigit()):
            raise ChannelRefused("the host's workspace came without its length")
        skips[0] = Skips()
        empty(workspace_dir)  # a download tried again starts over
        return unpack(StreamBody(response, int(length)), workspace_dir, skips[0])

    started = time.monotonic()
    try:
        version, placed = await channel.fetch_workspace(unpack_into)
    except LocalFileFailed as exc:
        return _failed(f"the workspace could not be written: {describe_error(exc.error)}")
    except tarfile.TarError as exc:
        return await _set_aside(channel, workspace_dir, served[0], describe_error(exc), log)
    except (ChannelRefused, OSError) as exc:
        return _failed(f"the workspace could not be fetched: {describe_error(exc)}")
    if placed is None:
        log("no workspace stored for this chat yet: starting with an empty one")
    else:
        log(f"workspace fetched: {placed} entries in {time.monotonic() - started:.1f} s")
    if skips[0].count:
        log(f"workspace: {skips[0].count} entries not restored: {skips[0].describe()}")
    return Pulled(PullState.RESTORED, base=version, pulled=await asyncio.to_thread(manifest, workspace_dir))


async def _set_aside(
    channel: RunChannel, workspace_dir: Path, served: str, error: str, log: Callable[[str], None]
) -> Pulled:
    """The stored archive could not be unpacked: have the host set it aside, and start from an empty workspace."""
    reason = _plain(error)
    log(f"the chat's stored workspace could not be unpacked: {reason}")
    not_set_aside = f"the workspace could not be unpacked ({reason}) and was not set aside"
    if not served:
        return _failed(f"{not_set_aside}: the host's answer named no archive")
    try:
        empty(workspace_dir)  # whatever the failed unpack placed: the run starts from nothing
        detail = await channel.set_aside_workspace(served, reason)
    except LocalFileFailed as exc:
        return _failed(f"the workspace could not be emptied: {describe_error(exc.error)}")
    except (ChannelRefused, OSError) as exc:
        return _failed(f"{not_set_aside}: {describe_error(exc)}")
    log(f"the unreadable workspace archive: {detail}; starting with an empty workspace")
    # The run stands on no archive now: its whole workspace is its own.
    return Pulled(PullState.SET_ASIDE, UNREADABLE_NOTE.format(reason=reason), base=EMPTY_VERSION)


def _plain(text: str) -> str:
    """`text` as the report and the note carry it: printable ASCII (a name in it is the archive's, any bytes), so
    that it fits the host's bound however it is escaped, and cut to MAX_UNREADABLE_REASON_CHARS."""
    ascii_text = text.encode("ascii", "backslashreplace").decode("ascii")
    return "".join(char if char.isprintable() else "?" for char in ascii_text)[:MAX_UNREADABLE_REASON_CHARS]


def _failed(reason: str) -> Pulled:
    return Pulled(PullState.FAILED, reason)


async def push_workspace(
    channel: RunChannel,
    workspace_dir: Path,
    result: RunResult,
    log: Callable[[str], None],
    pulled: Pulled | None = None,
) -> RunResult:
    """Send `workspace_dir` to the host as the chat's workspace; `result`, with a note when it was not kept.
    `pulled`: the pull it stands on. A push the host finds stale (another run of the chat saved since) takes the
    newer workspace under this run's changes and is sent again, up to MAX_REBASES times (None: no base is named,
    and the push replaces whatever is stored)."""
    base = pulled.base if pulled is not None else None
    changes: Changes | None = None
    skips = [Skips()]
    not_taken = Skips()  # what the last rebase could not place: the newer archive's entries this push leaves out
    started = time.monotonic()
    for attempt in range(MAX_REBASES + 1):
        try:
            detail = await _send(channel, workspace_dir, base, skips)
            break
        except ChannelRefused as exc:
            if exc.status != WORKSPACE_STALE_STATUS or pulled is None:
                return _noted(result, _not_saved(str(exc), log))
        except LocalFileFailed as exc:
            return _noted(result, _not_saved(describe_error(exc.error), log))
        except OSError as exc:
            return _noted(result, _not_saved(describe_error(exc), log))
        if attempt == MAX_REBASES:
            log(f"the workspace was not saved: other runs of this chat saved theirs {attempt + 1} times meanwhile")
            return _noted(result, STALE_NOTE.format(tries=attempt + 1))
        log("another run of this chat saved the workspace since this run fetched it: putting this run's changes on it")
        await asyncio.sleep(random.uniform(0, min(REBASE_BACKOFF_SECONDS * 2**attempt, REBASE_BACKOFF_MAX_SECONDS)))
        try:
            if changes is None:
                changes = await asyncio.to_thread(changes_since, workspace_dir, pulled.pulled)
            base, not_taken = await rebase(channel, workspace_dir, changes)
        except tarfile.TarError as exc:
            return _noted(result, _not_saved(f"the newer workspace could not be unpacked: {describe_error(exc)}", log))
        except LocalFileFailed as exc:
            return _noted(result, _not_saved(describe_error(exc.error), log))
        except (ChannelRefused, OSError) as exc:
            return _noted(result, _not_saved(f"the newer workspace could not be fetched: {describe_error(exc)}", log))
    log(f"workspace saved: {detail} in {time.monotonic() - started:.1f} s")
    if skips[0].count:
        log(f"workspace: {skips[0].count} entries not saved: {skips[0].describe()}")
    if not_taken.count:
        log(f"workspace: {not_taken.count} entries of the newer workspace not taken: {not_taken.describe()}")
        return _noted(result, NOT_TAKEN_NOTE.format(count=not_taken.count, names=_plain(not_taken.describe())))
    return result


async def _send(channel: RunChannel, workspace_dir: Path, base: str | None, skips: list[Skips]) -> str:
    # Planned once, so that its length is known (the channel takes no chunked body); sent from the plan per
    # attempt. The walk is blocking work: in a thread.
    packing = await asyncio.to_thread(plan, workspace_dir, skips[0])

    def body() -> Iterator[bytes]:
        skips[0] = Skips()
        return packing.stream(skips[0])

    return await channel.send_workspace(body, packing.length, base)


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
