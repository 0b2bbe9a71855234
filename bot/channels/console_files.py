"""Files in the console: `/file PATH [text]` posts a local file as a chat member would on Telegram, and a
file a subagent sends is saved into `DATA_DIR/console-files/` for the person at the terminal.

The path is the operator's own, typed at their terminal: it is read as given (following links), like any
file they open. A file a subagent sends is already host-side (the run channel took its bytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
import os
import shutil
from pathlib import Path

from container.file_names import numbered, safe_file_name
from core.store.chat_files import FileKind, FileUnavailable, NewFile
from core.store.outbox import OutgoingFile

FILE_COMMAND = "/file"
USAGE = "usage: /file PATH [text]  (the text is sent with the file, e.g. `background: $ wc -l inbox/data.csv`)"
MAX_NUMBERED_NAMES = 1_000


class AttachError(Exception):
    """The path cannot be attached: the message says why, for the console to show."""


async def attach(line: str) -> tuple[NewFile, str]:
    """The file `/file PATH [text]` names and the text that goes with it."""
    # The path is the first word, or quoted when it has spaces; the text after it is kept as typed.
    rest = line[len(FILE_COMMAND) :].strip()
    if rest[:1] in ("'", '"'):
        end = rest.find(rest[0], 1)
        if end < 0:
            raise AttachError(f"the path's quote is not closed; {USAGE}")
        first, text = rest[1:end], rest[end + 1 :]
    else:
        first, _, text = rest.partition(" ")
    if not first:
        raise AttachError(USAGE)
    text = text.strip()
    return await asyncio.to_thread(_describe, first), text


def _describe(typed: str) -> NewFile:
    path = Path(typed).expanduser()
    try:
        resolved = path.resolve(strict=True)
        stat = resolved.stat()
    except OSError as exc:
        raise AttachError(f"{path}: {exc.strerror or exc}") from None
    if not resolved.is_file():
        raise AttachError(f"{path} is not a regular file")
    # Changed content is another file (as Telegram's file_unique_id is for other bytes): downloaded again.
    unique = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    mime, _ = mimetypes.guess_type(resolved.name)
    return NewFile(
        kind=FileKind.DOCUMENT,
        file_id=str(resolved),
        file_unique_id=unique,
        name=resolved.name,
        mime_type=mime,
        size_bytes=stat.st_size,
    )


def read_local(file_id: str, max_bytes: int) -> bytes:
    """A console file's bytes (its file_id is its path), up to `max_bytes`; blocking: call it in a thread."""
    try:
        with open(file_id, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise FileUnavailable(f"{file_id}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise FileUnavailable(f"it is over the limit of {max_bytes} bytes")
    return data


def save_copy(files_dir: Path, file: OutgoingFile) -> Path:
    """Copy a sent file into `files_dir` under its own name, numbered when taken; blocking."""
    files_dir.mkdir(parents=True, exist_ok=True)
    name = safe_file_name(file.name)
    for number in range(1, MAX_NUMBERED_NAMES + 1):
        target = files_dir / (name if number == 1 else numbered(name, number))
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            continue
        with open(fd, "wb") as out, file.path.open("rb") as source:
            shutil.copyfileobj(source, out)
        return target
    raise OSError(f"{files_dir} has {MAX_NUMBERED_NAMES} files named like {name}")
