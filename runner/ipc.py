"""IPC folders on the host: their layout, the host's own writes, and reading, validating and quarantining
what containers leave in them.

Layout under `DATA_DIR/ipc/`: `<folder>/tasks/*.json` (SpawnRequest), `<folder>/messages/*.json`
(ProgressMessage), `errors/` (quarantine). Everything below a chat folder is written by an untrusted
container, so every operation there goes through directory descriptors opened with O_NOFOLLOW: a container
that swaps `tasks/` for a symlink cannot make the host read, move, chown or delete anything outside its
folder. The chat a file speaks for is the folder's, never the file's.
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
from enum import Enum, StrEnum
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from container.protocol import (
    IPC_MESSAGES_DIR,
    IPC_TASKS_DIR,
    ProgressMessage,
    SpawnRequest,
    write_json_atomic,
)
from runner.paths import CONTAINER_GID, CONTAINER_UID, host_is_root

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
# The chat folder stays the host's and read-only to the container: it cannot replace tasks/ or put
# anything beside it. Only tasks/ and messages/ are the container's.
CHAT_DIR_MODE = 0o755
CHAT_SUBDIR_MODE = 0o770
REASON_FILE_MODE = 0o640
MAX_REASON_CHARS = 500
MAX_QUARANTINE_PART_CHARS = 100  # keeps `<stamp>-<folder>-<name>.reason.txt` under NAME_MAX (255)
MAX_VALIDATION_ERRORS_SHOWN = 3

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the lstat check must not hang the watcher in open().
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_READ_CHUNK_BYTES = 64 * 1024

ModelT = TypeVar("ModelT", bound=BaseModel)


class IpcKind(StrEnum):
    """The two folders a container writes into; the value is the folder's name."""

    TASKS = IPC_TASKS_DIR
    MESSAGES = IPC_MESSAGES_DIR


@dataclass(frozen=True, slots=True)
class DirOwner:
    """Owner given to tasks/ and messages/ when the host runs as root."""

    uid: int = CONTAINER_UID
    gid: int = CONTAINER_GID


def container_owner() -> DirOwner | None:
    """The owner `ensure_chat_dirs` needs here: the image's user when the host is root (containers then
    run as that user, see `runner.paths.container_user`), else None (they run as the host's user)."""
    return DirOwner() if host_is_root() else None


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


@contextmanager
def open_dir(name: str | Path, dir_fd: int | None = None, *, follow: bool = False) -> Iterator[int]:
    """A directory descriptor; without `follow` a symlink raises (ELOOP) instead of being followed."""
    flags = _DIR_FLAGS & ~os.O_NOFOLLOW if follow else _DIR_FLAGS
    fd = os.open(name, flags, dir_fd=dir_fd)
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


def ensure_chat_dirs(
    ipc_root: Path, folder: str, *, owner: DirOwner | None = None, mode: int = CHAT_SUBDIR_MODE
) -> Path:
    """Create or repair `<folder>/tasks` and `<folder>/messages`; return the chat folder to mount.

    Pass `owner` when the host runs as root, so the container user can write there. When the host is
    not root and its uid is not the container's, pass a `mode` that lets the container in (e.g. 0o777).
    A `tasks` or `messages` entry that is not a real directory is quarantined and replaced.
    """
    _check_folder(folder)
    ensure_ipc_root(ipc_root)
    with open_dir(ipc_root, follow=True) as root_fd:
        _mkdir_at(folder, root_fd, CHAT_DIR_MODE)
        with open_dir(folder, root_fd) as chat_fd:
            os.fchmod(chat_fd, CHAT_DIR_MODE)
            for kind in IpcKind:
                _ensure_subdir(ipc_root, folder, chat_fd, kind, owner=owner, mode=mode)
    return ipc_root / folder


def _mkdir_at(name: str, dir_fd: int, mode: int) -> None:
    with suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=dir_fd)


