"""The files the task offers, written to <workspace>/inbox/ by the container itself before the agent's first step.

The workspace is kept between a chat's runs, and an earlier run may have planted anything in it: a symlink, a
FIFO, a file or a directory at `inbox` or at the name being written. Each write is made safe by how it is done,
never by trusting what is there:

- `inbox` that is not a real directory (by lstat) is removed as it is (a link is unlinked, never followed) and
  made again; then it is opened with O_NOFOLLOW and every call is relative to that directory's fd;
- a file is written to a fresh temp name (O_CREAT|O_EXCL|O_NOFOLLOW: never an existing entry, so never a FIFO
  that would block or a link that would lead elsewhere), then renamed over its name: rename replaces a link,
  FIFO or file there as an entry, without opening or following it;
- a directory at the name cannot be replaced so: the file gets a numbered name (`data (2).csv`) instead.

A file that fails (the host refuses it, the download breaks off, the disk is full) leaves no partial file and
becomes a note in the task text; the run goes on.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from container.channel import ChannelRefused
from container.contract import INBOX_DIR
from container.file_names import numbered, unique_names
from container.task import OfferedFile, Task
from container.text import one_line

INBOX_MODE = 0o755
FILE_MODE = 0o644  # the agent's commands read it; the run's uid owns it either way
TEMP_PREFIX = ".inbox-"  # safe names never start with a dot, so a temp name never meets an offered one
MAX_NUMBER = 100  # `name (2)` .. `name (100)`: past that, a run planted too many directories to bother
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileFetcher(Protocol):
    """The run channel's side that hands over the task's files (container/channel.py)."""

    async def fetch_file(self, index: int, fd: int, size_bytes: int) -> int: ...


@dataclass(frozen=True, slots=True)
class InboxFile:
    name: str  # as written in the inbox
    size_bytes: int
    mime_type: str | None = None


@dataclass(frozen=True, slots=True)
class Inbox:
    """What the inbox holds for this run, and the lines on files the run was not given."""

    path: Path
    files: list[InboxFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """The task text's part on files: empty when the run has none and no notes on them."""
        if not self.files and not self.notes:
            return ""
        heading = f"Files from the chat, in {self.path}/:" if self.files else "Files from the chat:"
        lines = [heading]
        lines += [f"- {file.name} ({_details(file)})" for file in self.files]
        lines += [f"- {one_line(note).removeprefix('- ')}" for note in self.notes]
        lines.append("To send a file from the workspace back to the chat, call send_file(path, caption).")
        return "\n".join(lines)


async def fill_inbox(task: Task, channel: FileFetcher, workspace_dir: Path, log: Callable[[str], None]) -> Inbox:
    """Fetch each offered file into the inbox; the host's notes, then one per file that failed, as notes."""
    inbox = Inbox(workspace_dir / INBOX_DIR, notes=list(task.file_notes))
    if not task.files:
        return inbox  # nothing to write: the inbox is not touched
    names = unique_names([offered.name for offered in task.files])
    try:
        dir_fd = open_inbox(workspace_dir, log)
    except OSError as exc:
        log(f"the inbox could not be made: {exc}")
        inbox.notes.extend(f"{name} was not given: the inbox could not be made ({_why(exc)})" for name in names)
        return inbox
    try:
        taken = {name.casefold() for name in names}
        for offered, name in zip(task.files, names, strict=True):
            try:
                written, size = await _write_file(channel, dir_fd, offered, name, taken, log)
            except (ChannelRefused, OSError) as exc:
                log(f"file {offered.index} ({name}) was not given: {exc}")
                inbox.notes.append(f"{name} was not given: {_why(exc)}")
                continue
            inbox.files.append(InboxFile(written, size, offered.mime_type))
    finally:
        os.close(dir_fd)
    return inbox


def open_inbox(workspace_dir: Path, log: Callable[[str], None]) -> int:
    """The inbox directory's fd, the directory made (again) first unless a real one is there."""
    workspace_fd = os.open(workspace_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        kind = _kind(workspace_fd, INBOX_DIR)
        if kind is not None and kind != "directory":
            os.unlink(INBOX_DIR, dir_fd=workspace_fd)  # the entry itself: a link goes, its target stays
            log(f"{INBOX_DIR} was a {kind}; removed it and made a directory")
        if kind != "directory":
            os.mkdir(INBOX_DIR, INBOX_MODE, dir_fd=workspace_fd)
        # O_NOFOLLOW: a link swapped in since the check fails here rather than leading the writes elsewhere.
        return os.open(INBOX_DIR, _OPEN_DIR, dir_fd=workspace_fd)
    finally:
        os.close(workspace_fd)


async def _write_file(
    channel: FileFetcher, dir_fd: int, offered: OfferedFile, name: str, taken: set[str], log: Callable[[str], None]
) -> tuple[str, int]:
    """Fetch one file to a temp name, then rename it over its name (or a numbered one); the name written and
    its size."""
    final = _free_name(dir_fd, name, taken, log)
    temp = f"{TEMP_PREFIX}{secrets.token_hex(8)}.part"
    fd = os.open(temp, _CREATE, FILE_MODE, dir_fd=dir_fd)
    try:
        try:
            size = await channel.fetch_file(offered.index, fd, offered.size_bytes)
            os.fchmod(fd, FILE_MODE)  # the umask may have taken bits off the mode open gave
        finally:
            os.close(fd)
        os.replace(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:  # a cancelled run too: no partial file stays behind
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    taken.add(final.casefold())
    return final, size


def _free_name(dir_fd: int, name: str, taken: set[str], log: Callable[[str], None]) -> str:
    """`name`, or the first numbered name that is neither a directory nor another file of this run."""
    kind = _kind(dir_fd, name)
    if kind not in ("directory", None, "regular file"):
        log(f"{INBOX_DIR}/{name} was a {kind}; replacing it")
    candidate = name
    number = 1
    while kind == "directory":
        number += 1
        if number > MAX_NUMBER:
            raise IsADirectoryError(f"{name} and {MAX_NUMBER - 1} numbered names are directories")
        candidate = numbered(name, number)
        if candidate.casefold() not in taken:
            kind = _kind(dir_fd, candidate)
    if candidate != name:
        log(f"{INBOX_DIR}/{name} is a directory; writing {candidate} instead")
    return candidate


def _kind(dir_fd: int, name: str) -> str | None:
    """What the entry is, by lstat: None when there is none."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    return "special file"


def _details(file: InboxFile) -> str:
    size = _size(file.size_bytes)
    return f"{size}, {one_line(file.mime_type)}" if file.mime_type else size


def _size(size_bytes: int) -> str:
    if size_bytes < 1024:
        return f"{size_bytes} bytes"
    if size_bytes < 1024 * 1024:
        return f"{round(size_bytes / 1024)} KB"
    return f"{size_bytes / (1024 * 1024):.1f} MB"


def _why(exc: BaseException) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return one_line(text) or type(exc).__name__
