"""Two synced runs of one chat at once (container/workspace_rebase.py, review N2), against the host's real run
sockets and archive storage, in process: the later push is refused as stale and puts its changes on the earlier
one's, so both runs' files are kept; per file the later run wins; a run that keeps losing the race says so in its
result instead of dropping its files silently."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from container import workspace_sync
from container.channel import ChannelRefused, RunChannel
from container.contract import EMPTY_VERSION, WORKSPACE_STALE_STATUS
from container.task import RunResult
from container.workspace_rebase import Changes, changes_since, manifest, take_newer
from container.workspace_stream import DownloadCut, StreamBody
from container.workspace_sync import MAX_REBASES, Pulled, PullState, pull_workspace, push_workspace
from container.workspace_tar import Skips
from core.settings import MAX_SUBAGENTS_CEILING
from runner.channel.workspace_desk import MAX_PULLS_PER_RUN, MAX_PUSHES_PER_RUN
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import WorkspaceArchives
from tests.container.test_workspace_sync import DONE, on_host

STORED = {
    "keep.txt": "untouched by both",
    "both.txt": "before",
    "a_deletes.txt": "A deletes this",
    "b_deletes.txt": "B deletes this",
    "old/x.txt": "A deletes this folder",
}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def texts(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


async def test_two_runs_of_a_chat_at_once_both_keep_their_files_and_the_later_wins_a_file_both_changed(
    tmp_path: Path,
) -> None:
    archives = WorkspaceArchives(DataPaths(tmp_path / "data"), lambda: 4)
    seed = tmp_path / "seed"
    seed.mkdir()
    write(seed, STORED)
    await on_host(archives, lambda channel: push_workspace(channel, seed, DONE, print))
    a_dir, b_dir, after = tmp_path / "a", tmp_path / "b", tmp_path / "after"
    for folder in (a_dir, b_dir, after):
        folder.mkdir()
    both_pulled, a_pushed = asyncio.Barrier(2), asyncio.Event()
    lines: list[str] = []

    async def run_a(channel: RunChannel) -> RunResult:
        pulled = await pull_workspace(channel, a_dir, print)
        await both_pulled.wait()
        write(a_dir, {"a.txt": "A's", "both.txt": "A's edit", "a_new/deep.txt": "A's folder"})
        (a_dir / "a_deletes.txt").unlink()
        (a_dir / "old" / "x.txt").unlink()
        (a_dir / "old").rmdir()
        result = await push_workspace(channel, a_dir, DONE, print, pulled)
        a_pushed.set()
        return result

    async def run_b(channel: RunChannel) -> RunResult:
        pulled = await pull_workspace(channel, b_dir, print)
        await both_pulled.wait()
        write(b_dir, {"b.txt": "B's", "both.txt": "B's edit, saved last"})
        (b_dir / "b_deletes.txt").unlink()
        await a_pushed.wait()
        return await push_workspace(channel, b_dir, DONE, lines.append, pulled)

    a, b = await asyncio.gather(on_host(archives, run_a), on_host(archives, run_b))

    assert a == DONE and b == DONE  # neither result carries a note: both were saved
    assert any("another run of this chat saved the workspace" in line for line in lines), lines
    await on_host(archives, lambda channel: pull_workspace(channel, after, print))
    assert texts(after) == {
        "a.txt": "A's",
        "a_new/deep.txt": "A's folder",
        "b.txt": "B's",
        "both.txt": "B's edit, saved last",
        "keep.txt": "untouched by both",
    }
    assert not (after / "old").exists()  # A removed the folder, B left it alone: it goes


async def test_a_file_the_run_left_alone_is_taken_from_the_newer_and_one_it_deleted_stays_deleted(
    tmp_path: Path,
) -> None:
    root = tmp_path / "w"
    root.mkdir()
    write(root, {"same.txt": "base", "edited.txt": "base", "gone.txt": "base"})
    pulled = manifest(root)
    (root / "edited.txt").write_text("the run's")
    (root / "gone.txt").unlink()
    (root / "same.txt").chmod(0o600)  # a mode change is a change too (its ctime)
    changes = changes_since(root, pulled)
    assert changes.own == {"edited.txt", "gone.txt", "same.txt"} and changes.base == set()
    write(root, {"other.txt": "x"})
    (root / "other.txt").unlink()
    assert changes_since(root, manifest(root)).own == frozenset()  # nothing since the manifest


class AlwaysStale:
    """A host where another run of the chat saves between each fetch and push of this one."""

    def __init__(self) -> None:
        self.pushes = 0

    async def send_workspace(self, body: Any, length: int, base: str | None = None) -> str:
        self.pushes += 1
        assert base == EMPTY_VERSION
        raise ChannelRefused("stale: another run saved", WORKSPACE_STALE_STATUS)

    async def fetch_workspace(self, unpack: Any) -> tuple[str, None]:
        return EMPTY_VERSION, None


@pytest.fixture
def no_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_sync, "REBASE_BACKOFF_SECONDS", 0.0)


class StaleTimes(AlwaysStale):
    """A host where other runs of the chat save `times` times in turn before this one's push is kept."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times

    async def send_workspace(self, body: Any, length: int, base: str | None = None) -> str:
        if self.pushes < self.times:
            return await super().send_workspace(body, length, base)
        self.pushes += 1
        return "kept"


