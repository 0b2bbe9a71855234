"""Bounds of the numeric settings, so that no value switches a limit off or breaks every run.

Each numeric setting carries pydantic's `ge`/`le` (and `allow_inf_nan=False` for floats); those bounded by
the machine (CPU cores, memory) carry an `AtMostHost` too, measured when a value is validated, not at
import. A refusal names the whole allowed range, whichever bound was crossed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from annotated_types import Ge, Le
from pydantic import GetCoreSchemaHandler
from pydantic.fields import FieldInfo
from pydantic_core import core_schema

MAX_INT64 = 2**63 - 1  # the engine's and SQLite's integers
BYTES_PER_MIB = 1024**2

MAX_LLM_TIMEOUT_SECONDS = 3_600.0
MIN_LLM_TIMEOUT_SECONDS = 1.0
MIN_SUBAGENT_TIMEOUT_SECONDS = 0.5
MAX_SUBAGENT_TIMEOUT_SECONDS = 86_400.0  # one day: a longer job is a scheduled task's, not one run's
MAX_MERGE_WINDOW_SECONDS = 300.0
MIN_TYPING_INTERVAL_SECONDS = 0.2  # faster would flood Telegram with chat actions
MAX_TYPING_INTERVAL_SECONDS = 60.0
MIN_SUBAGENT_CPUS = 0.01  # the Docker engine's smallest CPU limit (NanoCpus 10,000,000)
MIN_SUBAGENT_PIDS = 16
MAX_SUBAGENT_PIDS = 32_768  # Linux's default pid_max: more is no limit at all
MIN_SUBAGENT_MAX_TOKENS = 1_000
MAX_SUBAGENT_MAX_TOKENS = 10_000_000
MAX_WORKSPACE_QUOTA_MB = 1_048_576  # 1 TiB
MAX_SUBAGENT_FILE_MB = 50  # Telegram's upload limit for bots; the host holds one such file in memory to send it
MAX_SUBAGENT_FILES = 50  # files one run may send: each is a message in the chat
MAX_DAILY_TOKENS = 1_000_000_000_000  # a trillion tokens a day: a bound, far above any real allowance
MAX_PRICE_PER_MTOK = 10_000.0  # money per million tokens: above every provider's price list
MAX_SUBAGENT_EGRESS_MB = 100_000  # 100 GB a run: a bound, not a suggestion
MAX_SUBAGENT_EGRESS_CONNECTIONS = 256  # connections one run holds through the door at once
MAX_SUBAGENT_RUN_FILES_MB = 1_000  # the files one run is given, together: downloaded and kept host-side
MIN_DATA_RETENTION_DAYS = 0.01  # about 15 minutes
MAX_DATA_RETENTION_DAYS = 3_650.0  # ten years
MIN_IPC_RESCAN_SECONDS = 0.5
MAX_IPC_RESCAN_SECONDS = 300.0
MIN_IPC_MAX_FILE_BYTES = 1_024
MAX_IPC_MAX_FILE_BYTES = 16 * BYTES_PER_MIB
MAX_SCHEDULE_MIN_INTERVAL_SECONDS = 7 * 86_400
MAX_SCHEDULE_MISFIRE_GRACE_SECONDS = 86_400


def host_cpu_count() -> int:
    """CPU cores of this machine (the engine refuses a CPU limit above its host's)."""
    return os.cpu_count() or 1


def host_memory_bytes() -> int:
    """Physical memory of this machine; int64's maximum where the system does not say."""
    try:
        pages, page_bytes = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return MAX_INT64
    return pages * page_bytes if pages > 0 and page_bytes > 0 else MAX_INT64


def shown(number: float) -> str:
    """A bound as an operator writes it: 86400, not 86400.0 or 8.64e+04."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


@dataclass(frozen=True, slots=True)
class AtMostHost:
    """Annotated upper bound that this machine sets (cores, memory): measured at each validation."""

    measure: Callable[[], float]
    what: str  # e.g. "this host's CPU cores"

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: float) -> float:
        if value > self.measure():
            raise ValueError(f"must be at most {shown(self.measure())} ({self.what})")
        return value


def allowed_range(info: FieldInfo) -> str | None:
    """'a whole number from 1 to 100' for a numeric setting, None for any other (or an unbounded one)."""
    if info.annotation not in (int, float):
        return None
    low: float | None = None
    high: float | None = None
    note = ""
    for item in info.metadata:
        if isinstance(item, Ge):
            low = float(cast(float, item.ge))
        elif isinstance(item, Le):
            high = float(cast(float, item.le))
        elif isinstance(item, AtMostHost):
            high, note = item.measure(), f" ({item.what})"
    if low is None or high is None:
        return None
    kind = "a whole number" if info.annotation is int else "a number"
    return f"{kind} from {shown(low)} to {shown(high)}{note}"
