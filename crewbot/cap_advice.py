"""A suggested MAX_CONCURRENT_SUBAGENTS, with its reasoning in one line each.

What the host can hold, by memory and by CPU, from the measured p95 per run (bounded by the per-run
limits SUBAGENT_MEMORY and SUBAGENT_CPUS, which no run can exceed; where nothing was measured, the limit
itself); and what demand needed: the most runs that wanted a slot at once, refused requests included.
The suggestion is the lower of the two: demand, unless the host cannot hold it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from core.settings import MAX_SUBAGENTS_CEILING, memory_limit_bytes
from crewbot.usage_stats import UsageStats

# Memory kept for the host itself (the bot, the engine, the page cache): subagents get the rest.
HOST_MEMORY_RESERVE_FRACTION = 0.25
MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True, slots=True)
class Host:
    memory_bytes: int
    cpus: int

    @classmethod
    def this_machine(cls) -> Host:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return cls(memory_bytes=int(pages * page_size), cpus=os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class Advice:
    suggested: int
    by_memory: int
    by_cpu: int
    needed: int
    lines: list[str]


def _size(value: float) -> str:
    return f"{value / GIB:.1f} GiB" if value >= GIB else f"{value / MIB:.0f} MiB"


def advise(stats: UsageStats, *, current_cap: int, memory_limit: str, cpus_limit: float, host: Host) -> Advice:
    limit_bytes = memory_limit_bytes(memory_limit)
    usable = host.memory_bytes * (1 - HOST_MEMORY_RESERVE_FRACTION)
    measured_memory = stats.memory_peak_bytes.p95
    per_run_memory = min(measured_memory, limit_bytes) if measured_memory else limit_bytes
    by_memory = max(1, math.floor(usable / max(per_run_memory, 1)))
    memory_basis = (
        f"p95 peak {_size(per_run_memory)} per run ({stats.memory_peak_bytes.known} runs measured)"
        if measured_memory
        else f"SUBAGENT_MEMORY={memory_limit} per run (no run's peak is known)"
    )
    measured_cores = stats.cpu_cores.p95
    per_run_cores = min(measured_cores, cpus_limit) if measured_cores else cpus_limit
    by_cpu = max(1, math.floor(host.cpus / max(per_run_cores, 0.01)))
    cpu_basis = (
        f"p95 {per_run_cores:.2f} cores busy per run (SUBAGENT_CPUS={cpus_limit:g} caps it)"
        if measured_cores
        else f"SUBAGENT_CPUS={cpus_limit:g} per run (no run's CPU time is known)"
    )
    needed = max(1, stats.peak_wanted)
    host_holds = min(by_memory, by_cpu)
    suggested = max(1, min(needed, host_holds, MAX_SUBAGENTS_CEILING))
    started = max(stats.requests - stats.refusals, 0)
    lines = [
        f"memory: the host holds {by_memory} at once: {_size(usable)} for subagents "
        f"({100 * (1 - HOST_MEMORY_RESERVE_FRACTION):.0f}% of {_size(host.memory_bytes)}) / {memory_basis}; "
        f"{max(1, math.floor(usable / limit_bytes))} if every run used its whole SUBAGENT_MEMORY",
        f"cpu: the host holds {by_cpu} at once: {host.cpus} cores / {cpu_basis}",
        f"demand: at most {stats.peak_wanted} runs wanted a slot at once; at cap {current_cap}, "
        f"{stats.refusals} of {stats.requests} requests were refused and {stats.waited} of {started} waited "
        f"(p95 wait {_seconds(stats.queue_wait_seconds.p95)}), {100 * stats.share_at_cap:.0f}% of the time at the cap",
    ]
    if stats.requests == 0:
        suggested = current_cap
        lines.append(f"suggested MAX_CONCURRENT_SUBAGENTS={suggested}: no runs in the period, nothing to go on")
    elif needed > host_holds:
        lines.append(
            f"suggested MAX_CONCURRENT_SUBAGENTS={suggested}: demand needed {needed}, but the host holds only "
            f"{host_holds} ({'memory' if by_memory <= by_cpu else 'CPU'} is the limit)"
        )
    else:
        lines.append(
            f"suggested MAX_CONCURRENT_SUBAGENTS={suggested}: what demand needed ({needed}); "
            f"the host holds {host_holds}"
        )
    return Advice(suggested, by_memory, by_cpu, needed, lines)


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} s"
