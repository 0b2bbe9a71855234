"""The container's workspace sync (container/workspace_sync.py) against the host's real run socket and archive
storage, in process: pull into an empty workspace, push back, the quota, a refused or broken pull, and a whole
synced run (`run_main(sync_workspace=True)`). An archive that cannot be unpacked: test_workspace_unreadable.py."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from container.__main__ import EXIT_COMPLETED, run_main
from container.channel import RunChannel
from container.contract import WORKSPACE_SYNC_ENV
from container.paths import ContainerPaths
from container.protocol import RunResult as ReportedResult
from container.task import RunResult
from container.workspace_sync import Pulled, PullState, pull_workspace, push_workspace, sync_enabled
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import BYTES_PER_MB, WorkspaceArchives
from tests.container.test_workspace_tar import tree
from tests.runner.channel.run_api_server import Recorder, serve
from tests.runner.channel.workspace_rig import FOLDER, synced

DONE = RunResult(status="completed", result="the answer")


def make_tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (root / "data.bin").write_bytes(os.urandom(2 * 1024 * 1024 + 5))
    (root / "latest").symlink_to("src/pkg")
    (root / "python").symlink_to("/usr/bin/python3")


async def on_host(archives: WorkspaceArchives, work: Callable[[RunChannel], Awaitable[Any]]) -> Any:
    async def with_channel(sock: Path) -> Any:
        async with RunChannel(sock) as channel:
            return await work(channel)

    return await serve(synced(archives.chat(FOLDER)), with_channel)


@pytest.fixture
def archives(tmp_path: Path) -> WorkspaceArchives:
    return WorkspaceArchives(DataPaths(tmp_path / "data"), lambda: 4)


async def test_a_workspace_goes_to_the_host_and_back_whole(tmp_path: Path, archives: WorkspaceArchives) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    lines: list[str] = []

    async def first_run(channel: RunChannel) -> RunResult:
        assert await pull_workspace(channel, first, lines.append) == Pulled(PullState.RESTORED)  # nothing stored
        assert list(first.iterdir()) == []
        make_tree(first)
        return await push_workspace(channel, first, DONE, lines.append)

    assert await on_host(archives, first_run) == DONE
    assert 2 * 1024 * 1024 < (await archives.usage(FOLDER)).bytes < 3 * 1024 * 1024

    async def next_run(channel: RunChannel) -> Pulled:
        return await pull_workspace(channel, second, lines.append)

    assert await on_host(archives, next_run) == Pulled(PullState.RESTORED)
    assert tree(second) == tree(first)
    assert any("starting with an empty one" in line for line in lines)
    assert any(line.startswith("workspace fetched: 6 entries") for line in lines), lines


async def test_a_workspace_over_the_quota_is_not_kept_and_the_result_says_so(
    tmp_path: Path, archives: WorkspaceArchives
) -> None:
    small = tmp_path / "small"
    small.mkdir()
    (small / "notes.txt").write_text("kept")
    await on_host(archives, lambda channel: push_workspace(channel, small, DONE, print))
    before = (await archives.usage(FOLDER)).bytes
    big = tmp_path / "big"
    big.mkdir()
    (big / "huge.bin").write_bytes(os.urandom(4 * BYTES_PER_MB + 1))

    pushed = await on_host(archives, lambda channel: push_workspace(channel, big, DONE, print))

    assert pushed.status == "completed" and pushed.result.startswith("the answer\n\n[The workspace was not saved (")
    assert "WORKSPACE_QUOTA_MB" in pushed.result and "keeps the one it had before" in pushed.result
    failed = await on_host(
        archives, lambda channel: push_workspace(channel, big, RunResult("failed", error="x"), print)
    )
    assert failed.error is not None and failed.error.startswith("x; The workspace was not saved")
    assert (await archives.usage(FOLDER)).bytes == before


async def test_a_pull_from_a_run_that_does_not_sync_fails_with_the_hosts_reason(tmp_path: Path) -> None:
    async def pull(sock: Path) -> Pulled:
        async with RunChannel(sock) as channel:
            return await pull_workspace(channel, tmp_path, print)

    failure = await serve(Recorder(), pull)
    assert failure.state is PullState.FAILED
    assert "could not be fetched" in failure.text and "not synced" in failure.text


def test_sync_is_on_only_when_the_backend_says_so() -> None:
    assert sync_enabled({WORKSPACE_SYNC_ENV: "1"})
    assert not sync_enabled({}) and not sync_enabled({WORKSPACE_SYNC_ENV: "0"})


# --- a whole synced run ------------------------------------------------------------------------------------


async def synced_run(paths: ContainerPaths, archives: WorkspaceArchives) -> tuple[int, list[ReportedResult]]:
    endpoint = synced(archives.chat(FOLDER))

    async def run(sock: Path) -> int:
        return await run_main(ContainerPaths(sock, paths.workspace_dir), sync_workspace=True)

    exit_code = await serve(endpoint, run)
    return exit_code, endpoint.results


async def test_a_synced_run_pulls_its_workspace_then_pushes_it_before_its_result(
    paths: ContainerPaths, tmp_path: Path, archives: WorkspaceArchives
) -> None:
    stored = tmp_path / "stored"
    stored.mkdir()
    make_tree(stored)
    await on_host(archives, lambda channel: push_workspace(channel, stored, DONE, print))
    size = (await archives.usage(FOLDER)).bytes

    exit_code, results = await synced_run(paths, archives)

    assert exit_code == EXIT_COMPLETED and [r.status for r in results] == ["completed"]
    assert tree(paths.workspace_dir) == tree(stored)  # what the run worked in
    assert (await archives.usage(FOLDER)).bytes == size  # and what it sent back
