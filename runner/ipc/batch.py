"""The blocking half of an IPC scan: everything that touches the file system, run in a worker thread.

runner/ipc/scan.py decides what to look at and keeps the per-entry state on the event loop; it calls the
functions here in a worker thread, a batch of entries at a time. A folder of 10,000 junk files then costs
the loop a few dozen thread hops instead of a dozen syscalls per file (docs/architecture.md: "The event loop
stays free"). What is done here is also logged here, so the loop does not format those lines either.

Every function takes the directory as a descriptor opened with O_NOFOLLOW (see runner/ipc/requests.py) and never
raises for one entry's trouble: each entry's fate comes back as an `EntryResult`, in the order given.
Call them through `in_thread` / `open_in_thread`, which keep a descriptor from being closed under them.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import ParamSpec, TypeVar

from container.protocol import SpawnRequest
from core.logging import get_logger
from runner.ipc.requests import (
    TASKS_DIR,
    Action,
    IpcRejected,
    Triage,
    describe_type,
    is_not_directory,
    list_dir,
    lstat_at,
    open_dir_fd,
    parse_request,
    printable,
    quarantine,
    read_entry,
    remove_if_same,
    triage,
    triage_stray,
)

# Bytes read per batch of tasks/ files (at least one file is read, however large): bounds the memory a
# batch of valid requests holds before they are handed over one by one.
MAX_BATCH_READ_BYTES = 1024 * 1024
UNAUTHORISED_FOLDER = "unauthorised: folder is not an allowed chat"
# Quarantines logged one line each per batch; the rest of a flood gets one summary line (every entry still
# has its reason file). Formatting a log line is most of the CPU a quarantine costs, and a worker thread
# holding the GIL is what keeps the event loop waiting.
MAX_LOGGED_PER_BATCH = 10
MAX_REASONS_SUMMARISED = 5

log = get_logger(__name__)


class RequestOutcome(StrEnum):
    """What a spawn-request handler tells the IPC watcher."""

    ACCEPTED = "accepted"  # recorded (queued, rejected or cancelled): delete the file
    DUPLICATE = "duplicate"  # this request id was processed before: quarantine the file with that reason


class Outcome(Enum):
    HANDOVER = "handover"  # a valid request, read: the loop hands it to the handler
    DISPOSED = "disposed"  # quarantined, removed, or (after the handler) deleted
    WAITING = "waiting"  # may still be being written, or was replaced: look again on a later scan
    GONE = "gone"  # vanished before it was looked at
    STUCK = "stuck"  # could be neither moved nor deleted: the loop skips it while it exists
    FAILED = "failed"  # an I/O error: the loop counts it and retries on a later scan


@dataclass(frozen=True, slots=True)
class EntryResult:
    name: str
    outcome: Outcome
    request: SpawnRequest | None = None  # with HANDOVER
    read_st: os.stat_result | None = None  # with HANDOVER: the file that was read
    error: Exception | None = None  # with FAILED


@dataclass(frozen=True, slots=True)
class DirContext:
    """One directory being visited: where its entries go when quarantined, and how they are judged."""

    ipc_root: Path  # as configured: quarantine() finds (or recreates) errors/ there
    folder: str  # the chat folder, or ROOT_LABEL: names the quarantined entry and the log lines
    kind: str  # TASKS_DIR for tasks/, "" for the ipc root or a chat folder (where only strays are)
    dir_fd: int
    clock: Callable[[], float]
    stale_after_seconds: float
    max_file_bytes: int


# --- calling it from the loop --------------------------------------------------------------------------

P = ParamSpec("P")
T = TypeVar("T")


async def in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread`, except that a cancelled caller still waits for the thread to finish.

    A thread cannot be stopped: if the caller went on to close the descriptors the thread works on, their
    numbers could be reused by another open and the thread would move or read files somewhere else.
    """
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await wait_for_thread(future)
        raise


async def open_in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`in_thread` for a call that may return a new descriptor: closed if the caller is cancelled meanwhile."""
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        try:
            await wait_for_thread(future)
        finally:
            # Done by now (wait_for_thread returns or raises only then): nobody else will close what it opened.
            if not future.cancelled() and future.exception() is None and isinstance(fd := future.result(), int):
                os.close(fd)
        raise


async def wait_for_thread(future: asyncio.Future[T]) -> None:
    """Wait until the thread behind `future` is done, even through cancellations (raised afterwards)."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait({future})
        except asyncio.CancelledError:
            cancelled = True  # the thread is short (a batch, a watch step): honoured once it is done
    if cancelled:
        raise asyncio.CancelledError


