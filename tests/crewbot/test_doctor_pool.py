"""`crewbot doctor`'s and `crewbot stats`' warm pool lines, from the state file the running bot writes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from crewbot.doctor_pool import check_pool
from runner.lifecycle.pool_status import PoolStats, read_status, status_file, write_status
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import archives_dir
from tests.harness import make_settings

MIB = 1024 * 1024


def stats(paused: str | None = None) -> PoolStats:
    return PoolStats(
        target=2, ready=2, starting=0, hits=9, misses=1, paused=paused, idle_memory_bytes=30 * MIB
    )  # fmt: skip


def test_a_running_pool_is_ok_with_its_figures(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=2)
    settings.data_dir.mkdir(parents=True)
    write_status(status_file(settings.data_dir), stats())
    result = check_pool(settings)
    assert result.status == "ok"
    assert result.detail == "2 of 2 ready, 9 hits, 1 misses (90% hits); idle memory 30 MiB (15 MiB a container)"


def test_a_paused_pool_fails_with_its_reason_and_a_fix(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=2)
    settings.data_dir.mkdir(parents=True)
    write_status(status_file(settings.data_dir), stats(paused="memory: 300 MiB available"))
    result = check_pool(settings)
    assert result.status == "FAIL" and result.detail.endswith("refilling paused: memory: 300 MiB available")
    assert result.fix is not None and "SUBAGENT_WARM_POOL" in result.fix


def test_a_state_no_running_bot_wrote_lately_is_not_taken_for_the_pool(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=2)
    settings.data_dir.mkdir(parents=True)
    path = status_file(settings.data_dir)
    write_status(path, stats())
    body = json.loads(path.read_bytes())
    path.write_text(json.dumps({**body, "written_at": time.time() - 3600}))
    assert check_pool(settings).status == "skip"
    loaded = read_status(path)
    assert loaded is not None and loaded == (stats(), False)


def test_off_and_garbage(tmp_path: Path) -> None:
    assert check_pool(make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=0)).status == "ok"
    bad = tmp_path / "warm-pool.json"
    bad.write_text("{not json")
    assert read_status(bad) is None


def test_a_pool_turned_off_with_chats_archived_is_ok_they_still_sync(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", SUBAGENT_WARM_POOL=0)
    archives = archives_dir(DataPaths(settings.data_dir))
    archives.mkdir(parents=True)
    (archives / "chat_1.tar").write_bytes(b"")
    result = check_pool(settings)
    assert result.status == "ok" and "1 archived chat(s) sync their workspace from its archive" in result.detail