async def test_a_run_of_a_chat_with_many_runs_at_once_is_saved_after_as_many_rebases(
    tmp_path: Path, no_back_off: None
) -> None:
    """Review L2: MAX_REBASES was 3, but up to MAX_SUBAGENTS_PER_CHAT (at most its ceiling) runs of a chat can
    save one after the other while this one rebases: each makes it stale once, and it must still be saved."""
    assert MAX_REBASES >= MAX_SUBAGENTS_CEILING - 1
    assert min(MAX_PUSHES_PER_RUN, MAX_PULLS_PER_RUN) > MAX_REBASES + 1  # the host lets it pull and push as often
    (tmp_path / "mine.txt").write_text("the run's work")
    host = StaleTimes(MAX_SUBAGENTS_CEILING - 1)
    pulled = Pulled(PullState.RESTORED, base=EMPTY_VERSION, pulled={})

    assert await push_workspace(cast(RunChannel, host), tmp_path, DONE, print, pulled) == DONE
    assert host.pushes == MAX_SUBAGENTS_CEILING


async def test_a_run_that_keeps_losing_the_race_says_its_workspace_was_not_saved(
    tmp_path: Path, no_back_off: None
) -> None:
    (tmp_path / "mine.txt").write_text("the run's work")
    host = AlwaysStale()
    pulled = Pulled(PullState.RESTORED, base=EMPTY_VERSION, pulled={})

    result = await push_workspace(cast(RunChannel, host), tmp_path, DONE, print, pulled)

    assert host.pushes == MAX_REBASES + 1
    assert result.result.startswith("the answer\n\n[The workspace was not saved: other runs of this chat")
    assert (tmp_path / "mine.txt").read_text() == "the run's work"  # its scratch as it was: nothing dropped