# --- directories -----------------------------------------------------------------------------------


def survey(dir_fd: int, names: Sequence[str] | None) -> list[tuple[str, os.stat_result]]:
    """The entries `names` (all of them, sorted, when None) that exist, with their lstat."""
    found = []
    for name in list_dir(dir_fd) if names is None else names:
        st = lstat_at(dir_fd, name)
        if st is not None:
            found.append((name, st))
    return found


def open_subdir(dir_fd: int, name: str) -> int | None:
    """A descriptor of the directory `name`; None if it is gone or was replaced by something else."""
    try:
        return open_dir_fd(name, dir_fd)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or is_not_directory(exc):
            return None  # the next change or scan sees what it is now
        raise


def open_tasks(chat: DirContext, st: os.stat_result) -> int | EntryResult:
    """tasks/ of the chat folder `chat`, opened; a `tasks` that is no directory is quarantined instead."""
    try:
        return open_dir_fd(TASKS_DIR, chat.dir_fd)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            return EntryResult(TASKS_DIR, Outcome.GONE)
        if not is_not_directory(exc):
            raise
    return quarantine_entry(chat, TASKS_DIR, f"{TASKS_DIR} is not a directory ({describe_type(st)})")


# --- batches -----------------------------------------------------------------------------------------


class _Quarantines:
    """Quarantines one batch: logs the first few one by one, counts the rest for one summary line."""

    def __init__(self, ctx: DirContext) -> None:
        self.ctx = ctx
        self._logged = 0
        self._unlogged: Counter[str] = Counter()

    def __call__(self, name: str, reason: str) -> EntryResult:
        quiet = self._logged >= MAX_LOGGED_PER_BATCH
        result = quarantine_entry(self.ctx, name, reason, quiet=quiet)
        if result.outcome is Outcome.DISPOSED:
            if quiet:
                self._unlogged[reason] += 1
            else:
                self._logged += 1
        return result

    def summarise(self) -> None:
        if self._unlogged:
            log.warning(
                "ipc_files_quarantined_in_bulk",
                folder=self.ctx.folder,
                kind=self.ctx.kind,
                count=self._unlogged.total(),
                reasons=dict(self._unlogged.most_common(MAX_REASONS_SUMMARISED)),
            )


def dispose_strays(ctx: DirContext, names: Sequence[str], *, where: str) -> list[EntryResult]:
    """Entries where none belongs (the ipc root, beside tasks/): quarantined, unless fresh temp files."""
    results = []
    quarantines = _Quarantines(ctx)
    for name in names:
        try:
            st = lstat_at(ctx.dir_fd, name)
            if st is None:
                results.append(EntryResult(name, Outcome.GONE))
                continue
            now = ctx.clock()
            decision = triage_stray(name, st, now=now, stale_after_seconds=ctx.stale_after_seconds, where=where)
            results.append(_apply(quarantines, name, decision))
        except Exception as exc:
            results.append(EntryResult(name, Outcome.FAILED, error=exc))
    quarantines.summarise()
    return results


def process_tasks(ctx: DirContext, names: Sequence[str], chat_id: int | None) -> list[EntryResult]:
    """Triage, read and validate tasks/ files; quarantine or remove what is not a valid request.

    Returns results for a prefix of `names` (never empty): it stops once MAX_BATCH_READ_BYTES were read.
    """
    results = []
    read_bytes = 0
    quarantines = _Quarantines(ctx)
    for name in names:
        if read_bytes >= MAX_BATCH_READ_BYTES:
            break
        try:
            result, size = _process_task(quarantines, name, chat_id)
        except Exception as exc:
            # An I/O error reading the file (not its content: that is quarantined): counted by the loop
            # like a handler failure, so it cannot be retried forever either.
            result, size = EntryResult(name, Outcome.FAILED, error=exc), 0
        results.append(result)
        read_bytes += size
    quarantines.summarise()
    return results


