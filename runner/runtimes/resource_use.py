"""What a run's container used: peak memory and CPU time, sampled while it runs.

The engine forgets a container's cgroup the moment it exits (its stats are empty by the time `wait`
returns, measured on Docker 20.10), so figures are taken every RESOURCE_SAMPLE_SECONDS while it runs and
the last sample stands: what a run did in its final second is not seen. Peak memory is the cgroup's own
high-water mark (v1 `max_usage_in_bytes`, v2 `memory.peak`), never a sampled current usage passed off as
a peak: where none is reported, the figure is unknown (None), not a guess.

A local engine's cgroup files are read directly: the engine's stats call takes a second on Docker 20.10
(one-shot or not) and keeps its collector busy for every live container (bench: burst). The engine's
stats remain for a remote engine, or a cgroup layout not found here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESOURCE_SAMPLE_SECONDS = 1.0
NANOSECONDS_PER_SECOND = 1_000_000_000
MICROSECONDS_PER_SECOND = 1_000_000
# Where an engine with the cgroupfs or the systemd driver puts a container's cgroup: v2 (one tree), and
# v1's memory and cpuacct controllers (cpuacct may be mounted together with cpu).
CGROUP_V2_DIRS = ("/sys/fs/cgroup/docker/{id}", "/sys/fs/cgroup/system.slice/docker-{id}.scope")
CGROUP_V1_PARENTS = ("docker/{id}", "system.slice/docker-{id}.scope")
CGROUP_V1_MEMORY_ROOT = "/sys/fs/cgroup/memory"
CGROUP_V1_CPUACCT_ROOTS = ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct")


@dataclass(frozen=True, slots=True)
class ResourceSample:
    memory_peak_bytes: int | None  # the cgroup's high-water mark so far; None: the engine reports none
    cpu_seconds: float | None  # CPU time used so far, all cores together


@dataclass(slots=True)
class ResourceUse:
    """The figures of one run, from its samples so far."""

    memory_peak_bytes: int | None = None
    cpu_seconds: float | None = None
    samples: int = 0

    def add(self, sample: ResourceSample) -> None:
        self.samples += 1
        if sample.memory_peak_bytes is not None:
            self.memory_peak_bytes = max(self.memory_peak_bytes or 0, sample.memory_peak_bytes)
        if sample.cpu_seconds is not None:
            self.cpu_seconds = max(self.cpu_seconds or 0.0, sample.cpu_seconds)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_sample(container_id: str, root: str = "") -> ResourceSample | None:
    """A local container's figures from its cgroup files (v2, else v1); None if no cgroup of it is found."""
    return cgroup_v2_sample(container_id, root) or cgroup_v1_sample(container_id, root)


def cgroup_v1_sample(
    container_id: str, root: str = "", parents: tuple[str, ...] = CGROUP_V1_PARENTS
) -> ResourceSample | None:
    """memory.max_usage_in_bytes and cpuacct.usage (nanoseconds) of a local container's v1 cgroups, at the first
    of `parents` (relative to the controllers' roots, `{id}` the container's) that exists."""
    for parent in parents:
        memory = Path(root + CGROUP_V1_MEMORY_ROOT) / parent.format(id=container_id)
        if not memory.is_dir():
            continue
        cpu_ns: int | None = None
        for cpuacct_root in CGROUP_V1_CPUACCT_ROOTS:
            cpu_ns = _read_int(Path(root + cpuacct_root) / parent.format(id=container_id) / "cpuacct.usage")
            if cpu_ns is not None:
                break
        return ResourceSample(
            memory_peak_bytes=_read_int(memory / "memory.max_usage_in_bytes"),
            cpu_seconds=cpu_ns / NANOSECONDS_PER_SECOND if cpu_ns is not None else None,
        )
    return None


def cgroup_v2_sample(
    container_id: str, root: str = "", dirs: tuple[str, ...] = CGROUP_V2_DIRS
) -> ResourceSample | None:
    """memory.peak (kernel 5.19+) and cpu.stat's usage_usec of a local container's v2 cgroup, if readable."""
    for pattern in dirs:
        directory = Path(root + pattern.format(id=container_id))
        if not directory.is_dir():
            continue
        cpu: float | None = None
        try:
            for line in (directory / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    cpu = int(value) / MICROSECONDS_PER_SECOND
        except (OSError, ValueError):
            cpu = None
        return ResourceSample(memory_peak_bytes=_read_int(directory / "memory.peak"), cpu_seconds=cpu)
    return None


def sample_from_engine_stats(stats: Mapping[str, Any]) -> ResourceSample | None:
    """The engine's one-shot stats (`GET /containers/{id}/stats?stream=false`); None once it has exited
    (the engine then answers with empty figures)."""
    memory = stats.get("memory_stats") or {}
    cpu_usage = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    total_ns = cpu_usage.get("total_usage")
    if not memory and not total_ns:
        return None
    peak = memory.get("max_usage")  # cgroup v1 only; v2 engines of Docker 20.10 report no peak
    return ResourceSample(
        memory_peak_bytes=int(peak) if isinstance(peak, int) and peak > 0 else None,
        cpu_seconds=int(total_ns) / NANOSECONDS_PER_SECOND if isinstance(total_ns, int) and total_ns > 0 else None,
    )