def _ensure_subdir(
    ipc_root: Path, folder: str, chat_fd: int, kind: IpcKind, *, owner: DirOwner | None, mode: int
) -> None:
    _mkdir_at(kind, chat_fd, mode)
    try:
        fd = os.open(kind, _DIR_FLAGS, dir_fd=chat_fd)
    except OSError as exc:
        if not is_not_directory(exc):
            raise
        quarantine(ipc_root, chat_fd, kind, folder=folder, reason=f"{kind} is not a directory")
        _mkdir_at(kind, chat_fd, mode)
        fd = os.open(kind, _DIR_FLAGS, dir_fd=chat_fd)
    try:
        # fchown/fchmod act on the directory opened above, never on whatever a symlink points to.
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def write_spawn_request(ipc_root: Path, folder: str, request: SpawnRequest) -> Path:
    """Drop a spawn request into the chat's tasks/ atomically (the main agent's spawn tool)."""
    return _write_into(ipc_root, folder, IpcKind.TASKS, f"{request.request_id}{JSON_SUFFIX}", request)


def write_progress_message(ipc_root: Path, folder: str, message: ProgressMessage) -> Path:
    """Drop a progress message into the chat's messages/ atomically."""
    return _write_into(ipc_root, folder, IpcKind.MESSAGES, f"{message.message_id}{JSON_SUFFIX}", message)


def _write_into(ipc_root: Path, folder: str, kind: IpcKind, name: str, model: BaseModel) -> Path:
    """Write through descriptors: the folders must exist (`ensure_chat_dirs`) and must not be symlinks.

    `/proc/self/fd/N` names the directory opened as N itself, so write_json_atomic's temp file and rename
    land in that directory even if a container renames or replaces `tasks/` meanwhile.
    """
    _check_folder(folder)
    with (
        open_dir(ipc_root, follow=True) as root_fd,
        open_dir(folder, root_fd) as chat_fd,
        open_dir(kind, chat_fd) as kind_fd,
    ):
        write_json_atomic(Path(f"/proc/self/fd/{kind_fd}") / name, model)
    return ipc_root / folder / kind / name


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
    # ctime, not mtime: a container can set mtime to the future with utime(), but not ctime.
    return now - st.st_ctime >= stale_after_seconds


def triage(name: str, st: os.stat_result, *, now: float, stale_after_seconds: float) -> Triage:
    """Decide what to do with an entry in tasks/ or messages/ before reading it."""
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
    request = _parse(SpawnRequest, data)
    _check_identity(request.chat_id, chat_id, request.created_at)
    if name != f"{request.request_id}{JSON_SUFFIX}":
        raise IpcRejected("file name does not match request_id")
    return request


def parse_message(data: bytes, *, name: str, chat_id: int) -> ProgressMessage:
    """Validate a messages/ file for the folder's chat; raises IpcRejected with the reason."""
    message = _parse(ProgressMessage, data)
    _check_identity(message.chat_id, chat_id, message.created_at)
    if name != f"{message.message_id}{JSON_SUFFIX}":
        raise IpcRejected("file name does not match message_id")
    return message


def _parse(model: type[ModelT], data: bytes) -> ModelT:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IpcRejected(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise IpcRejected(describe_validation_error(exc)) from None


def _check_identity(claimed_chat_id: int | None, folder_chat_id: int, created_at: float) -> None:
    if claimed_chat_id is not None and claimed_chat_id != folder_chat_id:
        raise IpcRejected(f"unauthorised: chat_id {claimed_chat_id} is not the folder's chat")
    if not math.isfinite(created_at):
        # JSON NaN and 1e999 pass pydantic's float; the store and the scheduler cannot use them.
        raise IpcRejected("schema violation: created_at: must be a finite number")


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
    """Delete the entry only if it is still the file that was read (a container may have replaced it)."""
    current = lstat_at(dir_fd, name)
    if current is None:
        return True
    if (current.st_dev, current.st_ino) != (expected.st_dev, expected.st_ino):
        return False
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    return True


def one_line(reason: str) -> str:
    return " ".join(printable(reason).split())[:MAX_REASON_CHARS]


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
            handle.write(one_line(reason) + "\n")
    return errors_dir(ipc_root) / dest