def _process_task(quarantines: _Quarantines, name: str, chat_id: int | None) -> tuple[EntryResult, int]:
    ctx = quarantines.ctx
    st = lstat_at(ctx.dir_fd, name)
    if st is None:
        return EntryResult(name, Outcome.GONE), 0
    decision = triage(name, st, now=ctx.clock(), stale_after_seconds=ctx.stale_after_seconds)
    if decision.action is not Action.READ:
        return _apply(quarantines, name, decision), 0
    if chat_id is None:
        return quarantines(name, UNAUTHORISED_FOLDER), 0
    try:
        data, read_st = read_entry(ctx.dir_fd, name, ctx.max_file_bytes)
        request = parse_request(data, name=name, chat_id=chat_id)
    except IpcRejected as exc:
        return quarantines(name, str(exc)), 0
    except FileNotFoundError:
        return EntryResult(name, Outcome.GONE), 0
    return EntryResult(name, Outcome.HANDOVER, request=request, read_st=read_st), len(data)


def settle_handled(ctx: DirContext, name: str, read_st: os.stat_result, outcome: RequestOutcome) -> EntryResult:
    """After the handler: delete an accepted file, quarantine a duplicate (if it is still the file read)."""
    fields = {"folder": ctx.folder, "kind": ctx.kind, "name": printable(name)}
    if outcome is RequestOutcome.ACCEPTED:
        log.debug("ipc_file_handled", **fields)
        try:
            removed = remove_if_same(ctx.dir_fd, name, read_st)
        except OSError:
            # Taken over but undeletable: never hand it over again (the handler has it already).
            log.exception("ipc_file_not_removed", **fields)
            return EntryResult(name, Outcome.STUCK)
        if not removed:
            log.warning("ipc_file_replaced_while_handled", **fields)
        return EntryResult(name, Outcome.DISPOSED)
    try:
        current = lstat_at(ctx.dir_fd, name)
    except OSError as exc:
        return EntryResult(name, Outcome.FAILED, error=exc)
    if current is None:
        return EntryResult(name, Outcome.GONE)
    if (current.st_dev, current.st_ino) != (read_st.st_dev, read_st.st_ino):
        return EntryResult(name, Outcome.WAITING)  # replaced meanwhile: the new file gets its own look
    return quarantine_entry(ctx, name, "duplicate request id")


# --- one entry ---------------------------------------------------------------------------------------


def _apply(quarantines: _Quarantines, name: str, decision: Triage) -> EntryResult:
    ctx = quarantines.ctx
    if decision.action is Action.QUARANTINE:
        return quarantines(name, decision.reason)
    if decision.action is Action.REMOVE:
        try:
            os.unlink(name, dir_fd=ctx.dir_fd)
        except FileNotFoundError:
            return EntryResult(name, Outcome.GONE)
        except OSError:
            log.exception("ipc_stale_temp_not_removed", folder=ctx.folder, kind=ctx.kind, name=printable(name))
            return EntryResult(name, Outcome.STUCK)
        log.info("ipc_stale_temp_removed", folder=ctx.folder, kind=ctx.kind, name=printable(name))
        return EntryResult(name, Outcome.DISPOSED)
    return EntryResult(name, Outcome.WAITING)


def quarantine_entry(ctx: DirContext, name: str, reason: str, *, quiet: bool = False) -> EntryResult:
    """Move the entry to errors/ with its reason; STUCK if that is impossible (it is then left alone).

    `quiet`: no log line for a successful move (the caller counts it for a summary).
    """
    try:
        dest = quarantine(ctx.ipc_root, ctx.dir_fd, name, folder=ctx.folder, reason=reason, now=ctx.clock())
    except FileNotFoundError:
        return EntryResult(name, Outcome.GONE)
    except OSError:
        log.exception("ipc_quarantine_failed", folder=ctx.folder, kind=ctx.kind, name=printable(name), reason=reason)
        return EntryResult(name, Outcome.STUCK)
    if quiet:
        return EntryResult(name, Outcome.DISPOSED)
    log.warning(
        "ipc_file_quarantined",
        folder=ctx.folder,
        kind=ctx.kind,
        name=printable(name),
        reason=reason,
        moved_to=dest.name,
    )
    return EntryResult(name, Outcome.DISPOSED)
