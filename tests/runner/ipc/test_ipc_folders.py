"""The IPC folders themselves (creating, repairing, writing into them), the quarantine helpers, and the thread
hops the scanner makes (a cancelled caller must never close a descriptor under a running thread)."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from container.protocol import SpawnRequest
from runner.ipc.batch import in_thread, open_in_thread
from runner.ipc.requests import (
    CHAT_DIR_MODE,
    ERRORS_DIR,
    REASON_SUFFIX,
    TASKS_DIR_MODE,
    ensure_chat_dirs,
    quarantine,
    quarantine_name,
    remove_if_same,
    write_spawn_request,
)
from tests.runner.ipc.ipc_helpers import CHATS, only_reason

THREAD_WAIT_SECONDS = 5.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ipc = tmp_path / "ipc"
    for folder in CHATS:
        ensure_chat_dirs(ipc, folder)
    return ipc


# --- folders and helpers ---------------------------------------------------------------------------------


def test_ensure_chat_dirs_makes_only_tasks_private_to_the_host(tmp_path: Path) -> None:
    root = tmp_path / "ipc"
    chat = ensure_chat_dirs(root, "chat_1")
    assert chat == root / "chat_1"
    assert sorted(p.name for p in chat.iterdir()) == ["tasks"]
    for path, mode in ((chat, CHAT_DIR_MODE), (chat / "tasks", TASKS_DIR_MODE)):
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == mode
        assert st.st_uid == os.geteuid()
    assert (root / ERRORS_DIR).is_dir()
    assert ensure_chat_dirs(root, "chat_1") == chat  # idempotent


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can hand a folder to another user")
def test_ensure_chat_dirs_takes_back_a_tasks_folder_an_older_deployment_gave_the_container(tmp_path: Path) -> None:
    root = tmp_path / "ipc"
    ensure_chat_dirs(root, "chat_1")
    tasks = root / "chat_1" / "tasks"
    os.chown(tasks, 1000, 1000)
    tasks.chmod(0o770)
    ensure_chat_dirs(root, "chat_1")
    st = tasks.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), os.getegid(), TASKS_DIR_MODE)


def test_ensure_chat_dirs_replaces_a_symlinked_tasks_without_touching_its_target(tmp_path: Path) -> None:
    root = tmp_path / "ipc"
    outside = tmp_path / "etc"
    outside.mkdir(mode=0o700)
    ensure_chat_dirs(root, "chat_1")
    (root / "chat_1" / "tasks").rmdir()
    (root / "chat_1" / "tasks").symlink_to(outside)
    ensure_chat_dirs(root, "chat_1")
    assert (root / "chat_1" / "tasks").is_dir() and not (root / "chat_1" / "tasks").is_symlink()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o700
    assert outside.stat().st_uid == os.geteuid()
    assert only_reason(root) == "tasks is not a directory"


@pytest.mark.parametrize("folder", ["", "errors", "../x", "a/b", ".hidden", "x" * 65])
def test_invalid_folder_names_are_refused(tmp_path: Path, folder: str) -> None:
    with pytest.raises(ValueError, match="invalid IPC folder name"):
        ensure_chat_dirs(tmp_path, folder)


def test_write_refuses_a_symlinked_tasks_folder(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "chat_1" / "tasks").rmdir()
    (root / "chat_1" / "tasks").symlink_to(outside)
    with pytest.raises(OSError):
        write_spawn_request(root, "chat_1", SpawnRequest(request_id="req-000001", task="t"))
    assert list(outside.iterdir()) == []


def test_quarantine_never_overwrites(root: Path) -> None:
    tasks = root / "chat_1" / "tasks"
    now = time.time()
    names = []
    for content in (b"1", b"2", b"3"):
        (tasks / "x.json").write_bytes(content)
        fd = os.open(tasks, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names.append(quarantine(root, fd, "x.json", folder="chat_1", reason="r", now=now).name)
        finally:
            os.close(fd)
    assert len(set(names)) == 3
    assert sorted((root / ERRORS_DIR / n).read_bytes() for n in names) == [b"1", b"2", b"3"]


def test_quarantine_name_is_sanitised_and_bounded() -> None:
    name = quarantine_name("chat_1", "a/b\nc\udcff\u202e" + "é" * 300, 0.5)
    assert name.startswith("19700101T000000.500000Z-chat_1-a_b_c__")
    assert re.fullmatch(r"[A-Za-z0-9._-]+", name)
    assert len((name + REASON_SUFFIX).encode()) <= 255


def test_quarantined_entry_is_never_named_like_a_reason_file() -> None:
    assert not quarantine_name("chat_1", "x" + REASON_SUFFIX, 0).endswith(REASON_SUFFIX)


def test_remove_if_same_keeps_a_replaced_file(root: Path) -> None:
    tasks = root / "chat_1" / "tasks"
    (tasks / "a.json").write_text("1")
    read = (tasks / "a.json").stat()
    (tasks / "b.json").write_text("2")
    os.replace(tasks / "b.json", tasks / "a.json")
    fd = os.open(tasks, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert remove_if_same(fd, "a.json", read) is False
        assert remove_if_same(fd, "a.json", (tasks / "a.json").stat()) is True
    finally:
        os.close(fd)
    assert not (tasks / "a.json").exists()


# --- thread hops ---------------------------------------------------------------------------------------


async def test_a_cancelled_caller_waits_for_its_thread_before_it_gives_up() -> None:
    """Otherwise the caller would close descriptors the thread still works on."""
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        release.wait(THREAD_WAIT_SECONDS)
        return "done"

    task = asyncio.create_task(in_thread(work))
    assert await asyncio.to_thread(started.wait, THREAD_WAIT_SECONDS)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()
    task.cancel()  # a second cancellation does not cut the wait short either
    await asyncio.sleep(0.05)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_descriptor_opened_for_a_cancelled_caller_is_closed(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    opened: list[int] = []

    def open_it() -> int:
        started.set()
        release.wait(THREAD_WAIT_SECONDS)
        opened.append(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
        return opened[-1]

    task = asyncio.create_task(open_in_thread(open_it))
    assert await asyncio.to_thread(started.wait, THREAD_WAIT_SECONDS)
    task.cancel()
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(OSError) as closed:
        os.fstat(opened[0])
    assert closed.value.errno == errno.EBADF
