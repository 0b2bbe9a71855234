"""A chat's workspace placement on the real file system: archived chats sync whatever the pool's setting, a chat
whose folder holds files keeps it (never emptied, never pooled), one chat never has two workspaces at once, and
the quota is measured where the run writes (a synced run: its own scratch folder); `/workspace clear` holds the
chat's placement lock throughout, and on Kubernetes leaves the chat's host folder alone."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import cast

import pytest

from core.store.chats import ChatStore
from runner.runs.live_runs import LiveRuns
from runner.storage import workspaces as workspaces_module
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import WorkspaceArchives
from runner.storage.workspace_placement import WorkspacePlacements
from runner.storage.workspace_usage import clear
from runner.storage.workspaces import Workspaces
from tests.runner.storage.test_workspace_set_aside import NoRuns, OneChat

FOLDER = "chat_1"
MIB = 1024 * 1024
WAIT_SECONDS = 30.0  # a thread waiting for the test's next step: never reached unless something hangs


def placements(tmp_path: Path, *, kube: bool = False) -> WorkspacePlacements:
    paths = DataPaths(tmp_path)
    return WorkspacePlacements(paths, WorkspaceArchives(paths, lambda: 10), always_synced=kube)


def archived(tmp_path: Path) -> None:
    archive = WorkspaceArchives(DataPaths(tmp_path), lambda: 10).chat(FOLDER).path
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"a pushed workspace")


def with_files(tmp_path: Path) -> Path:
    folder = DataPaths(tmp_path).workspace(FOLDER)
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("from before")
    return folder


async def test_an_archived_chat_is_synced_with_the_pool_on_or_off(tmp_path: Path) -> None:
    archived(tmp_path)
    places = placements(tmp_path)
    off = await places.place("run-off", FOLDER, pool_on=False)
    on = await places.place("run-on", FOLDER, pool_on=True)
    assert off.synced and on.synced
    assert off.folder == DataPaths(tmp_path).run_scratch("run-off") and off.folder.is_dir()


async def test_a_chat_whose_folder_holds_files_keeps_it_with_the_pool_on_and_it_is_never_emptied(
    tmp_path: Path,
) -> None:
    folder = with_files(tmp_path)
    places = placements(tmp_path)
    for run_id in ("a", "b"):  # two runs of one chat at once, the pool on
        place = await places.place(run_id, FOLDER, pool_on=True)
        assert not place.synced and place.folder == folder
    archived(tmp_path)  # as if some push landed meanwhile: the folder runs' workspace stays theirs
    places.release("a")
    assert (await places.place("c", FOLDER, pool_on=True)).folder == folder  # "b" still lasts: the same way
    places.release("b")
    places.release("c")
    assert (folder / "notes.txt").read_text() == "from before"


async def test_an_empty_chat_is_synced_only_with_the_pool_on_and_a_run_follows_the_chats_live_runs(
    tmp_path: Path,
) -> None:
    places = placements(tmp_path)
    first = await places.place("folder-run", FOLDER, pool_on=False)
    assert not first.synced
    follows = await places.place("pool-now-on", FOLDER, pool_on=True)
    assert not follows.synced  # one chat, one workspace: the live folder run's
    places.release("folder-run")
    places.release("pool-now-on")
    assert (await places.place("alone", FOLDER, pool_on=True)).synced
    assert (await places.place("beside", FOLDER, pool_on=False)).synced  # follows the live synced run


async def test_a_leftover_scratch_folder_is_never_mounted_again(tmp_path: Path) -> None:
    archived(tmp_path)
    scratch = DataPaths(tmp_path).run_scratch("requeued")
    scratch.mkdir(parents=True)
    (scratch / "from-the-crashed-attempt").write_text("x")
    place = await placements(tmp_path).place("requeued", FOLDER, pool_on=True)
    assert place.folder == scratch and list(scratch.iterdir()) == []


async def test_kubernetes_syncs_every_run_and_never_touches_the_chats_folder(tmp_path: Path) -> None:
    folder = with_files(tmp_path)
    places = placements(tmp_path, kube=True)
    place = await places.place("pod-run", FOLDER, pool_on=True)
    assert place.synced and not place.on_host
    assert not DataPaths(tmp_path).run_scratch("pod-run").exists()
    assert (folder / "notes.txt").read_text() == "from before"


async def test_a_synced_run_is_measured_in_its_scratch_never_in_the_chats_folder(tmp_path: Path) -> None:
    places = placements(tmp_path)
    folder = DataPaths(tmp_path).workspace(FOLDER)
    workspaces = Workspaces(
        DataPaths(tmp_path), cast(ChatStore, OneChat(FOLDER)), cast(LiveRuns, NoRuns()), 1, placements=places
    )
    synced = await places.place("synced", FOLDER, pool_on=True)
    assert synced.synced
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "big").write_bytes(b"x" * 2 * MIB)  # a folder that run cannot see
    assert await workspaces.over_quota(FOLDER, "synced") is None
    (synced.folder / "big").write_bytes(b"x" * 2 * MIB)
    assert await workspaces.over_quota(FOLDER, "synced") is not None
    assert workspaces.served("synced", FOLDER) is not None
    places.release("synced")
    mounted = await places.place("mounted", FOLDER, pool_on=True)  # the folder holds files now: mounted
    assert not mounted.synced and workspaces.served("mounted", FOLDER) is None
    assert await workspaces.over_quota(FOLDER, "mounted") is not None
    assert "2.0 MB" in await workspaces.describe(1)  # no archive: the folder is the chat's workspace


async def test_each_synced_run_is_measured_alone_against_the_quota(tmp_path: Path) -> None:
    """Each synced run unpacks the whole archive into its own scratch and pushes only that: two runs of a chat
    whose archive is over half the quota are both within it (review N1), and each is stopped on its own."""
    places = placements(tmp_path)
    workspaces = Workspaces(
        DataPaths(tmp_path), cast(ChatStore, OneChat(FOLDER)), cast(LiveRuns, NoRuns()), 1, placements=places
    )
    first = await places.place("first", FOLDER, pool_on=True)
    second = await places.place("second", FOLDER, pool_on=True)
    (first.folder / "archive").write_bytes(b"x" * (MIB * 3 // 4))
    (second.folder / "archive").write_bytes(b"x" * (MIB * 3 // 4))  # each under 1 MB, together over
    assert await workspaces.over_quota(FOLDER, "first") is None
    assert await workspaces.over_quota(FOLDER, "second") is None
    (second.folder / "more").write_bytes(b"x" * (MIB // 2))  # this run alone goes over
    assert await workspaces.over_quota(FOLDER, "second") is not None
    assert await workspaces.over_quota(FOLDER, "first") is None


def workspaces_of(tmp_path: Path, places: WorkspacePlacements) -> Workspaces:
    return Workspaces(
        DataPaths(tmp_path), cast(ChatStore, OneChat(FOLDER)), cast(LiveRuns, NoRuns()), 1, placements=places
    )


async def test_a_run_placed_while_a_clear_runs_waits_until_the_whole_clear_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review N4: the clear empties the archive, then the folder; a run placed between the two steps used to find
    the folder (with files: mounted) and then see it emptied under it."""
    folder = with_files(tmp_path)
    archived(tmp_path)
    places = placements(tmp_path)
    workspaces = workspaces_of(tmp_path, places)
    in_folder_step, go_on = threading.Event(), threading.Event()
    placed_meanwhile: list[bool] = []

    def slow_clear(path: Path) -> None:
        in_folder_step.set()
        go_on.wait(WAIT_SECONDS)
        placed_meanwhile.append(places.of("new") is not None)
        clear(path)

    monkeypatch.setattr(workspaces_module, "clear", slow_clear)
    clearing = asyncio.create_task(workspaces.clear(1))
    await asyncio.to_thread(in_folder_step.wait, WAIT_SECONDS)
    placing = asyncio.create_task(places.place("new", FOLDER, pool_on=False))
    await asyncio.wait({placing}, timeout=1.0)  # without the lock it is placed in this second
    go_on.set()
    assert await clearing == "Cleared this chat's workspace."
    place = await placing
    assert placed_meanwhile == [False]
    assert not place.synced and place.folder == folder and list(folder.iterdir()) == []  # decided after the clear


async def test_a_clear_is_refused_while_a_run_of_the_chat_is_placed(tmp_path: Path) -> None:
    folder = with_files(tmp_path)
    places = placements(tmp_path)
    await places.place("lasting", FOLDER, pool_on=False)  # placed, not (yet) counted live by the manager
    assert "/cancel all first" in await workspaces_of(tmp_path, places).clear(1)
    assert (folder / "notes.txt").exists()
    places.release("lasting")
    assert await workspaces_of(tmp_path, places).clear(1) == "Cleared this chat's workspace."
    assert list(folder.iterdir()) == []


async def test_a_clear_on_kubernetes_empties_the_archive_and_never_touches_the_chats_host_folder(
    tmp_path: Path,
) -> None:
    """Review N6: the docs say a chat's folder on the host is never touched on Kubernetes; clear kept to that."""
    folder = with_files(tmp_path)
    archived(tmp_path)
    places = placements(tmp_path, kube=True)
    assert await workspaces_of(tmp_path, places).clear(1) == "Cleared this chat's workspace."
    assert not await places.archived(FOLDER)
    assert (folder / "notes.txt").read_text() == "from before"
