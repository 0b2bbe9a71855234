"""Whether the host has memory for more warm pool members: /proc/meminfo's MemAvailable against what the members
to add would use, plus a margin left for runs and the bot itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
BYTES_PER_KIB = 1024
BYTES_PER_MIB = 1024 * 1024
# What one idle member uses (its agent imported and waiting; measured ~20 MiB with bench/warm_pool.py), rounded up.
MEMBER_ESTIMATE_MIB = 64
MARGIN_MIB = 512  # left free for the runs themselves, the bot, and the page cache of the host's database


def mem_available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable, or None where the kernel does not report it (the check is then skipped)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            fields = rest.split()
            return int(fields[0]) * BYTES_PER_KIB if fields and fields[0].isdigit() else None
    return None


class MemoryCheck:
    def __init__(
        self,
        available: Callable[[], int | None] = mem_available_bytes,
        member_mib: int = MEMBER_ESTIMATE_MIB,
        margin_mib: int = MARGIN_MIB,
    ) -> None:
        self._available = available
        self._member_mib = member_mib
        self._margin_mib = margin_mib

    def short_of(self, members: int) -> str | None:
        """Why `members` more would leave the host short (the pool's paused reason), or None."""
        available = self._available()
        if available is None:
            return None
        needed = (members * self._member_mib + self._margin_mib) * BYTES_PER_MIB
        if available >= needed:
            return None
        return (
            f"memory: {available // BYTES_PER_MIB} MiB available, under the {needed // BYTES_PER_MIB} MiB "
            f"that {members} more member(s) and a {self._margin_mib} MiB margin need"
        )
