"""Workspace usage and clearing: nothing a container plants makes the host follow, open, block or miss."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import runner
from runner.storage.workspace_usage import WorkspaceUsage, clear, measure, measure_async, remove_entry

MIB = 1024 * 1024
BIG = 4 * MIB
WALK_TIMEOUT_SECONDS = 10.0
# Root ignores permission bits through these; without them it meets a chmod 000 as a non-root host would.
DAC_CAPABILITIES = ("dac_override", "dac_read_search")
# Deeper than PATH_MAX (4096) can name with two-character components.
DEEP_LEVELS = 2500


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspaces" / "chat_1"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Host files a container would like the host to count, follow or delete."""
    path = tmp_path / "host"
    path.mkdir()
    (path / "big.bin").write_bytes(b"x" * BIG)
    (path / ".env").write_text("LLM_API_KEY=secret\n")
    return path


def write(path: Path, size: int) -> None:
    path.write_bytes(b"y" * size)


def make_deep_tree(root: Path, levels: int) -> None:
    """A chain of directories deeper than a path can name (built through descriptors, as a container could)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as handle:
            handle.write(b"z" * 1000)
    finally:
        os.close(fd)


@pytest.fixture
def deep_workspace(workspace: Path) -> Iterator[Path]:
    """Cleared afterwards: pytest's own clean-up (shutil.rmtree, recursive) fails on such a tree."""
    make_deep_tree(workspace, DEEP_LEVELS)
    yield workspace
    clear(workspace)


def is_char_device(path: Path) -> bool:
    return path.is_char_device()


def measure_all(path: Path) -> WorkspaceUsage:
    return measure(path, max_entries=1_000_000)


# --- measuring --------------------------------------------------------------------------------------------


def test_counts_real_blocks_of_files_and_directories(workspace: Path) -> None:
    write(workspace / "a.bin", MIB)
    (workspace / "sub").mkdir()
    write(workspace / "sub" / "b.bin", MIB)
    usage = measure_all(workspace)
    assert usage.entries == 3
    assert not usage.truncated
    assert 2 * MIB <= usage.bytes < 2 * MIB + 256 * 1024
    assert not usage.over(3 * MIB)
    assert usage.over(MIB)


def test_symlinks_to_files_and_directories_outside_are_not_counted(workspace: Path, outside: Path) -> None:
    (workspace / "big").symlink_to(outside / "big.bin")
    (workspace / "hostdir").symlink_to(outside, target_is_directory=True)
    (workspace / "root").symlink_to("/")
    usage = measure_all(workspace)
    assert usage.entries == 3
    assert usage.bytes < BIG
    assert not usage.truncated


def test_symlink_loops_end(workspace: Path) -> None:
    (workspace / "a").symlink_to("b")
    (workspace / "b").symlink_to("a")
    (workspace / "self").symlink_to(".")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "up").symlink_to("..")
    usage = measure_all(workspace)
    assert usage.entries == 5
    assert not usage.truncated


def test_a_hardlinked_file_is_counted_once(workspace: Path) -> None:
    write(workspace / "one.bin", MIB)
    for n in range(5):
        os.link(workspace / "one.bin", workspace / f"link{n}.bin")
    usage = measure_all(workspace)
    assert usage.entries == 6
    assert MIB <= usage.bytes < 2 * MIB


def test_sparse_file_counts_its_blocks_not_its_size(workspace: Path) -> None:
    with (workspace / "sparse.bin").open("wb") as handle:
        handle.truncate(10 * 1024 * MIB)  # 10 GiB apparent size
        handle.write(b"data")
    usage = measure_all(workspace)
    assert usage.entries == 1
    assert usage.bytes < MIB


async def test_fifos_sockets_and_devices_do_not_block_the_walk(workspace: Path) -> None:
    os.mkfifo(workspace / "fifo")
    (workspace / "sub").mkdir()
    os.mkfifo(workspace / "sub" / "fifo2")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.fspath(workspace / "sock"))
        if os.geteuid() == 0:
            os.mknod(workspace / "null", 0o600 | 0o020000, os.makedev(1, 3))
        usage = await asyncio.wait_for(measure_async(workspace, max_entries=100), WALK_TIMEOUT_SECONDS)
    assert usage.entries == (5 if os.geteuid() == 0 else 4)
    assert not usage.truncated


def test_entry_cap_stops_the_walk_and_reads_as_over_quota(workspace: Path) -> None:
    for n in range(50):
        (workspace / f"f{n}").touch()
    usage = measure(workspace, max_entries=10)
    assert usage.truncated
    assert usage.entries == 11
    assert usage.over(10**12)
    assert not measure(workspace, max_entries=50).truncated


def test_a_tree_deeper_than_a_path_can_name_reads_as_over_quota(deep_workspace: Path) -> None:
    usage = measure_all(deep_workspace)
    assert usage.truncated
    assert usage.over(10**12)


def test_missing_or_symlinked_root_measures_empty(tmp_path: Path, outside: Path) -> None:
    assert measure_all(tmp_path / "absent") == WorkspaceUsage(0, 0, False)
    (tmp_path / "linked").symlink_to(outside, target_is_directory=True)
    assert measure_all(tmp_path / "linked") == WorkspaceUsage(0, 0, False)


