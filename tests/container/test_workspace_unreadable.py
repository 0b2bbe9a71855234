"""A chat's stored workspace that cannot be unpacked (container/workspace_sync.py) against the host's real run socket
and archive storage, in process: the host sets it aside for an admin, the run goes on in an emptied workspace with a
note at the head of its task, the chat's next pull finds none, and the run's push stores the chat's new workspace. A
pull that fails for any other reason, or a report the host refuses, still stops the run before its task."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from container import workspace_sync
from container.__main__ import EXIT_COMPLETED, EXIT_FAILED, run_main
from container.channel import RunChannel
from container.paths import ContainerPaths
from container.protocol import RunResult as ReportedResult
from container.task import Task
from container.workspace_stream import MAX_MEMBER_HEADER_BYTES
from container.workspace_sync import Pulled, PullState, pull_workspace
from runner.channel.workspace_desk import ArchiveIdentity, ArchiveStore, AsideOutcome
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import UNREADABLE_DIR_NAME, ChatArchive, WorkspaceArchives, archives_dir
from tests.container.test_workspace_sync import on_host
from tests.runner.channel.run_api_server import serve
from tests.runner.channel.workspace_rig import FOLDER, SyncedRecorder, synced


def half_good_archive() -> bytes:
    """A file that unpacks, then a member whose header is past the bound: the pull fails part-way."""
    first = tarfile.TarInfo("placed-first.txt")
    first.size = 5
    huge = tarfile.TarInfo("n" * (MAX_MEMBER_HEADER_BYTES + 1))
    parts = [first.tobuf(tarfile.PAX_FORMAT), b"hello" + bytes(507), huge.tobuf(tarfile.PAX_FORMAT), bytes(1024)]
    return b"".join(parts)


async def store(archive: ChatArchive, data: bytes) -> None:
    upload = await archive.begin()
    await upload.write(data)
    await upload.commit()


async def stored(archive: ChatArchive) -> bytes | None:
    reader = await archive.open()
    if reader is None:
        return None
    data = await reader.read(reader.size_bytes + 1)
    await reader.close()
    return data


def kept_aside(data_dir: Path) -> list[bytes]:
    aside = archives_dir(DataPaths(data_dir)) / UNREADABLE_DIR_NAME
    return [path.read_bytes() for path in sorted(aside.glob(f"{FOLDER}.*.tar"))]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def archives(data_dir: Path) -> WorkspaceArchives:
    return WorkspaceArchives(DataPaths(data_dir), lambda: 4)


@pytest.mark.parametrize("garbage", [b"not a tar" * 1000, half_good_archive()], ids=["no-tar", "half-good"])
async def test_an_unreadable_archive_is_set_aside_and_the_run_starts_empty(
    tmp_path: Path, data_dir: Path, archives: WorkspaceArchives, garbage: bytes
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    await store(archives.chat(FOLDER), garbage)
    lines: list[str] = []

    pulled = await on_host(archives, lambda channel: pull_workspace(channel, workspace, lines.append))

    assert pulled.state is PullState.SET_ASIDE, pulled
    assert pulled.text.startswith("Note: the chat's stored workspace could not be unpacked (")
    assert "this run starts with an empty workspace" in pulled.text and "kept aside for an admin" in pulled.text
    assert list(workspace.iterdir()) == []  # what the failed unpack placed is gone
    assert await stored(archives.chat(FOLDER)) is None and kept_aside(data_dir) == [garbage]
    assert any("could not be unpacked" in line for line in lines)

    again = await on_host(archives, lambda channel: pull_workspace(channel, workspace, lines.append))
    assert again == Pulled(PullState.RESTORED) and "starting with an empty one" in lines[-1]


async def test_a_reason_in_any_characters_still_reaches_the_host(
    tmp_path: Path, data_dir: Path, archives: WorkspaceArchives, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reason may hold the archive's own names: emoji, undecodable bytes, control characters, of any length.
    def refuse(*args: object) -> int:
        raise tarfile.ReadError("名前 \udcff \x00\n" + "🎉" * 600)

    monkeypatch.setattr(workspace_sync, "unpack", refuse)
    await store(archives.chat(FOLDER), b"whatever")
    workspace = tmp_path / "workspace"
    workspace.mkdir()

    pulled = await on_host(archives, lambda channel: pull_workspace(channel, workspace, print))

    assert pulled.state is PullState.SET_ASIDE and pulled.text.isascii() and pulled.text.isprintable()
    assert "\\u540d\\u524d \\udcff ??" in pulled.text and len(kept_aside(data_dir)) == 1


def test_the_note_heads_the_task_only_when_the_workspace_was_set_aside() -> None:
    task = Task(run_id="run-aaaaaa", task="count the files", label="count")
    assert Pulled(PullState.RESTORED).noted(task) == task
    noted = Pulled(PullState.SET_ASIDE, "Note: gone.").noted(task)
    assert noted.task == "Note: gone.\n\ncount the files" and noted.label == "count"


class ReplacedMeanwhile(ChatArchive):
    """Another run of the chat pushes between this run's pull and its report."""

    async def set_aside(self, served: ArchiveIdentity, reason: str) -> AsideOutcome:
        await store(self, b"a newer push")
        return await super().set_aside(served, reason)


