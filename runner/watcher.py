"""Watches the IPC folders and hands each valid file to the caller's handler, one handling at a time.

A file is noticed three ways so none is missed: a sweep when watching starts, inotify through watchfiles,
and a rescan every `rescan_interval_seconds` (inotify is not delivered through some bind mounts and
network filesystems). Whichever sees a file first handles it; an in-process set of in-flight entries keeps
the others away. The handler decides (it knows which ids it has seen); the file is deleted once it accepted
it, quarantined when it reports a duplicate or has failed `max_handler_failures` times.

Only the ipc root, the chat folders and their tasks/ and messages/ are watched, each non-recursively: a
container cannot make the host spend inotify watches on a tree it builds, and errors/ (which only grows)
is never walked by the poller. When that set of directories changes (a new chat, a recreated root) the
watch restarts and sweeps again.
"""

from __future__ import annotations

import asyncio
import math
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from watchfiles import Change, awatch
from watchfiles._rust_notify import WatchfilesRustInternalError

from bot.logging import get_logger
from container.protocol import ProgressMessage, SpawnRequest
from runner.ipc import (
    ERRORS_DIR,
    ROOT_LABEL,
    STALE_ENTRY_SECONDS,
    TEMP_PREFIX,
    Action,
    IpcKind,
    IpcRejected,
    Triage,
    describe_type,
    ensure_ipc_root,
    is_not_directory,
    list_dir,
    lstat_at,
    open_dir,
    parse_message,
    parse_request,
    printable,
    quarantine,
    read_entry,
    remove_if_same,
    triage,
    triage_stray,
    valid_folder_name,
)
from runner.ipc_outcome import RequestOutcome

# watchfiles sleeps `step` ms between looks at its change set and yields once a look finds nothing new
# (or `debounce` ms passed), so a tmp+rename reaches us within 1-2 steps. Its defaults (50/1600) cost up
# to ~100 ms per file and 1.6 s under a stream of writes; 10/50 keeps pickup at ~20 ms. The price is a
# wake-up of the watch thread every 10 ms: about 0.4% of one core while idle (measured, 50 chats).
WATCH_STEP_MS = 10
WATCH_DEBOUNCE_MS = 50
# With nothing happening, watchfiles yields an empty batch this often; we use it to notice a replaced
# ipc root or chat folder whose removal event was lost.
WATCH_IDLE_CHECK_MS = 5_000
# Only used with force_polling: the poller stats a handful of directories, so a short delay is cheap.
POLL_DELAY_MS = 100
WATCH_RETRY_SECONDS = 1.0
# A container that keeps recreating its tasks/ cannot make the watch restart (and sweep) more often.
WATCH_RESTART_MIN_INTERVAL_SECONDS = 0.2
MAX_HANDLER_FAILURES = 5

FolderResolver = Callable[[str], Awaitable[int | None]]
# Handlers get the folder's chat id (never the file's) and the validated model. ACCEPTED: the file is
# deleted; DUPLICATE: it is quarantined; raising: it stays and is retried on a later scan.
RequestHandler = Callable[[int, SpawnRequest], Awaitable[RequestOutcome]]
MessageHandler = Callable[[int, ProgressMessage], Awaitable[RequestOutcome]]
# (folder, kind or "" for an entry outside tasks/ and messages/, name)
EntryKey = tuple[str, str, str]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WatchTarget:
    path: str
    dev: int
    ino: int


@dataclass(frozen=True, slots=True)
class _KindDir:
    """tasks/ or messages/ of one chat folder, opened for the duration of a visit."""

    folder: str
    kind: IpcKind
    chat_id: int | None  # None: the folder is not an allowed chat
    fd: int


class _ResolveFailed(Exception):
    """The resolver raised: leave the folder alone until the next scan."""


def watch_targets(root: Path) -> tuple[WatchTarget, ...]:
    """The directories to watch: the root, each chat folder, and its tasks/ and messages/."""
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
                targets += _kind_dir_targets(root, root_fd, folder)
    except OSError:
        pass  # the root changed while we looked: the caller compares and restarts
    return tuple(targets)


def _kind_dir_targets(root: Path, root_fd: int, folder: str) -> list[WatchTarget]:
    targets = []
    try:
        with open_dir(folder, root_fd) as chat_fd:
            for kind in IpcKind:
                sub = lstat_at(chat_fd, kind)
                if sub is not None and stat.S_ISDIR(sub.st_mode):
                    targets.append(WatchTarget(str(root / folder / kind), sub.st_dev, sub.st_ino))
    except OSError:
        pass  # replaced or unreadable: the folder itself is still watched, and rescans look inside
    return targets