@pytest.fixture
def churn(workspace: Path) -> Iterator[threading.Event]:
    """A container creating and deleting files and directories while the host measures."""
    stop = threading.Event()

    def work() -> None:
        n = 0
        while not stop.is_set():
            d = workspace / f"d{n % 20}"
            try:
                d.mkdir()
                for k in range(10):
                    (d / f"f{k}").touch()
                for k in range(10):
                    (d / f"f{k}").unlink()
                d.rmdir()
            except OSError:
                pass
            n += 1

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    yield stop
    stop.set()
    thread.join()


def test_entries_vanishing_mid_walk_are_tolerated(workspace: Path, churn: threading.Event) -> None:
    for n in range(200):
        (workspace / f"stable{n}").touch()
    for _ in range(200):
        usage = measure_all(workspace)
        assert usage.entries >= 200
        assert not usage.truncated


# --- clearing ----------------------------------------------------------------------------------------------


def test_clear_empties_the_workspace_and_keeps_it(workspace: Path) -> None:
    (workspace / "sub" / "deeper").mkdir(parents=True)
    write(workspace / "sub" / "deeper" / "f.bin", 1000)
    (workspace / ".hidden").touch()
    clear(workspace)
    assert workspace.is_dir()
    assert list(workspace.iterdir()) == []
    clear(workspace)  # an empty workspace stays empty


def test_clear_unlinks_symlinks_and_leaves_their_targets(workspace: Path, outside: Path) -> None:
    (workspace / "big").symlink_to(outside / "big.bin")
    (workspace / "env").symlink_to(outside / ".env")
    (workspace / "hostdir").symlink_to(outside, target_is_directory=True)
    (workspace / "sub").mkdir()
    (workspace / "sub" / "hostdir").symlink_to(outside, target_is_directory=True)
    os.link(outside / ".env", workspace / "hardlink")  # same filesystem under tmp_path
    clear(workspace)
    assert list(workspace.iterdir()) == []
    assert (outside / "big.bin").stat().st_size == BIG
    assert (outside / ".env").read_text() == "LLM_API_KEY=secret\n"


async def test_clear_removes_fifos_sockets_and_devices_without_blocking(workspace: Path) -> None:
    os.mkfifo(workspace / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.fspath(workspace / "sock"))
    if os.geteuid() == 0:
        os.mknod(workspace / "null", 0o600 | 0o020000, os.makedev(1, 3))
    await asyncio.wait_for(asyncio.to_thread(clear, workspace), WALK_TIMEOUT_SECONDS)
    assert os.listdir(workspace) == []
    assert is_char_device(Path("/dev/null"))  # unlinked, not followed


def test_clear_removes_a_tree_deeper_than_a_path_can_name(deep_workspace: Path) -> None:
    clear(deep_workspace)
    assert list(deep_workspace.iterdir()) == []


def test_clear_refuses_a_symlinked_root(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(NotADirectoryError):
        clear(tmp_path / "linked")
    assert (outside / "big.bin").exists()
    clear(tmp_path / "absent")  # nothing there: nothing to do


def test_remove_entry_removes_a_link_not_its_target(tmp_path: Path, outside: Path) -> None:
    parent = tmp_path / "errors"
    parent.mkdir()
    (parent / "link").symlink_to(outside, target_is_directory=True)
    (parent / "tree" / "a").mkdir(parents=True)
    (parent / "tree" / "a" / "up").symlink_to(outside, target_is_directory=True)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert remove_entry(fd, "link")
        assert remove_entry(fd, "tree")
        assert not remove_entry(fd, "absent")
    finally:
        os.close(fd)
    assert list(parent.iterdir()) == []
    assert sorted(p.name for p in outside.iterdir()) == [".env", "big.bin"]


CLEAR_AS_UNPRIVILEGED = """
import os, sys
from pathlib import Path
from runner.storage.workspace_usage import clear, measure
ws = Path(sys.argv[1])
(ws / "locked" / "inner").mkdir(parents=True)
(ws / "locked" / "inner" / "f").write_text("x")
(ws / "readonly").mkdir()
(ws / "readonly" / "f").write_text("x")
os.chmod(ws / "readonly", 0o500)
os.chmod(ws / "locked" / "inner", 0o000)
os.chmod(ws / "locked", 0o000)
assert measure(ws, max_entries=100).truncated, "an unreadable directory must read as over quota"
clear(ws)
assert list(ws.iterdir()) == [], list(ws.iterdir())
"""


def without_permission_override() -> list[str]:
    """Command prefix under which permission bits bind this process (root: drop the DAC capabilities)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to apply")
    caps = ",".join(f"-{cap}" for cap in DAC_CAPABILITIES)
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


def test_clear_removes_directories_a_container_made_unreadable(workspace: Path) -> None:
    """As a non-root host (containers then run as the host's user and may chmod 000 what they make)."""
    result = subprocess.run(
        [*without_permission_override(), sys.executable, "-c", CLEAR_AS_UNPRIVILEGED, os.fspath(workspace)],
        cwd=Path(runner.__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
