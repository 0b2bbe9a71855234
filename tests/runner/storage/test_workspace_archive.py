"""A chat's stored workspace archive (runner/storage/workspace_archive.py): an upload replaces it only whole and
within the quota; a refused, cut or failed one keeps the previous; concurrent uploads never tear it."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest

from container.contract import EMPTY_VERSION
from runner.channel.workspace_desk import OverQuota, StaleBase
from runner.storage.paths import DataPaths
from runner.storage.workspace_archive import (
    BYTES_PER_MB,
    WRITE_BATCH_BYTES,
    ChatArchive,
    WorkspaceArchives,
    archives_dir,
)

FOLDER = "chat_m100123"


def archives(tmp_path: Path, quota_mb: list[int] | None = None) -> WorkspaceArchives:
    quota = quota_mb if quota_mb is not None else [1]
    return WorkspaceArchives(DataPaths(tmp_path), lambda: quota[0])


async def stored(archive: ChatArchive) -> bytes | None:
    reader = await archive.open()
    if reader is None:
        return None
    try:
        data = b""
        while chunk := await reader.read(64 * 1024):
            data += chunk
        return data
    finally:
        await reader.close()


async def upload(archive: ChatArchive, data: bytes, piece: int = 100_000) -> int:
    up = await archive.begin()
    try:
        for start in range(0, len(data), piece):
            await up.write(data[start : start + piece])
        return await up.commit()
    except BaseException:
        await up.abandon()
        raise


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(name for name in os.listdir(archives_dir(DataPaths(tmp_path))) if name.endswith(".part"))


async def test_a_chat_without_an_archive_has_none_and_uses_nothing(tmp_path: Path) -> None:
    store = archives(tmp_path)
    assert await stored(store.chat(FOLDER)) is None
    usage = await store.usage(FOLDER)
    assert (usage.bytes, usage.entries, usage.truncated) == (0, 0, False)


async def test_an_upload_is_stored_whole_and_measured(tmp_path: Path) -> None:
    store = archives(tmp_path, [2])
    data = os.urandom(3 * WRITE_BATCH_BYTES // 2 + 7)
    assert await upload(store.chat(FOLDER), data) == len(data)
    assert await stored(store.chat(FOLDER)) == data
    assert (await store.usage(FOLDER)).bytes == len(data)
    path = store.chat(FOLDER).path
    assert path.parent == tmp_path / "workspace-archives" and oct(path.stat().st_mode & 0o777) == "0o600"
    assert leftovers(tmp_path) == []


async def test_an_upload_past_the_quota_keeps_the_previous_archive(tmp_path: Path) -> None:
    quota = [1]
    store = archives(tmp_path, quota)
    first = os.urandom(1000)
    await upload(store.chat(FOLDER), first)
    with pytest.raises(OverQuota, match="WORKSPACE_QUOTA_MB"):
        await upload(store.chat(FOLDER), os.urandom(BYTES_PER_MB + 1))
    assert await stored(store.chat(FOLDER)) == first
    assert leftovers(tmp_path) == []
    exactly = os.urandom(BYTES_PER_MB)
    await upload(store.chat(FOLDER), exactly)  # at the quota is within it
    quota[0] = 2  # read at each upload's start: a changed quota counts from the next one
    await upload(store.chat(FOLDER), os.urandom(BYTES_PER_MB + 1))
    assert (await store.usage(FOLDER)).bytes == BYTES_PER_MB + 1


async def test_an_abandoned_upload_leaves_nothing_and_keeps_the_previous(tmp_path: Path) -> None:
    store = archives(tmp_path, [2])
    await upload(store.chat(FOLDER), b"before")
    up = await store.chat(FOLDER).begin()
    await up.write(os.urandom(WRITE_BATCH_BYTES + 1))  # some of it on disk already
    assert len(leftovers(tmp_path)) == 1
    await up.abandon()
    await up.abandon()  # twice is harmless
    assert await stored(store.chat(FOLDER)) == b"before" and leftovers(tmp_path) == []


async def test_a_reader_keeps_its_snapshot_while_an_upload_replaces_the_archive(tmp_path: Path) -> None:
    store = archives(tmp_path)
    old = os.urandom(200_000)
    await upload(store.chat(FOLDER), old)
    reader = await store.chat(FOLDER).open()
    assert reader is not None
    first = await reader.read(1000)
    await upload(store.chat(FOLDER), os.urandom(300_000))
    rest = b""
    while chunk := await reader.read(64 * 1024):
        rest += chunk
    await reader.close()
    assert first + rest == old and reader.size_bytes == len(old)


async def test_concurrent_uploads_of_one_chat_end_as_one_of_them_whole(tmp_path: Path) -> None:
    store = archives(tmp_path, [8])
    bodies = [bytes([n]) * (WRITE_BATCH_BYTES * 2 + n * 1000) for n in range(1, 7)]
    # Interleaved in small pieces, so their writes and commits overlap.
    await asyncio.gather(*(upload(store.chat(FOLDER), body, piece=50_000) for body in bodies))
    assert await stored(store.chat(FOLDER)) in bodies
    assert leftovers(tmp_path) == []


async def test_the_last_upload_to_complete_wins(tmp_path: Path) -> None:
    store = archives(tmp_path)
    early, late = await store.chat(FOLDER).begin(), await store.chat(FOLDER).begin()
    await early.write(b"started first")
    await late.write(b"started second")
    await late.commit()
    await early.commit()
    assert await stored(store.chat(FOLDER)) == b"started first"


async def test_a_link_planted_as_the_archive_is_not_followed(tmp_path: Path) -> None:
    store = archives(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("host file")
    path = store.chat(FOLDER).path
    path.parent.mkdir(parents=True)
    path.symlink_to(secret)
    with pytest.raises(OSError):
        await store.chat(FOLDER).open()
    assert (await store.usage(FOLDER)).bytes == 0
    await upload(store.chat(FOLDER), b"new")  # the rename replaces the link itself
    assert secret.read_text() == "host file" and await stored(store.chat(FOLDER)) == b"new"


async def test_clear_and_the_start_up_sweep(tmp_path: Path) -> None:
    store = archives(tmp_path, [2])
    assert await store.sweep_partial() == 0
    await upload(store.chat(FOLDER), b"kept")
    left = await store.chat("chat_1").begin()
    await left.write(os.urandom(WRITE_BATCH_BYTES + 1))
    assert await store.sweep_partial() == 1  # a previous process's unfinished upload
    assert leftovers(tmp_path) == [] and await stored(store.chat(FOLDER)) == b"kept"
    assert await store.chat(FOLDER).clear() and not await store.chat(FOLDER).clear()
    assert await stored(store.chat(FOLDER)) is None
    await left.abandon()


@pytest.mark.parametrize("folder", ["", "../x", "a/b", ".hidden", "x" * 65, "chat_1.tar"])
def test_only_chat_folder_names_name_an_archive(tmp_path: Path, folder: str) -> None:
    with pytest.raises(ValueError):
        archives(tmp_path).chat(folder)


# --- versions: a push kept only if its base is still the chat's archive (review N2) --------------------------


async def version_of(archive: ChatArchive) -> str:
    reader = await archive.open()
    if reader is None:
        return EMPTY_VERSION
    await reader.close()
    return reader.identity.version


async def based_upload(archive: ChatArchive, data: bytes, base: str | None) -> int:
    up = await archive.begin()
    try:
        await up.write(data)
        return await up.commit(base)
    except BaseException:
        await up.abandon()
        raise


async def test_of_two_pushes_based_on_one_archive_only_the_first_is_kept_and_the_second_is_told(
    tmp_path: Path,
) -> None:
    archive = archives(tmp_path).chat(FOLDER)
    assert await based_upload(archive, b"first run's", EMPTY_VERSION) == len(b"first run's")
    with pytest.raises(StaleBase):  # the second run of the chat also started from no archive
        await based_upload(archive, b"second run's", EMPTY_VERSION)
    assert await stored(archive) == b"first run's" and leftovers(tmp_path) == []
    assert await based_upload(archive, b"second, merged", await version_of(archive)) > 0
    assert await stored(archive) == b"second, merged"
    assert await based_upload(archive, b"an agent from before versions", None) > 0  # replaces, as before


async def test_every_commit_is_a_new_version_even_with_the_same_bytes_and_an_inode_used_again(
    tmp_path: Path,
) -> None:
    archive = archives(tmp_path).chat(FOLDER)
    versions = [await version_of(archive)]
    for _ in range(30):  # freed inode numbers are used again at once, and commits land within a clock tick
        await based_upload(archive, b"same", versions[-1])
        versions.append(await version_of(archive))
    assert len(set(versions)) == len(versions)


async def test_a_push_based_on_an_archive_set_aside_since_is_stale(tmp_path: Path) -> None:
    archive = archives(tmp_path).chat(FOLDER)
    await based_upload(archive, b"garbage", None)
    reader = await archive.open()
    assert reader is not None
    await reader.close()
    await archive.set_aside(reader.identity, "ReadError")
    with pytest.raises(StaleBase):
        await based_upload(archive, b"based on the garbage", reader.identity.version)
    assert await based_upload(archive, b"based on nothing", EMPTY_VERSION) > 0


async def test_clear_waits_for_a_commit_in_its_compare_and_swap(tmp_path: Path) -> None:
    """Review L5: /workspace clear removed the archive without the folder's lock, so a push that had checked its
    base could rename its archive back after "Cleared". Holding the lock as a commit does, clear must wait."""
    store = archives(tmp_path)
    archive = store.chat(FOLDER)
    await upload(archive, b"stored")
    fd = os.open(archives_dir(DataPaths(tmp_path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a commit between its base check and its rename
        clearing = asyncio.create_task(archive.clear())
        for _ in range(20):  # room for the clear's thread to run; it must be waiting for the lock
            await asyncio.sleep(0.01)
        assert not clearing.done()
        assert await stored(archive) == b"stored"
    finally:
        os.close(fd)
    assert await clearing
    assert await stored(archive) is None
