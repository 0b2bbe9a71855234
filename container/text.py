"""Text from elsewhere (a host error, a setting, a refusal's reason) on one line: for a task's text, a log line,
an event, an HTTP body or a reason file, where a line break or a control character would start a line of its own
or forge one.

Standard library only: the container's agent and the host both use it (as they do container/file_names.py).
"""

from __future__ import annotations

ELLIPSIS = "…"


def one_line(text: str, max_chars: int | None = None) -> str:
    """Every character that is not printable (line breaks, controls, format characters) a space, runs of spaces
    one, no space at either end; at most `max_chars` characters, the last of them `…` when it was cut."""
    flat = "".join(char if char.isprintable() else " " for char in text)
    words = " ".join(flat.split())
    if max_chars is None or len(words) <= max_chars:
        return words
    return words[: max_chars - 1] + ELLIPSIS if max_chars > 0 else ""