def archive(entries: list[tuple[str, bytes, str]]) -> bytes:
    """A tar stream of (name, kind, link target or file text), as another run of the chat (hostile) may push."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, text in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            data = b""
            if kind == tarfile.SYMTYPE:
                info.linkname = text
            elif kind == tarfile.REGTYPE:
                data = text.encode()
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def take(root: Path, data: bytes, changes: Changes) -> None:
    take_newer(StreamBody(io.BytesIO(data), len(data)), root, Skips(), changes)


async def test_a_hostile_newer_archive_never_leads_the_rebase_outside_the_workspace(tmp_path: Path) -> None:
    root, outside = tmp_path / "w", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "x.txt").write_text("the host's, or another folder's")
    (outside / "mine.txt").write_text("not the run's to overwrite")
    write(root, {"dir/x.txt": "base", "dir/mine.txt": "base", "plain.txt": "base"})
    pulled = manifest(root)
    (root / "dir" / "mine.txt").write_text("the run's edit")
    changes = changes_since(root, pulled)
    newer = archive(
        [
            ("dir", tarfile.SYMTYPE, str(outside)),  # a link where the base had a folder
            ("dir/mine.txt", tarfile.REGTYPE, "written through the link?"),
            ("plain.txt", tarfile.SYMTYPE, str(outside / "x.txt")),  # a link in place of a file the run left alone
        ]
    )

    take(root, newer, changes)

    assert (outside / "x.txt").read_text() == "the host's, or another folder's"  # nothing removed or written there
    assert (outside / "mine.txt").read_text() == "not the run's to overwrite"
    assert (root / "dir").is_dir() and not (root / "dir").is_symlink()  # the run's folder stays a folder
    assert (root / "dir" / "mine.txt").read_text() == "the run's edit"
    assert not (root / "dir" / "x.txt").exists()  # gone from the newer archive, left alone by the run
    assert os.readlink(root / "plain.txt") == str(outside / "x.txt")  # kept as a link, never followed


async def test_a_folder_the_other_run_replaced_with_a_file_is_kept_as_its_file(tmp_path: Path) -> None:
    """Review finding: the newer archive is unpacked before what it no longer has is removed, so a folder the run
    left alone blocks the other run's file of the same name; the folder is then removed, and neither is kept."""
    root = tmp_path / "w"
    root.mkdir()
    write(root, {"notes/a.txt": "base", "mine.txt": "base"})
    pulled = manifest(root)
    (root / "mine.txt").write_text("the run's edit")
    changes = changes_since(root, pulled)
    newer = archive([("notes", tarfile.REGTYPE, "the other run made notes a file"), ("mine.txt", tarfile.REGTYPE, "x")])

    take(root, newer, changes)

    assert (root / "mine.txt").read_text() == "the run's edit"
    assert (root / "notes").is_file()  # fails: `notes` is gone altogether
    assert (root / "notes").read_text() == "the other run made notes a file"


async def test_a_file_the_other_run_replaced_with_a_folder_is_kept_as_its_folder(tmp_path: Path) -> None:
    """Review finding: the run's untouched old file `notes` blocks the other run's folder `notes/` and its files,
    which are skipped (into a Skips nobody reads), and the stale file is pushed: the other run's files are lost."""
    root = tmp_path / "w"
    root.mkdir()
    write(root, {"notes": "base", "mine.txt": "base"})
    pulled = manifest(root)
    (root / "mine.txt").write_text("the run's edit")
    changes = changes_since(root, pulled)
    newer = archive([("notes", tarfile.DIRTYPE, ""), ("notes/a.txt", tarfile.REGTYPE, "the other run's file")])

    take(root, newer, changes)

    assert (root / "mine.txt").read_text() == "the run's edit"
    assert (root / "notes" / "a.txt").read_text() == "the other run's file"  # fails: `notes` is still the old file


async def a_turns_notes_into_a_file(
    tmp_path: Path, base: dict[str, str], b_files: dict[str, str], b_log: Callable[[str], None]
) -> tuple[WorkspaceArchives, RunResult, RunResult]:
    """Two runs on the host's real socket and archive, both pulled `base`: A turns the folder `notes` into a file
    and saves first; B writes `b_files` meanwhile and saves after A, stale (its log lines to `b_log`)."""
    archives = WorkspaceArchives(DataPaths(tmp_path / "data"), lambda: 4)
    seed = tmp_path / "seed"
    seed.mkdir()
    write(seed, base)
    await on_host(archives, lambda channel: push_workspace(channel, seed, DONE, print))
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    both_pulled, a_pushed = asyncio.Barrier(2), asyncio.Event()

    async def run_a(channel: RunChannel) -> RunResult:
        pulled = await pull_workspace(channel, a_dir, print)
        await both_pulled.wait()
        (a_dir / "notes" / "a.txt").unlink()
        (a_dir / "notes").rmdir()
        (a_dir / "notes").write_text("A's notes, now one file")
        result = await push_workspace(channel, a_dir, DONE, print, pulled)
        a_pushed.set()
        return result

    async def run_b(channel: RunChannel) -> RunResult:
        pulled = await pull_workspace(channel, b_dir, print)
        await both_pulled.wait()
        write(b_dir, b_files)
        await a_pushed.wait()
        return await push_workspace(channel, b_dir, DONE, b_log, pulled)

    a, b = await asyncio.gather(on_host(archives, run_a), on_host(archives, run_b))
    return archives, a, b


