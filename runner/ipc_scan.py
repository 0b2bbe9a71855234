"""Looks at what is in the IPC folders and disposes of each entry: hands it over, quarantines or removes it.

The handler decides whether a file is new (it knows which ids it has seen); the file is deleted once it
accepted it, quarantined when it reports a duplicate or has failed `max_handler_failures` times. Whatever
finds a file first (the start-up sweep, a watch event, a rescan) handles it; an in-process set of in-flight
entries keeps the others away. errors/ (which only grows) is never walked. When to look, and at what, is
decided by runner/watcher.py; this module only knows what to do with what it finds.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bot.logging import get_logger
from container.protocol import ProgressMessage, SpawnRequest
from runner.ipc import (
    ERRORS_DIR,
    ROOT_LABEL,
    Action,
    IpcKind,
    IpcRejected,
    Triage,
    describe_type,
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

FolderResolver = Callable[[str], Awaitable[int | None]]
# Handlers get the folder's chat id (never the file's) and the validated model. ACCEPTED: the file is
# deleted; DUPLICATE: it is quarantined; raising: it stays and is retried on a later scan.
RequestHandler = Callable[[int, SpawnRequest], Awaitable[RequestOutcome]]
MessageHandler = Callable[[int, ProgressMessage], Awaitable[RequestOutcome]]
# (folder, kind or "" for an entry outside tasks/ and messages/, name)
EntryKey = tuple[str, str, str]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _KindDir:
    """tasks/ or messages/ of one chat folder, opened for the duration of a visit."""

    folder: str
    kind: IpcKind
    chat_id: int | None  # None: the folder is not an allowed chat
    fd: int


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
        on_message: MessageHandler,
        *,
        max_file_bytes: int,
        max_handler_failures: int,
        stale_after_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self._ipc_root = ipc_root  # as configured, not resolved: quarantine() finds (or recreates) errors/ there
        self._resolve_folder = resolve_folder
        self._on_request = on_request
        self._on_message = on_message
        self._max_file_bytes = max_file_bytes
        self._max_handler_failures = max_handler_failures
        self._stale_after_seconds = stale_after_seconds
        self._clock = clock
        self._in_flight: set[EntryKey] = set()
        self._failures: dict[EntryKey, int] = {}
        self._stuck: set[EntryKey] = set()  # could be neither deleted nor moved: skipped while it exists

    # --- scanning ----------------------------------------------------------------------------------------

    async def sweep(self, root: Path) -> None:
        """Look at everything under `root` (the resolved ipc root) once; raises if the root cannot be listed."""
        with open_dir(root, follow=True) as root_fd:
            for name in list_dir(root_fd):
                await self._visit_guarded(root_fd, (name,))

    async def visit_paths(self, root: Path, paths: Iterable[str]) -> bool:
        """Visit what a batch of changed paths touched (a folder-level change visits the whole folder).

        Returns whether a change was above tasks/ and messages/, where watched directories come and go.
        """
        wanted: set[tuple[str, ...]] = set()
        structural = False
        for path in paths:
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
