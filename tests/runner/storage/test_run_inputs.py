"""The chat files a run is given (runner/storage/run_inputs.py) and their host-side copies
(runner/storage/chat_file_cache.py), over real SQLite with a fake platform at the edge (FakeSource): refs
checked against the run's chat, the size limits by declared and by actual bytes, downloads shared and done
once per platform file, failures that leave nothing in files/in, and safe, unique names."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from core.settings import Settings
from core.store.chat_files import ChatFile, ChatFileStore, FileKind, FileUnavailable, NewFile
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from runner.storage.chat_file_cache import ChatFileCache
from runner.storage.run_inputs import BYTES_PER_MB, MAX_MIME_CHARS, RunInputs, RunInputsBuilder
from tests.harness import make_settings

CHAT = -1001
TOPIC = -1002  # another topic of the same group: a chat of its own
WAIT_SECONDS = 10.0  # only so a broken test fails instead of hanging
MB = BYTES_PER_MB
T = TypeVar("T")


class FakeSource:
    """The platform at its edge: hands out `files` by file id (all of it, whatever the limit: the cache must
    check), fails those in `failing`, and holds every download until `release` is set."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.failing: dict[str, str] = {}
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.release.set()

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        self.calls.append(file_id)
        await self.release.wait()
        if file_id in self.failing:
            raise FileUnavailable(self.failing[file_id])
        return self.files[file_id]


class World:
    def __init__(self, db: Database, settings: Settings, source: FakeSource) -> None:
        self.db = db
        self.source = source
        self.files_in = settings.data_dir / "files" / "in"
        self.builder = RunInputsBuilder(settings, ChatFileStore(db), ChatFileCache(self.files_in, source))

    async def post(
        self,
        data: bytes,
        *,
        chat_id: int = CHAT,
        name: str = "x.csv",
        unique: str | None = None,
        declared: int | bool | None = True,
        mime: str | None = "text/csv",
    ) -> ChatFile:
        """A file posted in the chat (stored by reference), its bytes at the fake platform."""
        unique = unique or f"u{len(self.source.files)}-{chat_id}"
        file_id = f"id-{unique}-{chat_id}-{name[:20]}"
        self.source.files[file_id] = data
        size = len(data) if declared is True else declared if isinstance(declared, int) else None
        new = NewFile(FileKind.DOCUMENT, file_id, unique, name, mime_type=mime, size_bytes=size)
        message_id = await MessageStore(self.db).add(
            NewMessage(chat_id=chat_id, sender_name="Alice", content=name, kind="document", file=new)
        )
        assert message_id is not None
        found = await ChatFileStore(self.db).of_message(message_id)
        assert found is not None
        return found

    async def build(self, *refs: str, chat_id: int = CHAT, run_id: str = "run-000001") -> RunInputs:
        return await self.builder.build(chat_id, refs, run_id)

    def copies(self) -> list[str]:
        """Every entry in files/in, temporary ones included."""
        return sorted(os.listdir(self.files_in)) if self.files_in.exists() else []


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    settings = make_settings(tmp_path / "data", SUBAGENT_MAX_FILE_MB=1, SUBAGENT_RUN_FILES_MB=2)
    database = await Database.open(tmp_path / "crewbot.sqlite3")
    try:
        await ChatStore(database).ensure(CHAT, "group", "main")
        await ChatStore(database).ensure(TOPIC, "group", "main / topic")
        yield World(database, settings, FakeSource())
    finally:
        await database.close()


async def bounded(work: Awaitable[T]) -> T:
    return await asyncio.wait_for(work, WAIT_SECONDS)


# --- downloads: once per platform file ------------------------------------------------------------------


