"""Reading a container's figures: the engine's stats on cgroup v1 and v2, a v2 cgroup's memory.peak, and
"unknown" (None) wherever a true peak is not reported, never the current usage passed off as a peak."""

from __future__ import annotations

from pathlib import Path

from runner.resource_use import (
    ResourceSample,
    ResourceUse,
    cgroup_v2_sample,
    merge_samples,
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
    assert merge_samples(None, ResourceSample(1, 1.0)) is None  # a cgroup read then would race its removal


def test_a_v2_cgroup_supplies_memory_peak_where_the_engine_has_none(tmp_path: Path) -> None:
    cgroup = tmp_path / "sys/fs/cgroup/system.slice" / f"docker-{CONTAINER}.scope"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.peak").write_text(f"{123 * MIB}\n")
    (cgroup / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    from_cgroup = cgroup_v2_sample(CONTAINER, root=str(tmp_path))
    assert from_cgroup == ResourceSample(memory_peak_bytes=123 * MIB, cpu_seconds=2.5)
    merged = merge_samples(ResourceSample(None, 2.4), from_cgroup)
    assert merged == ResourceSample(memory_peak_bytes=123 * MIB, cpu_seconds=2.4)


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
