"""How long to wait after failures in a row: the outbox's sends, a scheduled task's runs, Telegram polling."""

from __future__ import annotations

# Doublings past this change nothing (every cap is reached long before) and would overflow a float.
MAX_DOUBLINGS = 64


def backoff_seconds(
    failures: int, *, first_seconds: float, max_seconds: float, retry_after_seconds: float | None = None
) -> float:
    """`first_seconds` after the first failure (or none yet), twice as long after each one more, at most
    `max_seconds`; when the other side said when to come back (Telegram's retry_after), that, but never
    sooner than `first_seconds`."""
    if retry_after_seconds is not None:
        return max(retry_after_seconds, first_seconds)
    doublings = min(max(failures - 1, 0), MAX_DOUBLINGS)
    return min(first_seconds * 2.0**doublings, max_seconds)
