"""IPC folders on the host: their layout, the host's own writes, and reading, validating and quarantining
what is found in them.

Layout under `DATA_DIR/ipc/`: `<folder>/tasks/*.json` (SpawnRequest, written by the host's spawner for the
main agent) and `errors/` (quarantine). No container mounts these folders any more (subagents talk over
their run channel), yet whatever is found there is still treated as hostile: a folder left over from an
older deployment, an operator's mistake or a future bug must not turn into a read or write elsewhere. So
every operation below a chat folder goes through directory descriptors opened with O_NOFOLLOW, files are
read only when fstat says regular and up to a cap, and anything unexpected is quarantined with a reason.
The chat a file speaks for is the folder's, never the file's. All of it blocks: the watcher calls it from
worker threads (runner/ipc/batch.py), never on the event loop.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pydantic import ValidationError

from container.protocol import IPC_TASKS_DIR, SpawnRequest, write_json_atomic
from container.text import one_line

TASKS_DIR = IPC_TASKS_DIR  # the only entry a chat folder should hold
ERRORS_DIR = "errors"
TEMP_PREFIX = ".tmp-"  # what write_json_atomic names its temp files
JSON_SUFFIX = ".json"
REASON_SUFFIX = ".reason.txt"
# Stands in for the folder in the quarantine name of an entry found directly in the ipc root.
ROOT_LABEL = "_root"
FOLDER_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A temp or non-.json file younger than this may still be being written; older, its writer is gone.
STALE_ENTRY_SECONDS = 300.0
IPC_ROOT_MODE = 0o750
ERRORS_DIR_MODE = 0o750
# The host's alone: nothing else needs to read or write here since no container mounts these folders.
CHAT_DIR_MODE = 0o750
TASKS_DIR_MODE = 0o750
REASON_FILE_MODE = 0o640
MAX_REASON_CHARS = 500
MAX_QUARANTINE_PART_CHARS = 100  # keeps `<stamp>-<folder>-<name>.reason.txt` under NAME_MAX (255)
MAX_VALIDATION_ERRORS_SHOWN = 3

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the lstat check must not hang the watcher in open().
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_READ_CHUNK_BYTES = 64 * 1024


class IpcRejected(Exception):
    """The entry goes to errors/; the message is the one-line reason."""


class Action(Enum):
    READ = "read"  # a .json file: read and validate it
    WAIT = "wait"  # may still be being written: look again on a later scan
    REMOVE = "remove"  # a temp file whose writer crashed
    QUARANTINE = "quarantine"


@dataclass(frozen=True, slots=True)
class Triage:
    action: Action
    reason: str = ""


# --- paths -------------------------------------------------------------------------------------------


def errors_dir(ipc_root: Path) -> Path:
    return ipc_root / ERRORS_DIR


def valid_folder_name(folder: str) -> bool:
    """A chat folder name the host would create (see `folder_for_chat`); `errors` is not one."""
    return folder != ERRORS_DIR and FOLDER_PATTERN.fullmatch(folder) is not None


def _check_folder(folder: str) -> None:
    if not valid_folder_name(folder):
        raise ValueError(f"invalid IPC folder name {folder!r}")


def open_dir_fd(name: str | Path, dir_fd: int | None = None, *, follow: bool = False) -> int:
    """A directory descriptor; without `follow` a symlink raises (ELOOP) instead of being followed."""
    flags = _DIR_FLAGS & ~os.O_NOFOLLOW if follow else _DIR_FLAGS
    return os.open(name, flags, dir_fd=dir_fd)


@contextmanager
def open_dir(name: str | Path, dir_fd: int | None = None, *, follow: bool = False) -> Iterator[int]:
    """`open_dir_fd`, closed on leaving the block."""
    fd = open_dir_fd(name, dir_fd, follow=follow)
    try:
        yield fd
    finally:
        os.close(fd)


def is_not_directory(exc: OSError) -> bool:
    """What open_dir raises for a symlink (ELOOP) or a non-directory (ENOTDIR)."""
    return exc.errno in (errno.ELOOP, errno.ENOTDIR)


def list_dir(dir_fd: int) -> list[str]:
    """Names in a directory, sorted; undecodable bytes come back as surrogates (os.fsdecode)."""
    return sorted(os.listdir(dir_fd))


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def printable(name: str) -> str:
    """A name safe for logs and reason files (undecodable bytes and controls escaped)."""
    escaped = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in escaped)


# --- the host's side ---------------------------------------------------------------------------------


def ensure_ipc_root(ipc_root: Path) -> Path:
    """Create the ipc root and errors/ if missing (also after an operator deleted them)."""
    if not ipc_root.is_dir():
        ipc_root.mkdir(parents=True, exist_ok=True)
        ipc_root.chmod(IPC_ROOT_MODE)
    errors = errors_dir(ipc_root)
    if not errors.is_dir():
        errors.mkdir(exist_ok=True)
        errors.chmod(ERRORS_DIR_MODE)
    return ipc_root


def ensure_chat_dirs(ipc_root: Path, folder: str) -> Path:
    """Create or repair `<folder>/tasks`, owned by the host and private to it; return the chat folder.

    A `tasks` entry that is not a real directory is quarantined and replaced. Anything else in the
    chat folder (say, a `messages/` of an older deployment) is left to the watcher, which quarantines it.
    """
    _check_folder(folder)
    ensure_ipc_root(ipc_root)
    with open_dir(ipc_root, follow=True) as root_fd:
        _mkdir_at(folder, root_fd, CHAT_DIR_MODE)
        with open_dir(folder, root_fd) as chat_fd:
            _own(chat_fd, CHAT_DIR_MODE)
            _mkdir_at(TASKS_DIR, chat_fd, TASKS_DIR_MODE)
            try:
                tasks_fd = open_dir_fd(TASKS_DIR, chat_fd)
            except OSError as exc:
                if not is_not_directory(exc):
                    raise
                quarantine(ipc_root, chat_fd, TASKS_DIR, folder=folder, reason=f"{TASKS_DIR} is not a directory")
                _mkdir_at(TASKS_DIR, chat_fd, TASKS_DIR_MODE)
                tasks_fd = open_dir_fd(TASKS_DIR, chat_fd)
            try:
                _own(tasks_fd, TASKS_DIR_MODE)
            finally:
                os.close(tasks_fd)
    return ipc_root / folder


def _mkdir_at(name: str, dir_fd: int, mode: int) -> None:
    with suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=dir_fd)


def _own(dir_fd: int, mode: int) -> None:
    """Set the mode, and take back a directory an older deployment handed to the container's user.

    fchown/fchmod act on the directory opened, never on whatever a symlink points to.
    """
    uid = os.geteuid()
    if os.fstat(dir_fd).st_uid != uid:
        os.fchown(dir_fd, uid, os.getegid())
    os.fchmod(dir_fd, mode)


def write_spawn_request(ipc_root: Path, folder: str, request: SpawnRequest) -> Path:
    """Drop a spawn request into the chat's tasks/ atomically (the main agent's spawn tool).

    Writes through descriptors: the folders must exist (`ensure_chat_dirs`) and must not be symlinks.
    `/proc/self/fd/N` names the directory opened as N itself, so write_json_atomic's temp file and rename
    land in that directory even if `tasks/` is renamed or replaced meanwhile.
    """
    _check_folder(folder)
    name = f"{request.request_id}{JSON_SUFFIX}"
    with (
        open_dir(ipc_root, follow=True) as root_fd,
        open_dir(folder, root_fd) as chat_fd,
        open_dir(TASKS_DIR, chat_fd) as tasks_fd,
    ):
        write_json_atomic(Path(f"/proc/self/fd/{tasks_fd}") / name, request)
    return ipc_root / folder / TASKS_DIR / name


# --- reading and validating ----------------------------------------------------------------------------


def describe_type(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "regular file" if stat.S_ISREG(mode) else "unknown type"


def _is_stale(st: os.stat_result, now: float, stale_after_seconds: float) -> bool:
    # ctime, not mtime: any writer can set mtime to the future with utime(), but not ctime.
    return now - st.st_ctime >= stale_after_seconds


def triage(name: str, st: os.stat_result, *, now: float, stale_after_seconds: float) -> Triage:
    """Decide what to do with an entry in tasks/ before reading it."""
    if not stat.S_ISREG(st.st_mode):
        # No writer makes these on the way to a real file, so there is nothing to wait for.
        return Triage(Action.QUARANTINE, f"not a regular file ({describe_type(st)})")
    stale = _is_stale(st, now, stale_after_seconds)
    if name.startswith(TEMP_PREFIX):
        return Triage(Action.REMOVE) if stale else Triage(Action.WAIT)
    if not name.endswith(JSON_SUFFIX):
        return Triage(Action.QUARANTINE, "not a .json file") if stale else Triage(Action.WAIT)
    return Triage(Action.READ)


def triage_stray(name: str, st: os.stat_result, *, now: float, stale_after_seconds: float, where: str) -> Triage:
    """An entry where none belongs (the ipc root, beside tasks/): quarantined, unless a fresh temp file."""
    if stat.S_ISREG(st.st_mode) and name.startswith(TEMP_PREFIX):
        return Triage(Action.REMOVE) if _is_stale(st, now, stale_after_seconds) else Triage(Action.WAIT)
    return Triage(Action.QUARANTINE, f"unexpected {describe_type(st)} {where}")


def read_entry(dir_fd: int, name: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """Read a regular file of at most `max_bytes` without following symlinks; the stat is of what was read."""
    before = lstat_at(dir_fd, name)
    if before is None:
        raise FileNotFoundError(errno.ENOENT, "vanished", name)
    _check_file(before, max_bytes)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IpcRejected("not a regular file (symlink)") from None
        raise
    try:
        st = os.fstat(fd)
        _check_file(st, max_bytes)
        chunks: list[bytes] = []
        remaining = max_bytes + 1  # one byte more than allowed tells a file that grew past the limit
        while remaining > 0:
            chunk = os.read(fd, min(remaining, _READ_CHUNK_BYTES))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise IpcRejected(f"file too large (more than {max_bytes} bytes)")
    return data, st


def _check_file(st: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise IpcRejected(f"not a regular file ({describe_type(st)})")
    if st.st_size > max_bytes:
        raise IpcRejected(f"file too large ({st.st_size} bytes, limit {max_bytes})")


def parse_request(data: bytes, *, name: str, chat_id: int) -> SpawnRequest:
    """Validate a tasks/ file for the folder's chat; raises IpcRejected with the reason."""
    request = _parse_request(data)
    if request.chat_id is not None and request.chat_id != chat_id:
        raise IpcRejected(f"unauthorised: chat_id {request.chat_id} is not the folder's chat")
    if not math.isfinite(request.created_at):
        # JSON NaN and 1e999 pass pydantic's float; the store and the scheduler cannot use them.
        raise IpcRejected("schema violation: created_at: must be a finite number")
    if name != f"{request.request_id}{JSON_SUFFIX}":
        raise IpcRejected("file name does not match request_id")
    return request


