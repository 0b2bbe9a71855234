"""Watches the IPC folders and decides when to look at them; what is found there is handled by runner/ipc_scan.

A file is noticed three ways so none is missed: a sweep when watching starts, inotify through watchfiles,
and a rescan every `rescan_interval_seconds` (inotify is not delivered through some bind mounts and
network filesystems). All three go through one `IpcScanner`, which hands each valid spawn request to the
caller's handler and quarantines the rest (see there for how a file is handed over exactly once).

Only the ipc root, the chat folders and their tasks/ are watched, each non-recursively: whatever lands
there cannot make the host spend inotify watches on a tree it builds, and errors/ (which only grows) is
never walked by the poller. When that set of directories changes (a new chat, a recreated root) the
watch restarts and sweeps again.

The event loop does no file work here either: creating and listing those directories, setting up the
watches, waiting for changes and filtering and grouping them (10,000 files quarantined are 10,000 change
events) all run in worker threads, so the loop only gets a short plan per chat folder to act on. That is
why RustNotify, watchfiles' documented Rust backend, is driven directly instead of through `awatch`,
which converts and filters every change on the loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchfiles import Change
from watchfiles._rust_notify import RustNotify, WatchfilesRustInternalError

from core.logging import get_logger
from runner.ipc.batch import in_thread, wait_for_thread
from runner.ipc.requests import (
    ERRORS_DIR,
    STALE_ENTRY_SECONDS,
    TASKS_DIR,
    TEMP_PREFIX,
    ensure_ipc_root,
    list_dir,
    lstat_at,
    open_dir,
    valid_folder_name,
)
from runner.ipc.scan import FolderPlan, FolderResolver, IpcScanner, RequestHandler, plan_visits

# The handler types live in runner.ipc.scan; they type IpcWatcher's arguments, so callers get them from here.
__all__ = [
    "MAX_HANDLER_FAILURES",
    "POLL_DELAY_MS",
    "FolderResolver",
    "IpcWatcher",
    "RequestHandler",
    "WatchTarget",
    "watch_targets",
]

# RustNotify sleeps `step` ms between looks at its change set and returns once a look finds nothing new
# (or `debounce` ms passed), so a tmp+rename reaches us within 1-2 steps. Its defaults (50/1600) cost up
# to ~100 ms per file and 1.6 s under a stream of writes; 10/50 keeps pickup at ~20 ms. The price is a
# wake-up of the watch thread every 10 ms: about 0.4% of one core while idle (measured, 50 chats).
WATCH_STEP_MS = 10
WATCH_DEBOUNCE_MS = 50
# With nothing happening, RustNotify returns this often; we use it to notice a replaced ipc root or chat
# folder whose removal event was lost.
WATCH_IDLE_CHECK_MS = 5_000
# Only used with force_polling: the poller stats a handful of directories, so a short delay is cheap.
POLL_DELAY_MS = 100
WATCH_RETRY_SECONDS = 1.0
# Whatever keeps recreating a tasks/ cannot make the watch restart (and sweep) more often than this.
WATCH_RESTART_MIN_INTERVAL_SECONDS = 0.2
MAX_HANDLER_FAILURES = 5

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WatchTarget:
    path: str
    dev: int
    ino: int


def watch_targets(root: Path) -> tuple[WatchTarget, ...]:
    """The directories to watch: the root, each chat folder and its tasks/ (blocks: call it in a thread)."""
    try:
        root_st = os.stat(root)
    except FileNotFoundError:
        return ()
    targets = [WatchTarget(str(root), root_st.st_dev, root_st.st_ino)]
    try:
        with open_dir(root, follow=True) as root_fd:
            for folder in list_dir(root_fd):
                # An invalid name could not be passed to watchfiles (it needs UTF-8); rescans cover it.
                st = lstat_at(root_fd, folder)
                if not valid_folder_name(folder) or st is None or not stat.S_ISDIR(st.st_mode):
                    continue
                targets.append(WatchTarget(str(root / folder), st.st_dev, st.st_ino))
                targets += _tasks_dir_target(root, root_fd, folder)
    except OSError:
        pass  # the root changed while we looked: the caller compares and restarts
    return tuple(targets)


def _tasks_dir_target(root: Path, root_fd: int, folder: str) -> list[WatchTarget]:
    try:
        with open_dir(folder, root_fd) as chat_fd:
            sub = lstat_at(chat_fd, TASKS_DIR)
    except OSError:
        return []  # replaced or unreadable: the folder itself is still watched, and rescans look inside
    if sub is None or not stat.S_ISDIR(sub.st_mode):
        return []
    return [WatchTarget(str(root / folder / TASKS_DIR), sub.st_dev, sub.st_ino)]


class _ChangeFilter:
    """Drops changes that need no look: deletions and temp files inside tasks/ (or wherever else two
    levels down: a change there makes the scanner look at the directory it is in, which does not belong)."""

    def __init__(self, root: Path) -> None:
        self._prefix = f"{root}{os.sep}"

    def __call__(self, change: Change, path: str) -> bool:
        if not path.startswith(self._prefix):
            return True
        parts = path[len(self._prefix) :].split(os.sep)
        if parts[0] == ERRORS_DIR:
            return False
        in_sub_dir = len(parts) >= 3
        return not (in_sub_dir and (change == Change.deleted or parts[-1].startswith(TEMP_PREFIX)))


@dataclass(frozen=True, slots=True)
class _Batch:
    plans: dict[str, FolderPlan]
    structural: bool  # a change above tasks/: watched directories may have come or gone
    idle: bool  # nothing changed for WATCH_IDLE_CHECK_MS


def _next_batch(notify: RustNotify, stop: threading.Event, root: Path, keep: _ChangeFilter) -> _Batch | None:
    """Wait for changes, filter them and group them by chat folder (blocks: call it in a thread).

    None once `stop` is set; RustNotify looks at it every step.
    """
    raw = notify.watch(WATCH_DEBOUNCE_MS, WATCH_STEP_MS, WATCH_IDLE_CHECK_MS, stop)
    if raw == "stop":
        return None
    if raw == "timeout":
        return _Batch({}, structural=False, idle=True)
    if raw == "signal":
        raise RuntimeError("the watch thread unexpectedly received a signal")
    plans, structural = plan_visits(root, (path for change, path in raw if keep(Change(change), path)))
    return _Batch(plans, structural=structural, idle=False)


class IpcWatcher:
    """Hands validated spawn requests under `ipc_root` to `on_request`; quarantines everything else."""

    def __init__(
        self,
        ipc_root: Path,
        resolve_folder: FolderResolver,
        on_request: RequestHandler,
        *,
        rescan_interval_seconds: float,
        force_polling: bool,
        max_file_bytes: int,
        max_handler_failures: int = MAX_HANDLER_FAILURES,
        stale_after_seconds: float = STALE_ENTRY_SECONDS,
        poll_delay_ms: int = POLL_DELAY_MS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._poll_delay_ms = poll_delay_ms
        self._ipc_root = ipc_root
        self._rescan_interval_seconds = rescan_interval_seconds
        self._force_polling = force_polling
        # One scanner for the start-up sweep, the watch and the rescans: its in-flight set is what keeps
        # them from handing the same file over twice.
        self._scanner = IpcScanner(
            ipc_root,
            resolve_folder,
            on_request,
            max_file_bytes=max_file_bytes,
            max_handler_failures=max_handler_failures,
            stale_after_seconds=stale_after_seconds,
            clock=clock,
        )
        self.ready = asyncio.Event()  # set while watching, after the sweep that follows each (re)start
        self._stop: asyncio.Event | None = None
        self._finished: asyncio.Event | None = None
        self._root_created_once = False

    @property
    def ipc_root(self) -> Path:
        return self._ipc_root

    # --- lifecycle -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sweep, watch and rescan until `stop()`/`close()` or cancellation."""
        if self._stop is not None:
            raise RuntimeError("IpcWatcher.run() is already running")
        self._stop = asyncio.Event()
        self._finished = asyncio.Event()
        tasks = [
            asyncio.create_task(self._watch_loop(), name="ipc-watch"),
            asyncio.create_task(self._rescan_loop(), name="ipc-rescan"),
            asyncio.create_task(self._stop.wait(), name="ipc-stop"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not tasks[-1]:
                    task.result()  # the loops only end by raising; let the caller see it
                    raise RuntimeError(f"{task.get_name()} ended unexpectedly")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.ready.clear()
            self._stop = None
            self._finished.set()

    def stop(self) -> None:
        """Ask `run()` to return; `close()` also waits for it."""
        if self._stop is not None:
            self._stop.set()

    async def close(self) -> None:
        finished = self._finished
        self.stop()
        if finished is not None:
            await finished.wait()

    async def _rescan_loop(self) -> None:
        while True:
            await asyncio.sleep(self._rescan_interval_seconds)
            await self.sweep()

    async def _watch_loop(self) -> None:
        last_start = -math.inf
        while True:
            delay = last_start + WATCH_RESTART_MIN_INTERVAL_SECONDS - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            last_start = time.monotonic()
            try:
                await self._watch_session()
            except Exception as exc:
                if isinstance(exc, WatchfilesRustInternalError):
                    # Expected: watchfiles gives up on a file name that is not UTF-8 (anything can make
                    # one); the sweep after the restart quarantines it. No traceback needed.
                    log.warning("ipc_watch_failed", error=str(exc), retry_in_seconds=WATCH_RETRY_SECONDS)
                else:
                    log.exception("ipc_watch_failed", retry_in_seconds=WATCH_RETRY_SECONDS)
                await asyncio.sleep(WATCH_RETRY_SECONDS)

    async def _watch_session(self) -> None:
        """Watch the current set of directories until it changes; then return so the loop restarts."""
        root = await asyncio.to_thread(self._ensure_root)
        targets = await asyncio.to_thread(watch_targets, root)
        # The watches are in place once RustNotify is made (in a thread: with polling it lists every watched
        # directory): every change from then on is seen, so the sweep below misses none.
        notify = await in_thread(
            RustNotify,
            [target.path for target in targets],
            False,  # debug
            self._force_polling,
            self._poll_delay_ms,
            False,  # recursive: only the directories listed
            True,  # ignore_permission_denied: an unreadable directory must not break the host's watch
        )
        stop = threading.Event()
        keep = _ChangeFilter(root)
        pending: asyncio.Future[_Batch | None] | None = None
        try:
            await self.sweep()
            self.ready.set()
            log.debug("ipc_watching", directories=len(targets), polling=self._force_polling)
            while True:
                pending = asyncio.ensure_future(asyncio.to_thread(_next_batch, notify, stop, root, keep))
                # wait() rather than `await pending`: cancelling us must not cancel the watch thread's
                # task, which only returns once it sees `stop` (below).
                await asyncio.wait({pending})
                batch = pending.result()
                if batch is None:
                    return
                root_present = await self._scanner.visit(root, batch.plans)
                # Re-listing the directories costs a few syscalls per chat: only when a directory may
                # have come or gone, or on the idle tick.
                changed = batch.structural or batch.idle or not root_present
                if changed and await asyncio.to_thread(watch_targets, root) != targets:
                    log.info("ipc_watch_restart", reason="watched directories changed")
                    return
        finally:
            self.ready.clear()
            stop.set()  # the watch thread notices within one step
            if pending is not None:
                await wait_for_thread(pending)
                if not pending.cancelled():
                    pending.exception()  # retrieved: a failure was already raised or is moot now
            notify.close()  # stops RustNotify's own thread; returns at once

    def _ensure_root(self) -> Path:
        """Create the root if missing and return it resolved (blocks: call it in a thread)."""
        if not self._ipc_root.is_dir():
            if self._root_created_once:
                log.warning("ipc_root_recreated", path=str(self._ipc_root))
            else:
                log.info("ipc_root_created", path=str(self._ipc_root))
        ensure_ipc_root(self._ipc_root)
        self._root_created_once = True
        return Path(os.path.realpath(self._ipc_root))

    async def sweep(self) -> None:
        """Look at everything under the ipc root once (done at start and on every rescan)."""
        try:
            root = await asyncio.to_thread(self._ensure_root)
            await self._scanner.sweep(root)
        except Exception:
            log.exception("ipc_sweep_failed")
