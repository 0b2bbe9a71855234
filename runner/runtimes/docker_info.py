"""Docker's answers about a container read into crewbot's terms: its state, its times."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from runner.runtimes.runtime import ContainerInfo

# Docker reports "never started" as the zero time.
_ZERO_TIME_PREFIX = "0001-01-01"


def parse_docker_time(value: str | None) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, `Z`) as unix seconds; None for the zero time or nothing."""
    if not value or value.startswith(_ZERO_TIME_PREFIX):
        return None
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        # Trim the fraction to microseconds; keep the offset that follows it.
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    return datetime.fromisoformat(text).timestamp()


def info_from_attrs(attrs: Mapping[str, Any]) -> ContainerInfo:
    state = attrs.get("State") or {}
    status = str(state.get("Status", "unknown"))
    running = status in {"created", "running", "paused", "restarting"}
    return ContainerInfo(
        id=str(attrs["Id"]),
        name=str(attrs.get("Name", "")).lstrip("/"),
        labels=dict((attrs.get("Config") or {}).get("Labels") or {}),
        status=status,
        exit_code=None if running else int(state.get("ExitCode", 0)),
        started_at=parse_docker_time(state.get("StartedAt")),
    )