def _parse_request(data: bytes) -> SpawnRequest:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IpcRejected(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        return SpawnRequest.model_validate_json(text)
    except ValidationError as exc:
        raise IpcRejected(describe_validation_error(exc)) from None


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming what is wrong, without echoing the (possibly huge) input."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    if errors and errors[0]["type"] == "json_invalid":
        return f"invalid JSON: {errors[0]['msg'].removeprefix('Invalid JSON: ')}"
    shown = []
    for error in errors[:MAX_VALIDATION_ERRORS_SHOWN]:
        loc = ".".join(str(part) for part in error["loc"]) or "(top level)"
        shown.append(f"{loc}: {error['msg']}")
    more = len(errors) - len(shown)
    return "schema violation: " + "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


# --- removing and quarantining ------------------------------------------------------------------------


def remove_if_same(dir_fd: int, name: str, expected: os.stat_result) -> bool:
    """Delete the entry only if it is still the file that was read (it may have been replaced meanwhile)."""
    current = lstat_at(dir_fd, name)
    if current is None:
        return True
    if (current.st_dev, current.st_ino) != (expected.st_dev, expected.st_ino):
        return False
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    return True


def quarantine_name(folder: str, name: str, now: float) -> str:
    """`<UTC timestamp>-<folder>-<name>`, reduced to characters that are safe anywhere."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1_000_000):06d}Z"

    def safe(part: str) -> str:
        return _UNSAFE_NAME_CHARS.sub("_", part)[:MAX_QUARANTINE_PART_CHARS] or "_"

    base = f"{stamp}-{safe(folder)}-{safe(name)}"
    # An entry named like a reason file would be taken for one.
    return f"{base}_" if base.endswith(REASON_SUFFIX) else base


def quarantine(
    ipc_root: Path, src_dir_fd: int, name: str, *, folder: str, reason: str, now: float | None = None
) -> Path:
    """Move the entry (a symlink is moved, not followed) to errors/ and write `<same>.reason.txt` beside it.

    Raises OSError when the move is impossible (e.g. errors/ on another filesystem); the entry stays.
    """
    ensure_ipc_root(ipc_root)
    base = quarantine_name(folder, name, time.time() if now is None else now)
    with open_dir(errors_dir(ipc_root), follow=True) as errors_fd:  # errors/ is the host's alone
        dest = base
        suffix = 0
        while lstat_at(errors_fd, dest) is not None or lstat_at(errors_fd, dest + REASON_SUFFIX) is not None:
            suffix += 1
            dest = f"{base}-{suffix}"
        os.rename(name, dest, src_dir_fd=src_dir_fd, dst_dir_fd=errors_fd)
        fd = os.open(
            dest + REASON_SUFFIX,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            REASON_FILE_MODE,
            dir_fd=errors_fd,
        )
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(one_line(printable(reason), MAX_REASON_CHARS) + "\n")
    return errors_dir(ipc_root) / dest
