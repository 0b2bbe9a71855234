"""Looks at what is in the IPC folders and disposes of each entry: hands it over, quarantines or removes it.

The handler decides whether a request is new (it knows which ids it has seen); the file is deleted once it
accepted it, quarantined when it reports a duplicate or has failed `max_handler_failures` times. Whatever
finds a file first (the start-up sweep, a watch event, a rescan) handles it; an in-process set of in-flight
entries keeps the others away. errors/ (which only grows) is never walked. When to look, and at what, is
decided by runner/ipc/watcher.py; this module only knows what to do with what it finds.

The event loop only keeps the bookkeeping and calls the resolver and the handler: every file operation
(listing, lstat, reading, quarantining) runs in a worker thread (runner/ipc/batch.py), up to BATCH_ENTRIES
entries per hop, so a folder flooded with junk never stalls the loop. Within a folder, entries are taken in
name order and requests are handed over one at a time, in that order.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TypeVar

from container.protocol import SpawnRequest
from core.logging import get_logger
from runner.ipc.batch import (
    DirContext,
    EntryResult,
    Outcome,
    RequestOutcome,
    dispose_strays,
    in_thread,
    open_in_thread,
    open_subdir,
    open_tasks,
    process_tasks,
    quarantine_entry,
    settle_handled,
    survey,
)
from runner.ipc.requests import ERRORS_DIR, ROOT_LABEL, TASKS_DIR, list_dir, open_dir_fd, printable, valid_folder_name

FolderResolver = Callable[[str], Awaitable[int | None]]
# Gets the folder's chat id (never the file's) and the validated request. ACCEPTED: the file is deleted;
# DUPLICATE: it is quarantined; raising: it stays and is retried on a later scan.
RequestHandler = Callable[[int, SpawnRequest], Awaitable[RequestOutcome]]
# (folder, TASKS_DIR or "" for an entry outside tasks/, name)
EntryKey = tuple[str, str, str]
# Entries per thread hop: large enough that 10,000 files take 50 hops, small enough that one hop is
# a few milliseconds of work and a visit of another folder or a stop is not kept waiting long.
BATCH_ENTRIES = 200

log = get_logger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(slots=True)
class FolderPlan:
    """What to look at in one chat folder: all of it, or some entries (for tasks/: some of its files)."""

    whole: bool = False
    entries: dict[str, list[str] | None] = field(default_factory=dict)  # sorted names inside; None: all of it


def plan_visits(root: Path, paths: Iterable[str]) -> tuple[dict[str, FolderPlan], bool]:
    """Group changed paths (below the resolved `root`) by chat folder; also whether a change was above
    tasks/, where watched directories come and go. A change inside any other directory of a chat folder
    means a look at that directory itself (it does not belong there). Its cost grows with the number of
    changes, so the watcher calls it in its watch thread, not on the loop."""
    prefix = f"{root}{os.sep}"
    whole: set[str] = set()
    entries: dict[str, dict[str, set[str] | None]] = {}
    structural = False
    for path in paths:
        if not path.startswith(prefix):
            structural = structural or path == str(root)
            continue
        parts = path[len(prefix) :].split(os.sep, 3)
        structural = structural or len(parts) < 3
        folder_entries = entries.setdefault(parts[0], {})
        if len(parts) == 1:
            whole.add(parts[0])
        elif len(parts) == 2 or parts[1] != TASKS_DIR:
            folder_entries[parts[1]] = None
        else:
            names = folder_entries.setdefault(parts[1], set())
            if names is not None:
                names.add(parts[2])
    plans = {
        folder: FolderPlan(
            whole=folder in whole,
            entries={} if folder in whole else {k: None if v is None else sorted(v) for k, v in found.items()},
        )
        for folder, found in entries.items()
    }
    return plans, structural


class _ResolveFailed(Exception):
    """The resolver raised: leave the folder alone until the next scan."""


class IpcScanner:
    """Visits the ipc root, or the parts of it that changed, and disposes of every entry it finds there.

    Keeps the per-entry state (in flight, failure counts, stuck entries) across visits: everything that looks
    at one ipc root must share one instance, or two of them could hand the same file over at once.
    """

    def __init__(
        self,
        ipc_root: Path,
        resolve_folder: FolderResolver,
        on_request: RequestHandler,
        *,
        max_file_bytes: int,
        max_handler_failures: int,
        stale_after_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self._ipc_root = ipc_root  # as configured, not resolved: quarantine() finds (or recreates) errors/ there
        self._resolve_folder = resolve_folder
        self._on_request = on_request
        self._max_file_bytes = max_file_bytes
        self._max_handler_failures = max_handler_failures
        self._stale_after_seconds = stale_after_seconds
        self._clock = clock
        self._in_flight: set[EntryKey] = set()
        self._failures: dict[EntryKey, int] = {}
        self._stuck: set[EntryKey] = set()  # could be neither deleted nor moved: skipped while it exists
        # One thread hop at a time: a rescan and a watch visit walking the same flood would only duplicate
        # the work, and every extra thread running Python is one more the loop waits behind for the GIL.
        self._thread_slot = asyncio.Lock()

    async def _in_thread(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        async with self._thread_slot:
            return await in_thread(fn, *args, **kwargs)

    async def _open_in_thread(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        async with self._thread_slot:
            return await open_in_thread(fn, *args, **kwargs)

    # --- scanning ----------------------------------------------------------------------------------------

    async def sweep(self, root: Path) -> None:
        """Look at everything under `root` (the resolved ipc root) once; raises if the root cannot be listed."""
        await self._visit_root(root, None)

    async def visit(self, root: Path, plans: dict[str, FolderPlan]) -> bool:
        """Visit what changed (`plan_visits`, done in the watch thread); False if the root went away."""
        if not plans:
            return True
        try:
            await self._visit_root(root, plans)
        except FileNotFoundError:
            return False
        return True

    async def _visit_root(self, root: Path, plans: dict[str, FolderPlan] | None) -> None:
        root_fd = await self._open_in_thread(open_dir_fd, root, follow=True)
        try:
            entries = await self._in_thread(survey, root_fd, None if plans is None else sorted(plans))
            if plans is None:
                self._forget_missing(ROOT_LABEL, "", [name for name, _ in entries])
            entries = [(name, st) for name, st in entries if name != ERRORS_DIR]
            strays = [name for name, st in entries if not stat.S_ISDIR(st.st_mode)]
            ctx = self._context(ROOT_LABEL, "", root_fd)
            await self._guarded(self._dispose_strays(ctx, strays, where="in the ipc root"), ROOT_LABEL)
            for folder, st in entries:
                if stat.S_ISDIR(st.st_mode):
                    plan = None if plans is None else plans[folder]
                    await self._guarded(self._visit_folder(root_fd, folder, plan), folder)
        finally:
            # Closing a directory descriptor does no I/O (nothing to flush), so it may happen on the loop.
            os.close(root_fd)

    async def _guarded(self, visit: Awaitable[None], where: str) -> None:
        """One folder's trouble (say, one the host may not read) must not keep the others from a look."""
        try:
            await visit
        except Exception:
            log.exception("ipc_visit_failed", path=printable(where))

    async def _visit_folder(self, root_fd: int, folder: str, plan: FolderPlan | None) -> None:
        chat_fd = await self._open_in_thread(open_subdir, root_fd, folder)
        if chat_fd is None:
            return
        try:
            try:
                chat_id = await self._resolve(folder)
            except _ResolveFailed:
                return
            # None: everything in the folder (and in its tasks/).
            wanted = None if plan is None or plan.whole else plan.entries
            entries = await self._in_thread(survey, chat_fd, None if wanted is None else sorted(wanted))
            if wanted is None:
                self._forget_missing(folder, "", [name for name, _ in entries])
            ctx = self._context(folder, "", chat_fd)
            strays = [name for name, _ in entries if name != TASKS_DIR]
            await self._dispose_strays(ctx, strays, where="in a chat folder")
            for name, st in entries:
                if name == TASKS_DIR:
                    await self._visit_tasks(ctx, st, chat_id, None if wanted is None else wanted[TASKS_DIR])
        finally:
            os.close(chat_fd)

    async def _resolve(self, folder: str) -> int | None:
        if not valid_folder_name(folder):
            return None
        try:
            return await self._resolve_folder(folder)
        except Exception:
            log.exception("ipc_folder_resolve_failed", folder=folder)
            raise _ResolveFailed from None

    async def _visit_tasks(
        self, chat: DirContext, st: os.stat_result, chat_id: int | None, names: list[str] | None
    ) -> None:
        key: EntryKey = (chat.folder, "", TASKS_DIR)
        if key in self._stuck:
            return
        opened = await self._open_in_thread(open_tasks, chat, st)
        if isinstance(opened, EntryResult):
            await self._settle(chat, opened, None)
            return
        try:
            ctx = self._context(chat.folder, TASKS_DIR, opened)
            if names is None:
                listed = await self._in_thread(list_dir, opened)
                self._forget_missing(chat.folder, TASKS_DIR, listed)
            else:
                listed = names

            def work(batch: Sequence[str]) -> list[EntryResult]:
                return process_tasks(ctx, batch, chat_id)

            await self._in_batches(ctx, listed, work, chat_id)
        finally:
            os.close(opened)

    async def _dispose_strays(self, ctx: DirContext, names: list[str], *, where: str) -> None:
        def work(batch: Sequence[str]) -> list[EntryResult]:
            return dispose_strays(ctx, batch, where=where)

        await self._in_batches(ctx, names, work, None)

    def _context(self, folder: str, kind: str, dir_fd: int) -> DirContext:
        return DirContext(
            ipc_root=self._ipc_root,
            folder=folder,
            kind=kind,
            dir_fd=dir_fd,
            clock=self._clock,
            stale_after_seconds=self._stale_after_seconds,
            max_file_bytes=self._max_file_bytes,
        )

    def _forget_missing(self, folder: str, kind: str, present: list[str]) -> None:
        """Drop failure counts and stuck marks of entries that are gone, so neither grows without bound."""
        names = set(present)

        def gone(key: EntryKey) -> bool:
            return key[:2] == (folder, kind) and key[2] not in names

        for key in [k for k in self._failures if gone(k)]:
            del self._failures[key]
        self._stuck -= {k for k in self._stuck if gone(k)}

    # --- batches of entries ------------------------------------------------------------------------------

    async def _in_batches(
        self,
        ctx: DirContext,
        names: list[str],
        work: Callable[[Sequence[str]], list[EntryResult]],
        chat_id: int | None,
    ) -> None:
        """Run `work` in a thread on up to BATCH_ENTRIES entries at a time, then settle each result in order.

        An entry is marked in flight from the moment it joins a batch until it is settled, so a concurrent
        visit (a rescan, a watch event) skips it; `work` may do a prefix of its batch, the rest goes back.
        """
        queue = deque(names)
        while queue:
            batch: list[str] = []
            while queue and len(batch) < BATCH_ENTRIES:
                name = queue.popleft()
                key: EntryKey = (ctx.folder, ctx.kind, name)
                if key not in self._in_flight and key not in self._stuck:
                    batch.append(name)
            if not batch:
                return
            keys = [(ctx.folder, ctx.kind, name) for name in batch]
            self._in_flight.update(keys)
            try:
                results = await self._in_thread(work, batch)
                if not results:
                    raise RuntimeError("a batch made no progress")
                for name in reversed(batch[len(results) :]):
                    self._in_flight.discard((ctx.folder, ctx.kind, name))
                    queue.appendleft(name)
                for result in results:
                    await self._settle(ctx, result, chat_id)
                    self._in_flight.discard((ctx.folder, ctx.kind, result.name))
            finally:
                self._in_flight.difference_update(keys)

    async def _settle(self, ctx: DirContext, result: EntryResult, chat_id: int | None) -> None:
        key: EntryKey = (ctx.folder, ctx.kind, result.name)
        if result.outcome in (Outcome.DISPOSED, Outcome.GONE):
            self._failures.pop(key, None)
        elif result.outcome is Outcome.STUCK:
            self._stuck.add(key)
        elif result.outcome is Outcome.FAILED:
            assert result.error is not None
            await self._count_failure(ctx, key, result.error, what="processing")
        elif result.outcome is Outcome.HANDOVER:
            await self._hand_over(ctx, key, result, chat_id)

    async def _hand_over(self, ctx: DirContext, key: EntryKey, found: EntryResult, chat_id: int | None) -> None:
        assert found.request is not None and found.read_st is not None and chat_id is not None
        try:
            outcome = await self._on_request(chat_id, found.request)
            if not isinstance(outcome, RequestOutcome):
                raise TypeError(f"handler returned {outcome!r}, not a RequestOutcome")
        except Exception as exc:
            await self._count_failure(ctx, key, exc, what="handler")
            return
        self._failures.pop(key, None)
        settled = await self._in_thread(settle_handled, ctx, found.name, found.read_st, outcome)
        await self._settle(ctx, settled, chat_id)

    async def _count_failure(self, ctx: DirContext, key: EntryKey, exc: Exception, *, what: str) -> None:
        attempts = self._failures.get(key, 0) + 1
        if attempts < self._max_handler_failures:
            self._failures[key] = attempts
            log.warning(
                "ipc_file_failed_will_retry",
                folder=key[0],
                kind=key[1],
                name=printable(key[2]),
                stage=what,
                attempt=attempts,
                max_attempts=self._max_handler_failures,
                exc_info=exc,
            )
            return
        self._failures.pop(key, None)
        reason = f"{what} failed {attempts} times; last error: {type(exc).__name__}: {exc}"
        result = await self._in_thread(quarantine_entry, ctx, key[2], reason)
        if result.outcome is Outcome.STUCK:
            self._stuck.add(key)
