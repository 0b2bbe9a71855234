"""File names made safe: whatever a chat member or a subagent called a file, the name it is stored, written or
sent under is one plain directory entry. A name is never a reason to refuse a file: `../../evil.csv` becomes
`evil.csv`, a name of only dots `file`, and two equal names in one run `data.csv` and `data (2).csv`.

Standard library only: the container's agent and the host both use it.
"""

from __future__ import annotations

import re
import unicodedata

from container.contract import MAX_FILE_NAME_BYTES

FALLBACK_NAME = "file"
# Path separators, characters shells and other systems treat specially, and every control character.
_UNSAFE = re.compile(r'[/\\:*?"<>|\x00-\x1f\x7f]')
_SPACES = re.compile(r"\s+")
MAX_EXTENSION_CHARS = 16  # `.tar.gz`, `.xlsx`: an extension longer than this is part of the name


def safe_file_name(name: str) -> str:
    """One directory entry: the last path component, no separators or control characters, no leading dot
    (not hidden, never `.` or `..`), at most MAX_FILE_NAME_BYTES in UTF-8 with its extension kept."""
    # Format characters (right-to-left overrides) can make `evil.exe` read as `exe.live`; drop them too.
    text = "".join(ch for ch in name if unicodedata.category(ch) not in ("Cf", "Cs", "Co"))
    text = text.replace("\\", "/").rsplit("/", 1)[-1]
    text = _SPACES.sub(" ", _UNSAFE.sub("_", text)).strip()
    text = text.lstrip(". ").rstrip(" ")
    if not text.strip("._ "):
        return FALLBACK_NAME
    return _fit(text, MAX_FILE_NAME_BYTES)


def numbered(name: str, number: int) -> str:
    """The name with ` (number)` before its extension: `data.csv` -> `data (2).csv`, within the byte limit."""
    stem, extension = split_extension(name)
    suffix = f" ({number}){extension}"
    return _fit_stem(stem, MAX_FILE_NAME_BYTES - len(suffix.encode())) + suffix


def unique_names(names: list[str]) -> list[str]:
    """Each name made safe, and numbered where it would repeat an earlier one (compared without case, as
    some file systems and people do)."""
    taken: set[str] = set()
    result: list[str] = []
    for raw in names:
        name = safe_file_name(raw)
        candidate, number = name, 1
        while candidate.casefold() in taken:
            number += 1
            candidate = numbered(name, number)
        taken.add(candidate.casefold())
        result.append(candidate)
    return result


def split_extension(name: str) -> tuple[str, str]:
    """(`data`, `.csv`); no extension for a name without a dot, or with a very long one."""
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem or len(extension) > MAX_EXTENSION_CHARS or " " in extension:
        return name, ""
    return stem, f".{extension}"


def _fit(name: str, limit: int) -> str:
    if len(name.encode()) <= limit:
        return name
    stem, extension = split_extension(name)
    return _fit_stem(stem, limit - len(extension.encode())) + extension


def _fit_stem(stem: str, limit: int) -> str:
    encoded = stem.encode()[: max(limit, 1)]
    return encoded.decode("utf-8", errors="ignore").rstrip() or FALLBACK_NAME