async def test_two_runs_one_turning_a_folder_into_a_file_lose_nothing_silently(tmp_path: Path) -> None:
    """Review M1, end to end: B left `notes/` alone, so after A turned it into a file and saved, B's rebase gives
    way to A's file (it used to drop both the file and the folder, and say nothing)."""
    archives, a, b = await a_turns_notes_into_a_file(
        tmp_path, {"notes/a.txt": "base", "shared.txt": "base"}, {"b.txt": "B's"}, print
    )

    after = tmp_path / "after"
    after.mkdir()
    await on_host(archives, lambda channel: pull_workspace(channel, after, print))
    assert a == DONE and b == DONE, (a, b)
    assert texts(after) == {"notes": "A's notes, now one file", "shared.txt": "base", "b.txt": "B's"}, texts(after)


async def test_a_download_cut_during_a_rebase_leaves_nothing_of_its_first_attempt(tmp_path: Path) -> None:
    """Review L4: the channel retries a cut download from the start with whatever archive the host has then; what
    the cut attempt placed, and the newer archive no longer has, must not be pushed as if the run had kept it."""
    root = tmp_path / "w"
    root.mkdir()
    write(root, {"kept.txt": "base", "mine.txt": "base"})
    pulled = manifest(root)
    (root / "mine.txt").write_text("the run's edit")
    changes = changes_since(root, pulled)
    first = archive([("early.txt", tarfile.REGTYPE, "placed before the cut"), ("big.txt", tarfile.REGTYPE, "x" * 9000)])
    with pytest.raises(DownloadCut):
        take_newer(StreamBody(io.BytesIO(first[:4096]), len(first)), root, Skips(), changes)
    assert (root / "early.txt").exists()  # the cut attempt got this far

    take(root, archive([("kept.txt", tarfile.REGTYPE, "newer")]), changes)

    assert texts(root) == {"kept.txt": "newer", "mine.txt": "the run's edit"}


async def test_a_link_the_other_run_replaced_with_a_folder_is_kept_as_its_folder(tmp_path: Path) -> None:
    """Review M1: the run's untouched link `docs` gives way (removed, never followed) to the other run's folder."""
    root, outside = tmp_path / "w", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "a.txt").write_text("not the workspace's")
    (root / "docs").symlink_to(outside)
    pulled = manifest(root)
    changes = changes_since(root, pulled)

    take(root, archive([("docs", tarfile.DIRTYPE, ""), ("docs/a.txt", tarfile.REGTYPE, "the other run's")]), changes)

    assert not (root / "docs").is_symlink() and (root / "docs" / "a.txt").read_text() == "the other run's"
    assert (outside / "a.txt").read_text() == "not the workspace's"


async def test_an_entry_of_the_newer_workspace_the_rebase_cannot_place_is_noted_in_the_result(tmp_path: Path) -> None:
    """Review L1: A turns the folder `notes` into a file and saves; B added a file in `notes/`, so A's file cannot
    be placed under B's changes: B's push leaves it out, and B's log and result say so instead of nothing."""
    lines: list[str] = []
    _, a, b = await a_turns_notes_into_a_file(tmp_path, {"notes/a.txt": "base"}, {"notes/b.txt": "B's"}, lines.append)

    assert a == DONE
    assert b.result.startswith("the answer\n\n[Note: 1 entries of the chat's workspace"), b.result
    assert "'notes'" in b.result
    assert any("1 entries of the newer workspace not taken: 'notes'" in line for line in lines), lines
    assert texts(tmp_path / "b") == {"notes/b.txt": "B's"}