async def test_two_runs_needing_one_file_at_once_share_one_download(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Guard: ChatFileCache's downloads in flight, by copy name: the second run joins the first's download.
    # Two chats posted the same platform file (the same unique id): each run may have its own chat's.
    here = await world.post(b"shared,bytes\n", unique="same")
    there = await world.post(b"shared,bytes\n", unique="same", chat_id=TOPIC)
    joined: list[object] = []
    both_waiting = asyncio.Event()
    shield = asyncio.shield

    def noted_shield(awaited: Any) -> Any:
        joined.append(awaited)
        if len(joined) == 2:
            both_waiting.set()
        return shield(awaited)

    monkeypatch.setattr(asyncio, "shield", noted_shield)  # as chat_file_cache calls it
    world.source.release.clear()
    first = asyncio.create_task(world.build(here.ref, run_id="run-first1"))
    second = asyncio.create_task(world.build(there.ref, chat_id=TOPIC, run_id="run-second"))
    await bounded(both_waiting.wait())  # both runs wait on a download; neither has its file yet
    world.source.release.set()
    given = [await bounded(first), await bounded(second)]

    assert len(world.source.calls) == 1
    assert joined[0] is joined[1]
    assert given[0].paths == given[1].paths and given[0].paths[0].read_bytes() == b"shared,bytes\n"
    assert world.copies() == [given[0].paths[0].name]


async def test_a_copy_on_disk_is_used_again(world: World) -> None:
    # Guard: local_copy's look at the existing copy before any download.
    posted = await world.post(b"a,b\n")
    await world.build(posted.ref)
    again = await world.build(posted.ref, run_id="run-000002")
    assert len(world.source.calls) == 1 and len(again.offered) == 1


async def test_the_same_file_posted_twice_is_downloaded_once_and_offered_twice_by_unique_names(
    world: World,
) -> None:
    # Guards: the copy is keyed by the platform's unique id; unique_names numbers the second `x.csv`.
    first = await world.post(b"1,2\n", unique="twice", name="x.csv")
    second = await world.post(b"1,2\n", unique="twice", name="x.csv")
    inputs = await world.build(first.ref, second.ref)
    assert [offer.name for offer in inputs.offered] == ["x.csv", "x (2).csv"]
    assert [offer.index for offer in inputs.offered] == [0, 1]
    assert inputs.paths[0] == inputs.paths[1] and len(world.source.calls) == 1
    assert [g.chat_file_id for g in inputs.given] == [first.id, second.id]


@pytest.mark.parametrize(
    ("posted_as", "offered_as"),
    [("../../evil.csv", "evil.csv"), ("..\\..\\evil.csv", "evil.csv"), ("...", "file"), ("a\x00b\n.txt", "a_b_.txt")],
)
async def test_names_are_made_safe(world: World, posted_as: str, offered_as: str) -> None:
    # Guard: unique_names (safe_file_name) on the names the chat gave.
    inputs = await world.build((await world.post(b"data", name=posted_as)).ref)
    assert [offer.name for offer in inputs.offered] == [offered_as]


async def test_a_mime_type_the_contract_refuses_is_left_out_not_the_run(world: World) -> None:
    # Fixed: a sender's client chooses the MIME type; one over 255 characters made OfferedFile raise and the
    # run fail to start. Guard: the length check before the offer is built.
    long = await world.post(b"a", mime="text/" + "x" * MAX_MIME_CHARS, unique="long")
    fits = await world.post(b"b", mime="t/" + "y" * (MAX_MIME_CHARS - 2), unique="fits")
    inputs = await world.build(long.ref, fits.ref)
    assert [offer.mime_type for offer in inputs.offered] == [None, fits.mime_type]


# --- refs that are not given: a note each, never a failed run ------------------------------------------


async def test_an_unknown_ref_is_a_note(world: World) -> None:
    inputs = await world.build("f999")
    assert inputs.offered == [] and inputs.notes == ["f999 was not given: no file of this chat has that id"]
    assert world.source.calls == []


@pytest.mark.parametrize("run_chat", [TOPIC, -1003], ids=["another-topic", "another-group"])
async def test_another_chats_file_is_a_note_and_never_downloaded(world: World, run_chat: int) -> None:
    # Guard: _refusal's chat check (a topic is a chat of its own: its files are not another topic's).
    posted = await world.post(b"secret,plans\n")
    inputs = await world.build(posted.ref, chat_id=run_chat)
    assert inputs.offered == [] and inputs.paths == []
    assert inputs.notes == [f"{posted.ref} was not given: it is a file of another chat or topic"]
    assert world.source.calls == [] and world.copies() == []


async def test_a_file_declared_too_big_is_not_downloaded(world: World) -> None:
    # Guard: _refusal's check of the size the platform declared.
    posted = await world.post(b"x" * (MB + 1))
    inputs = await world.build(posted.ref)
    assert inputs.offered == [] and "SUBAGENT_MAX_FILE_MB" in inputs.notes[0]
    assert world.source.calls == [] and world.copies() == []


@pytest.mark.parametrize("declared", [None, 10], ids=["undeclared", "declared-small"])
async def test_a_file_too_big_by_its_bytes_is_not_kept(world: World, declared: int | None) -> None:
    # Guard: the cache's count of the bytes it got (the fake source, like a lying platform, sends them all).
    posted = await world.post(b"x" * (MB + 1), declared=declared)
    inputs = await world.build(posted.ref)
    assert inputs.offered == [] and f"over the limit of {MB}" in inputs.notes[0]
    assert world.copies() == []


async def test_files_over_the_runs_total_are_notes(world: World) -> None:
    # Guards: the run total, by declared size before a download and by actual size after it.
    three_quarters = b"x" * (3 * MB // 4)
    refs = [(await world.post(three_quarters, declared=declared)).ref for declared in (True, True, True, None)]
    inputs = await world.build(*refs)
    assert [offer.size_bytes for offer in inputs.offered] == [len(three_quarters)] * 2
    assert len(inputs.notes) == 2 and all("SUBAGENT_RUN_FILES_MB" in note for note in inputs.notes)
    assert len(world.source.calls) == 3  # the third declared its size: refused before its download


async def test_a_failed_download_leaves_nothing_and_is_tried_again_later(world: World) -> None:
    # Guards: the copy is written only once the whole download is in hand, and a failure is not remembered.
    posted = await world.post(b"a,b\n")
    world.source.failing[posted.file_id] = "the download failed: connection reset"
    inputs = await world.build(posted.ref)
    assert inputs.notes == [f"{posted.ref} was not given: the download failed: connection reset"]
    assert world.copies() == []
    del world.source.failing[posted.file_id]
    assert len((await world.build(posted.ref)).offered) == 1
    assert len(world.source.calls) == 2


async def test_a_copy_that_fails_to_write_leaves_nothing_and_names_no_host_path(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Guards: _write_atomic removes its temporary file; fixed: the note said the OSError's text, which names
    # the host's DATA_DIR to the run (and its LLM).
    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(world.files_in / "x"))

    posted = await world.post(b"a,b\n")
    monkeypatch.setattr(os, "fsync", disk_full)  # as _write_atomic calls it
    inputs = await world.build(posted.ref)
    assert inputs.offered == [] and inputs.notes == [
        f"{posted.ref} was not given: the host could not keep a copy of it"
    ]
    assert str(world.files_in.parent) not in inputs.notes[0]
    assert world.copies() == []
