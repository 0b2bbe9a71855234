"""A chat's archive that a run could not unpack, set aside (runner/storage/workspace_archive.py): only the very file
the run was served, moved whole out of the way of the chat's next run, at most MAX_KEPT_ASIDE kept per chat, and
gone with `/workspace clear` (runner/storage/workspaces.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from core.store.chats import ChatStore
from runner.channel.workspace_desk import ArchiveIdentity, AsideOutcome
from runner.runs.live_runs import LiveRuns
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import MAX_KEPT_ASIDE, UNREADABLE_DIR_NAME, ChatArchive, archives_dir
from runner.storage.workspaces import Workspaces
from tests.runner.storage.test_workspace_archive import FOLDER, archives, stored, upload


async def served(archive: ChatArchive) -> ArchiveIdentity:
    """The identity a run's GET would have been served."""
    reader = await archive.open()
    assert reader is not None
    await reader.close()
    return reader.identity


def kept(tmp_path: Path, folder: str = FOLDER) -> list[bytes]:
    aside = archives_dir(DataPaths(tmp_path)) / UNREADABLE_DIR_NAME
    return [path.read_bytes() for path in sorted(aside.glob(f"{folder}.*.tar"))]


async def test_the_archive_a_run_was_served_is_moved_aside_whole(tmp_path: Path) -> None:
    archive = archives(tmp_path).chat(FOLDER)
    await upload(archive, b"garbage" * 1000)

    assert await archive.set_aside(await served(archive), "ReadError: invalid header") is AsideOutcome.SET_ASIDE

    assert await stored(archive) is None  # the chat's next run starts empty
    assert kept(tmp_path) == [b"garbage" * 1000]
    assert await archive.kept_aside() == 1
    assert (await archives(tmp_path).usage(FOLDER)).bytes == 0  # what is aside counts against no quota


async def test_an_archive_replaced_since_is_not_moved(tmp_path: Path) -> None:
    archive = archives(tmp_path).chat(FOLDER)
    await upload(archive, b"garbage")
    identity = await served(archive)
    await upload(archive, b"a newer push, of the same size!"[:7])  # same size, another file

    assert await archive.set_aside(identity, "ReadError") is AsideOutcome.REPLACED

    assert await stored(archive) == b"a newer" and kept(tmp_path) == []


async def test_an_archive_gone_since_is_nothing_to_move(tmp_path: Path) -> None:
    archive = archives(tmp_path).chat(FOLDER)
    await upload(archive, b"garbage")
    identity = await served(archive)
    assert await archive.set_aside(identity, "first") is AsideOutcome.SET_ASIDE
    assert await archive.set_aside(identity, "again") is AsideOutcome.GONE  # a repeat, or another run's report
    assert len(kept(tmp_path)) == 1
    never = archives(tmp_path / "elsewhere").chat(FOLDER)  # not even the archives folder exists
    assert await never.set_aside(identity, "x") is AsideOutcome.GONE


async def test_only_the_newest_few_are_kept_per_chat(tmp_path: Path) -> None:
    store = archives(tmp_path)
    archive, other = store.chat(FOLDER), store.chat(f"{FOLDER}0")  # a name that starts with the other's
    await upload(other, b"the other chat's")
    await other.set_aside(await served(other), "x")
    for n in range(MAX_KEPT_ASIDE + 2):
        await upload(archive, b"garbage %d" % n)
        assert await archive.set_aside(await served(archive), "x") is AsideOutcome.SET_ASIDE

    assert kept(tmp_path) == [b"garbage %d" % n for n in range(2, MAX_KEPT_ASIDE + 2)]
    assert await archive.kept_aside() == MAX_KEPT_ASIDE and await other.kept_aside() == 1
    assert await archive.drop_kept_aside() == MAX_KEPT_ASIDE
    assert kept(tmp_path) == [] and kept(tmp_path, f"{FOLDER}0") == [b"the other chat's"]


async def test_uploads_and_set_asides_at_once_never_lose_the_newer_archive(tmp_path: Path) -> None:
    archive = archives(tmp_path, [8]).chat(FOLDER)
    for n in range(20):
        await upload(archive, b"garbage")
        identity = await served(archive)
        newer = b"newer %d" % n
        outcome, _ = await asyncio.gather(archive.set_aside(identity, "x"), upload(archive, newer))
        # Whichever came first, the newer push is the chat's archive: set aside only the one served.
        assert await stored(archive) == newer
        assert outcome in (AsideOutcome.SET_ASIDE, AsideOutcome.REPLACED)


class OneChat:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    async def get(self, chat_id: int) -> OneChat:
        return self


class NoRuns:
    def count(self, chat_id: int | None = None) -> int:
        return 0


async def test_workspace_status_mentions_what_was_set_aside_and_clear_removes_it(tmp_path: Path) -> None:
    store = archives(tmp_path)
    DataPaths(tmp_path).workspace(FOLDER).parent.mkdir()  # made at start-up
    workspaces = Workspaces(
        DataPaths(tmp_path), cast(ChatStore, OneChat(FOLDER)), cast(LiveRuns, NoRuns()), 1, archives=store
    )
    assert "set aside" not in await workspaces.describe(1)
    archive = store.chat(FOLDER)
    await upload(archive, b"garbage")
    await archive.set_aside(await served(archive), "x")

    assert "1 stored workspace(s) that a run could not unpack were set aside" in await workspaces.describe(1)
    assert await workspaces.clear(1) == "Cleared this chat's workspace, and the 1 unreadable workspace(s) set aside."
    assert kept(tmp_path) == [] and "set aside" not in await workspaces.describe(1)
