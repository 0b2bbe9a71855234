"""The warm pool's state as the running bot last saw it, in a small host-only file (DATA_DIR/warm-pool.json) that
`crewbot stats` and `crewbot doctor`, other processes, read: the pool itself lives only in the bot's memory."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from container.protocol import write_bytes_atomic

STATUS_FILE_NAME = "warm-pool.json"
STALE_SECONDS = 120.0  # the bot writes it at least every RECHECK_SECONDS: older means no bot is running


@dataclass(frozen=True, slots=True)
class PoolStats:
    target: int  # SUBAGENT_WARM_POOL
    ready: int
    starting: int
    hits: int  # runs that took a member since the start
    misses: int  # runs that started cold with the pool on (empty, or its members stale)
    paused: str | None  # why refilling stopped, if it did
    idle_memory_bytes: int | None  # what the ready members use together (None: the engine reports none)


def status_file(data_dir: Path) -> Path:
    return data_dir / STATUS_FILE_NAME


def write_status(path: Path, stats: PoolStats) -> None:
    """Blocking: call in a thread."""
    body = {**dataclasses.asdict(stats), "written_at": time.time()}
    write_bytes_atomic(path, json.dumps(body).encode())


def read_status(path: Path, now: float | None = None) -> tuple[PoolStats, bool] | None:
    """The last state written and whether it is fresh (a bot is running); None when there is none."""
    try:
        body = json.loads(path.read_bytes())
        written_at = float(body.pop("written_at"))
        stats = PoolStats(**body)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return stats, (now or time.time()) - written_at < STALE_SECONDS


def describe(stats: PoolStats) -> str:
    """One line: what is ready, how runs met it, what the idle members hold, and why refilling stopped."""
    claims = stats.hits + stats.misses
    rate = f" ({100 * stats.hits / claims:.0f}% hits)" if claims else ""
    line = f"{stats.ready} of {stats.target} ready, {stats.hits} hits, {stats.misses} misses{rate}"
    if stats.idle_memory_bytes is not None and stats.ready:
        mib = stats.idle_memory_bytes / (1024 * 1024)
        line += f"; idle memory {mib:.0f} MiB ({mib / stats.ready:.0f} MiB a container)"
    if stats.paused:
        line += f"; refilling paused: {stats.paused}"
    return line
