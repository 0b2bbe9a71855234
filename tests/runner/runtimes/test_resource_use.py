"""Reading a container's figures: its local cgroup files (v2, v1), the engine's stats on cgroup v1 and v2,
and "unknown" (None) wherever a true peak is not reported, never the current usage passed off as a peak."""

from __future__ import annotations

from pathlib import Path

from runner.runtimes.resource_use import (
    ResourceSample,
    ResourceUse,
    cgroup_sample,
    cgroup_v1_sample,
    cgroup_v2_sample,
    sample_from_engine_stats,
)

MIB = 1024 * 1024
CONTAINER = "c0ffee" * 10


def test_cgroup_v1_stats_have_a_peak_and_cpu_time() -> None:
    stats = {
        "memory_stats": {"usage": 40 * MIB, "max_usage": 90 * MIB},
        "cpu_stats": {"cpu_usage": {"total_usage": 1_500_000_000}},
    }
    assert sample_from_engine_stats(stats) == ResourceSample(memory_peak_bytes=90 * MIB, cpu_seconds=1.5)


def test_cgroup_v2_stats_without_a_peak_leave_memory_unknown() -> None:
    stats = {
        "memory_stats": {"usage": 40 * MIB, "stats": {}},
        "cpu_stats": {"cpu_usage": {"total_usage": 2_000_000_000}},
    }
    assert sample_from_engine_stats(stats) == ResourceSample(memory_peak_bytes=None, cpu_seconds=2.0)


def test_an_exited_container_has_no_figures() -> None:
    # What the engine answers for a stopped container: empty memory stats and zero CPU.
    stats = {"memory_stats": {}, "cpu_stats": {"cpu_usage": {"total_usage": 0}}}
    assert sample_from_engine_stats(stats) is None


def test_a_v2_cgroup_has_memory_peak_and_cpu_time(tmp_path: Path) -> None:
    cgroup = tmp_path / "sys/fs/cgroup/system.slice" / f"docker-{CONTAINER}.scope"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.peak").write_text(f"{123 * MIB}\n")
    (cgroup / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    expected = ResourceSample(memory_peak_bytes=123 * MIB, cpu_seconds=2.5)
    assert cgroup_v2_sample(CONTAINER, root=str(tmp_path)) == expected
    assert cgroup_sample(CONTAINER, root=str(tmp_path)) == expected


def _v1_cgroup(root: Path, parent: str, cpuacct: str = "cpuacct") -> tuple[Path, Path]:
    memory = root / "sys/fs/cgroup/memory" / parent
    cpu = root / "sys/fs/cgroup" / cpuacct / parent
    memory.mkdir(parents=True)
    cpu.mkdir(parents=True)
    return memory, cpu


def test_v1_cgroups_have_max_usage_and_cpuacct_usage(tmp_path: Path) -> None:
    memory, cpu = _v1_cgroup(tmp_path, f"docker/{CONTAINER}")
    (memory / "memory.usage_in_bytes").write_text(f"{40 * MIB}\n")  # current usage is not a peak: not used
    (memory / "memory.max_usage_in_bytes").write_text(f"{96 * MIB}\n")
    (cpu / "cpuacct.usage").write_text("1750000000\n")
    expected = ResourceSample(memory_peak_bytes=96 * MIB, cpu_seconds=1.75)
    assert cgroup_v1_sample(CONTAINER, root=str(tmp_path)) == expected
    assert cgroup_sample(CONTAINER, root=str(tmp_path)) == expected


def test_v1_cgroups_of_the_systemd_driver_with_cpu_and_cpuacct_mounted_together(tmp_path: Path) -> None:
    memory, cpu = _v1_cgroup(tmp_path, f"system.slice/docker-{CONTAINER}.scope", cpuacct="cpu,cpuacct")
    (memory / "memory.max_usage_in_bytes").write_text(f"{7 * MIB}\n")
    (cpu / "cpuacct.usage").write_text("250000000\n")
    assert cgroup_sample(CONTAINER, root=str(tmp_path)) == ResourceSample(memory_peak_bytes=7 * MIB, cpu_seconds=0.25)


def test_unreadable_v1_files_leave_their_figure_unknown(tmp_path: Path) -> None:
    memory, _ = _v1_cgroup(tmp_path, f"docker/{CONTAINER}")
    (memory / "memory.max_usage_in_bytes").write_text("not a number\n")
    assert cgroup_sample(CONTAINER, root=str(tmp_path)) == ResourceSample(memory_peak_bytes=None, cpu_seconds=None)
    assert cgroup_sample("absent", root=str(tmp_path)) is None  # no cgroup of it here: ask the engine


def test_a_v2_cgroup_on_an_older_kernel_has_no_peak(tmp_path: Path) -> None:
    cgroup = tmp_path / "sys/fs/cgroup/docker" / CONTAINER
    cgroup.mkdir(parents=True)
    (cgroup / "memory.current").write_text(f"{50 * MIB}\n")  # current usage is not a peak: not used
    (cgroup / "cpu.stat").write_text("usage_usec 1000000\n")
    assert cgroup_v2_sample(CONTAINER, root=str(tmp_path)) == ResourceSample(memory_peak_bytes=None, cpu_seconds=1.0)
    assert cgroup_v2_sample("absent", root=str(tmp_path)) is None


def test_a_run_keeps_the_highest_figures_of_its_samples() -> None:
    use = ResourceUse()
    for sample in (ResourceSample(10 * MIB, 0.5), ResourceSample(None, 0.9), ResourceSample(30 * MIB, None)):
        use.add(sample)
    assert (use.memory_peak_bytes, use.cpu_seconds, use.samples) == (30 * MIB, 0.9, 3)
    assert ResourceUse().memory_peak_bytes is None  # no sample: unknown