def _single_cause(exc: BaseException) -> BaseException:
    """awatch raises from inside an anyio task group: unwrap a group of one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class _ChangeFilter:
    """Drops changes that need no look: deletions and temp files inside tasks/ and messages/."""

    def __init__(self, root: Path) -> None:
        self._prefix = f"{root}{os.sep}"

    def __call__(self, change: Change, path: str) -> bool:
        if not path.startswith(self._prefix):
            return True
        parts = path[len(self._prefix) :].split(os.sep)
        if parts[0] == ERRORS_DIR:
            return False
        in_kind_dir = len(parts) >= 3
        return not (in_kind_dir and (change == Change.deleted or parts[-1].startswith(TEMP_PREFIX)))


class IpcWatcher:
    """Hands validated files under `ipc_root` to `on_request` / `on_message`; quarantines the rest."""

    def __init__(
        self,
        ipc_root: Path,
        resolve_folder: FolderResolver,
        on_request: RequestHandler,
        on_message: MessageHandler,
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
        self._resolve_folder = resolve_folder
        self._on_request = on_request
        self._on_message = on_message
        self._rescan_interval_seconds = rescan_interval_seconds
        self._force_polling = force_polling
        self._max_file_bytes = max_file_bytes
        self._max_handler_failures = max_handler_failures
        self._stale_after_seconds = stale_after_seconds
        self._clock = clock
        self.ready = asyncio.Event()  # set while watching, after the sweep that follows each (re)start
        self._in_flight: set[EntryKey] = set()
        self._failures: dict[EntryKey, int] = {}
        self._stuck: set[EntryKey] = set()  # could be neither deleted nor moved: skipped while it exists
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
                cause = _single_cause(exc)
                if isinstance(cause, WatchfilesRustInternalError):
                    # Expected: watchfiles gives up on a file name that is not UTF-8 (a container can make
                    # one); the sweep after the restart quarantines it. No traceback needed.
                    log.warning("ipc_watch_failed", error=str(cause), retry_in_seconds=WATCH_RETRY_SECONDS)
                else:
                    log.exception("ipc_watch_failed", retry_in_seconds=WATCH_RETRY_SECONDS)
                await asyncio.sleep(WATCH_RETRY_SECONDS)

    async def _watch_session(self) -> None:
        """Watch the current set of directories until it changes; then return so the loop restarts."""
        root = self._ensure_root()
        targets = watch_targets(root)
        session_stop = asyncio.Event()
        batches = awatch(
            *(target.path for target in targets),
            watch_filter=_ChangeFilter(root),
            debounce=WATCH_DEBOUNCE_MS,
            step=WATCH_STEP_MS,
            stop_event=session_stop,
            rust_timeout=WATCH_IDLE_CHECK_MS,
            yield_on_timeout=True,
            force_polling=self._force_polling,
            poll_delay_ms=self._poll_delay_ms,
            recursive=False,
            # A directory a container made unreadable must not break the host's watch.
            ignore_permission_denied=True,
        )
        pending = asyncio.ensure_future(anext(batches))
        try:
            # awatch sets up its watches synchronously in its first step, before it first awaits; after
            # this one turn of the loop every change from here on is seen, so the sweep below misses none.
            await asyncio.sleep(0)
            if pending.done():
                pending.result()
            await self.sweep()
            self.ready.set()
            log.debug("ipc_watching", directories=len(targets), polling=self._force_polling)
            while True:
                # wait() rather than `await pending`: cancelling us must not cancel the watch thread's
                # task, which only returns once it sees session_stop (below).
                await asyncio.wait({pending})
                changes = pending.result()
                structural = await self._handle_changes(root, changes)
                # Re-listing the directories costs a few syscalls per chat: only when a directory may
                # have come or gone, or on the idle tick (an empty batch).
                if (structural or not changes) and watch_targets(root) != targets:
                    log.info("ipc_watch_restart", reason="watched directories changed")
                    return
                pending = asyncio.ensure_future(anext(batches))
        finally:
            self.ready.clear()
            session_stop.set()  # the watch thread notices within one step
            await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()  # retrieved: a failure was already raised or is moot now
            await batches.aclose()

    def _ensure_root(self) -> Path:
        if not self._ipc_root.is_dir():
            if self._root_created_once:
                log.warning("ipc_root_recreated", path=str(self._ipc_root))
            else:
                log.info("ipc_root_created", path=str(self._ipc_root))
        ensure_ipc_root(self._ipc_root)
        self._root_created_once = True
        return Path(os.path.realpath(self._ipc_root))

    # --- scanning ----------------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Look at everything under the ipc root once (done at start and on every rescan)."""
        try:
            root = self._ensure_root()
            with open_dir(root, follow=True) as root_fd:
                for name in list_dir(root_fd):
                    await self._visit_guarded(root_fd, (name,))
        except Exception:
            log.exception("ipc_sweep_failed")

    async def _handle_changes(self, root: Path, changes: Iterable[tuple[Change, str]]) -> bool:
        """Visit what a batch of changes touched (a folder-level change visits the whole folder).

        Returns whether a change was above tasks/ and messages/, where watched directories come and go.
        """
        wanted: set[tuple[str, ...]] = set()
        structural = False
        for _change, path in changes:
            try:
                parts = Path(path).relative_to(root).parts[:3]
            except ValueError:
                continue
            structural = structural or len(parts) < 3
            if parts:
                wanted.add(parts)
        visits = [p for p in wanted if not any(p[:n] in wanted for n in range(1, len(p)))]
        try:
            with open_dir(root, follow=True) as root_fd:
                for parts in sorted(visits):
                    await self._visit_guarded(root_fd, parts)
        except FileNotFoundError:
            return True  # the root went away
        return structural

    async def _visit_guarded(self, root_fd: int, parts: tuple[str, ...]) -> None:
        """One folder's trouble (say, one the host may not read) must not keep the others from a look."""
        try:
            await self._visit(root_fd, parts)
        except Exception:
            log.exception("ipc_visit_failed", path="/".join(printable(part) for part in parts))

    async def _visit(self, root_fd: int, parts: tuple[str, ...]) -> None:
        """Visit `folder`, `folder/sub` or `folder/kind/name` below the root (whatever is there now)."""
        folder = parts[0]
        if folder == ERRORS_DIR:
            return
        st = lstat_at(root_fd, folder)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            self._dispose_stray(root_fd, folder, st, folder=ROOT_LABEL, where="in the ipc root")
            return
        with ExitStack() as stack:
            try:
                chat_fd = stack.enter_context(open_dir(folder, root_fd))
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) or is_not_directory(exc):
                    return  # replaced since the lstat: the next change or scan sees what it is now
                raise
            try:
                chat_id = await self._resolve(folder)
            except _ResolveFailed:
                return
            subs = parts[1:2] or tuple(list_dir(chat_fd))
            for sub in subs:
                await self._visit_chat_entry(chat_fd, folder, chat_id, sub, parts[2] if len(parts) > 2 else None)

    async def _resolve(self, folder: str) -> int | None:
        if not valid_folder_name(folder):
            return None
        try:
            return await self._resolve_folder(folder)
        except Exception:
            log.exception("ipc_folder_resolve_failed", folder=folder)
            raise _ResolveFailed from None

    async def _visit_chat_entry(
        self, chat_fd: int, folder: str, chat_id: int | None, sub: str, name: str | None
    ) -> None:
        st = lstat_at(chat_fd, sub)
        if st is None:
            return
        if sub not in (IpcKind.TASKS, IpcKind.MESSAGES):
            self._dispose_stray(chat_fd, sub, st, folder=folder, where="in a chat folder")
            return
        kind = IpcKind(sub)
        with ExitStack() as stack:
            try:
                kind_fd = stack.enter_context(open_dir(sub, chat_fd))
            except OSError as exc:
                if is_not_directory(exc):
                    reason = f"{sub} is not a directory ({describe_type(st)})"
                    self._quarantine(chat_fd, sub, folder=folder, key=(folder, "", sub), reason=reason)
                    return
                if isinstance(exc, FileNotFoundError):
                    return
                raise
            kind_dir = _KindDir(folder, kind, chat_id, kind_fd)
            if name is not None:
                await self._process(kind_dir, name)
                return
            names = list_dir(kind_fd)
            self._forget_missing(folder, kind, names)
            for entry in names:
                await self._process(kind_dir, entry)

    def _forget_missing(self, folder: str, kind: IpcKind, present: list[str]) -> None:
        """Drop failure counts and stuck marks of entries that are gone, so neither grows without bound."""
        names = set(present)

        def gone(key: EntryKey) -> bool:
            return key[:2] == (folder, kind) and key[2] not in names

        for key in [k for k in self._failures if gone(k)]:
            del self._failures[key]
        self._stuck -= {k for k in self._stuck if gone(k)}

    # --- one entry ---------------------------------------------------------------------------------------

    async def _process(self, kind_dir: _KindDir, name: str) -> None:
        key: EntryKey = (kind_dir.folder, kind_dir.kind, name)
        if key in self._in_flight or key in self._stuck:
            return
        self._in_flight.add(key)
        try:
            await self._process_entry(kind_dir, key, name)
        except Exception as exc:
            # Not the handler (that is counted in _process_entry): an I/O error reading or moving the
            # file. Counted the same way, so it cannot be retried forever either.
            self._count_failure(kind_dir.fd, key, name, exc, what="processing")
        finally:
            self._in_flight.discard(key)

    async def _process_entry(self, kind_dir: _KindDir, key: EntryKey, name: str) -> None:
        folder, kind, fd = kind_dir.folder, kind_dir.kind, kind_dir.fd
        st = lstat_at(fd, name)
        if st is None:
            self._failures.pop(key, None)
            return
        decision = triage(name, st, now=self._clock(), stale_after_seconds=self._stale_after_seconds)
        if decision.action is not Action.READ:
            self._apply(fd, name, decision, folder=folder, key=key)
            return
        if kind_dir.chat_id is None:
            self._quarantine(fd, name, folder=folder, key=key, reason="unauthorised: folder is not an allowed chat")
            return
        chat_id = kind_dir.chat_id
        item: SpawnRequest | ProgressMessage
        try:
            data, read_st = read_entry(fd, name, self._max_file_bytes)
            if kind is IpcKind.TASKS:
                item = parse_request(data, name=name, chat_id=chat_id)
            else:
                item = parse_message(data, name=name, chat_id=chat_id)
        except IpcRejected as exc:
            self._quarantine(fd, name, folder=folder, key=key, reason=str(exc))
            return
        except FileNotFoundError:
            return
        try:
            if isinstance(item, SpawnRequest):
                result = await self._on_request(chat_id, item)
            else:
                result = await self._on_message(chat_id, item)
            if not isinstance(result, RequestOutcome):
                raise TypeError(f"handler returned {result!r}, not a RequestOutcome")
        except Exception as exc:
            self._count_failure(fd, key, name, exc, what="handler")
            return
        self._failures.pop(key, None)
        if result is RequestOutcome.ACCEPTED:
            log.debug("ipc_file_handled", folder=folder, kind=str(kind), name=printable(name))
            try:
                removed = remove_if_same(fd, name, read_st)
            except OSError:
                # Taken over but undeletable: never hand it over again (the handler has it already).
                self._stuck.add(key)
                log.exception("ipc_file_not_removed", folder=folder, kind=str(kind), name=printable(name))
                return
            if not removed:
                log.warning("ipc_file_replaced_while_handled", folder=folder, kind=str(kind), name=printable(name))
            return
        current = lstat_at(fd, name)
        if current is not None and (current.st_dev, current.st_ino) == (read_st.st_dev, read_st.st_ino):
            what = "request" if kind is IpcKind.TASKS else "message"
            self._quarantine(fd, name, folder=folder, key=key, reason=f"duplicate {what} id")

    def _count_failure(self, fd: int, key: EntryKey, name: str, exc: Exception, *, what: str) -> None:
        attempts = self._failures.get(key, 0) + 1
        if attempts < self._max_handler_failures:
            self._failures[key] = attempts
            log.warning(
                "ipc_file_failed_will_retry",
                folder=key[0],
                kind=key[1],
                name=printable(name),
                stage=what,
                attempt=attempts,
                max_attempts=self._max_handler_failures,
                exc_info=exc,
            )
            return
        self._failures.pop(key, None)
        reason = f"{what} failed {attempts} times; last error: {type(exc).__name__}: {exc}"
        self._quarantine(fd, name, folder=key[0], key=key, reason=reason)

    def _dispose_stray(self, dir_fd: int, name: str, st: os.stat_result, *, folder: str, where: str) -> None:
        key: EntryKey = (folder, "", name)
        if key in self._stuck:
            return
        decision = triage_stray(name, st, now=self._clock(), stale_after_seconds=self._stale_after_seconds, where=where)
        self._apply(dir_fd, name, decision, folder=folder, key=key)

    def _apply(self, dir_fd: int, name: str, decision: Triage, *, folder: str, key: EntryKey) -> None:
        if decision.action is Action.QUARANTINE:
            self._quarantine(dir_fd, name, folder=folder, key=key, reason=decision.reason)
        elif decision.action is Action.REMOVE:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                return
            except OSError:
                self._stuck.add(key)
                log.exception("ipc_stale_temp_not_removed", folder=folder, name=printable(name))
                return
            log.info("ipc_stale_temp_removed", folder=folder, kind=key[1], name=printable(name))

    def _quarantine(self, dir_fd: int, name: str, *, folder: str, key: EntryKey, reason: str) -> None:
        try:
            dest = quarantine(self._ipc_root, dir_fd, name, folder=folder, reason=reason, now=self._clock())
        except FileNotFoundError:
            return
        except OSError:
            # Left where it is and skipped from now on, so it is neither handled again nor retried in a loop.
            self._stuck.add(key)
            log.exception("ipc_quarantine_failed", folder=folder, kind=key[1], name=printable(name), reason=reason)
            return
        log.warning(
            "ipc_file_quarantined",
            folder=folder,
            kind=key[1],
            name=printable(name),
            reason=reason,
            moved_to=dest.name,
        )