async def test_a_run_whose_archive_was_replaced_meanwhile_stops_and_sets_nothing_aside(
    tmp_path: Path, data_dir: Path, archives: WorkspaceArchives
) -> None:
    await store(archives.chat(FOLDER), b"not a tar" * 100)
    replaced = ReplacedMeanwhile(archives_dir(DataPaths(data_dir)), FOLDER, lambda: 4)

    workspace = tmp_path / "workspace"
    workspace.mkdir()

    async def pull(sock: Path) -> Pulled:
        async with RunChannel(sock) as channel:
            return await pull_workspace(channel, workspace, print)

    pulled = await serve(synced(replaced), pull)

    assert pulled.state is PullState.FAILED
    assert "was not set aside" in pulled.text and "replaced by another run's" in pulled.text
    assert await stored(archives.chat(FOLDER)) == b"a newer push" and kept_aside(data_dir) == []


# --- a whole synced run ------------------------------------------------------------------------------------


async def synced_run(paths: ContainerPaths, store: ArchiveStore, cancelled: bool = False) -> tuple[int, SyncedRecorder]:
    endpoint = synced(store)
    endpoint.cancelled = cancelled

    async def run(sock: Path) -> int:
        return await run_main(ContainerPaths(sock, paths.workspace_dir), sync_workspace=True)

    return await serve(endpoint, run), endpoint


async def test_a_synced_run_over_an_unreadable_archive_works_from_empty_and_saves_its_workspace(
    paths: ContainerPaths, data_dir: Path, archives: WorkspaceArchives
) -> None:
    await store(archives.chat(FOLDER), b"not a tar" * 1000)

    exit_code, endpoint = await synced_run(paths, archives.chat(FOLDER))

    assert exit_code == EXIT_COMPLETED and [r.status for r in endpoint.results] == ["completed"]
    prompt = endpoint.steps[0].decode()  # the model saw the note at the head of its task
    assert "Note: the chat's stored workspace could not be unpacked (ReadError" in prompt
    assert kept_aside(data_dir) == [b"not a tar" * 1000]
    new = await stored(archives.chat(FOLDER))  # the run's push: an archive of its (empty) workspace
    assert new is not None and len(new) % tarfile.RECORDSIZE == 0 and not any(new)
    assert endpoint.invalid_reasons == []


async def test_a_synced_run_whose_pull_is_refused_for_another_reason_stops_and_keeps_the_archive(
    paths: ContainerPaths, data_dir: Path, archives: WorkspaceArchives
) -> None:
    await store(archives.chat(FOLDER), b"not a tar" * 1000)

    exit_code, endpoint = await synced_run(paths, archives.chat(FOLDER), cancelled=True)

    assert exit_code == EXIT_FAILED
    results: list[ReportedResult] = endpoint.results
    assert [r.status for r in results] == ["failed"] and "could not be fetched" in (results[0].error or "")
    assert await stored(archives.chat(FOLDER)) == b"not a tar" * 1000 and kept_aside(data_dir) == []
