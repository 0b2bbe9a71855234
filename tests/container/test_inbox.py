"""Files in: the container writes the task's offered files to <workspace>/inbox/ itself, whatever an earlier run
planted there (a link, a FIFO, a file or a directory at `inbox` or at a name), and a file that fails becomes a
note. Against an in-memory fetcher; tests/container/test_agent_files.py runs the same over the channel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from container.channel import ChannelRefused
from container.inbox import FILE_MODE, Inbox, InboxFile, fill_inbox
from container.task import OfferedFile, Task

PLANTED_TIMEOUT_SECONDS = 10  # a write that opened a planted FIFO would block for ever


class Fetcher:
    """Hands out `files` by index, as the run channel does; a listed failure raises after half of the bytes."""

    def __init__(self, files: dict[int, bytes], fail: dict[int, BaseException] | None = None) -> None:
        self.files = files
        self.fail = fail or {}
        self.fetched: list[int] = []

    async def fetch_file(self, index: int, fd: int, size_bytes: int) -> int:
        self.fetched.append(index)
        data = self.files[index]
        if index in self.fail:
            os.write(fd, data[: len(data) // 2])
            raise self.fail[index]
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return len(data)


def task_with(*files: tuple[str, bytes], notes: list[str] | None = None) -> tuple[Task, dict[int, bytes]]:
    offered = [OfferedFile(index=i, name=name, size_bytes=len(data)) for i, (name, data) in enumerate(files)]
    task = Task(run_id="run-inbox1", task="t", label="l", files=offered, file_notes=notes or [])
    return task, {i: data for i, (_, data) in enumerate(files)}


async def fill(workspace: Path, *files: tuple[str, bytes], fetcher: Fetcher | None = None) -> tuple[Inbox, list[str]]:
    task, data = task_with(*files)
    logged: list[str] = []
    inbox = await fill_inbox(task, fetcher or Fetcher(data), workspace, logged.append)
    return inbox, logged


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def entries(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


async def test_offered_files_are_written_to_the_inbox_under_safe_unique_names(workspace: Path) -> None:
    inbox, _ = await fill(workspace, ("../../evil.csv", b"a,b\n"), ("data.csv", b"1"), ("DATA.csv", b"2"))

    assert [file.name for file in inbox.files] == ["evil.csv", "data.csv", "DATA (2).csv"]
    assert entries(workspace / "inbox") == ["DATA (2).csv", "data.csv", "evil.csv"]
    assert (workspace / "inbox" / "evil.csv").read_bytes() == b"a,b\n"
    assert (workspace / "inbox" / "DATA (2).csv").read_bytes() == b"2"
    assert ((workspace / "inbox" / "data.csv").stat().st_mode & 0o777) == FILE_MODE
    assert not (workspace.parent / "evil.csv").exists()
    assert inbox.notes == []


async def test_no_files_leave_the_workspace_untouched(workspace: Path) -> None:
    task = Task(run_id="run-inbox1", task="t", label="l", file_notes=["f9 was not given: too large"])

    inbox = await fill_inbox(task, Fetcher({}), workspace, print)

    assert entries(workspace) == []
    assert inbox == Inbox(workspace / "inbox", [], ["f9 was not given: too large"])


async def test_an_earlier_file_of_the_same_name_is_replaced(workspace: Path) -> None:
    (workspace / "inbox").mkdir()
    (workspace / "inbox" / "data.csv").write_bytes(b"old and longer")

    await fill(workspace, ("data.csv", b"new"))

    assert (workspace / "inbox" / "data.csv").read_bytes() == b"new"


# --- planted at inbox ---------------------------------------------------------------------------


async def test_a_symlink_at_inbox_is_replaced_by_a_directory_and_nothing_is_written_through_it(
    workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "inbox").symlink_to(outside)

    inbox, logged = await fill(workspace, ("data.csv", b"secret"))

    assert entries(outside) == []
    assert (workspace / "inbox").is_dir() and not (workspace / "inbox").is_symlink()
    assert (workspace / "inbox" / "data.csv").read_bytes() == b"secret"
    assert [file.name for file in inbox.files] == ["data.csv"]
    assert "inbox was a symbolic link; removed it and made a directory" in logged


@pytest.mark.timeout(PLANTED_TIMEOUT_SECONDS)
async def test_a_fifo_at_inbox_is_replaced_by_a_directory(workspace: Path) -> None:
    os.mkfifo(workspace / "inbox")

    inbox, _ = await fill(workspace, ("data.csv", b"x"))

    assert (workspace / "inbox").is_dir()
    assert (workspace / "inbox" / "data.csv").read_bytes() == b"x"
    assert inbox.notes == []


async def test_a_file_at_inbox_is_replaced_by_a_directory(workspace: Path) -> None:
    (workspace / "inbox").write_bytes(b"not a folder")

    await fill(workspace, ("data.csv", b"x"))

    assert (workspace / "inbox" / "data.csv").read_bytes() == b"x"


# --- planted at a name --------------------------------------------------------------------------


async def test_a_directory_at_the_name_gets_the_file_a_numbered_name(workspace: Path) -> None:
    (workspace / "inbox" / "data.csv").mkdir(parents=True)
    (workspace / "inbox" / "data (2).csv").mkdir()
    (workspace / "inbox" / "data.csv" / "kept.txt").write_bytes(b"kept")

    inbox, logged = await fill(workspace, ("data.csv", b"x"), ("data (3).csv", b"y"))

    # `data (3).csv` is another file of this run, so the first one skips it too.
    assert [file.name for file in inbox.files] == ["data (4).csv", "data (3).csv"]
    assert (workspace / "inbox" / "data (4).csv").read_bytes() == b"x"
    assert (workspace / "inbox" / "data (3).csv").read_bytes() == b"y"
    assert (workspace / "inbox" / "data.csv" / "kept.txt").read_bytes() == b"kept"
    assert "inbox/data.csv is a directory; writing data (4).csv instead" in logged


async def test_a_symlink_at_the_name_is_replaced_and_its_target_untouched(workspace: Path, tmp_path: Path) -> None:
    target = tmp_path / "host-secret.txt"
    target.write_bytes(b"untouched")
    (workspace / "inbox").mkdir()
    (workspace / "inbox" / "data.csv").symlink_to(target)
    (workspace / "inbox" / "dangling.csv").symlink_to(tmp_path / "would-be-created.csv")

    await fill(workspace, ("data.csv", b"new"), ("dangling.csv", b"new too"))

    assert target.read_bytes() == b"untouched"
    assert not (tmp_path / "would-be-created.csv").exists()
    assert not (workspace / "inbox" / "data.csv").is_symlink()
    assert (workspace / "inbox" / "data.csv").read_bytes() == b"new"
    assert (workspace / "inbox" / "dangling.csv").read_bytes() == b"new too"


@pytest.mark.timeout(PLANTED_TIMEOUT_SECONDS)
async def test_a_fifo_at_the_name_is_replaced_without_hanging(workspace: Path) -> None:
    (workspace / "inbox").mkdir()
    os.mkfifo(workspace / "inbox" / "data.csv")

    inbox, logged = await fill(workspace, ("data.csv", b"x"))

    assert (workspace / "inbox" / "data.csv").read_bytes() == b"x"
    assert [file.name for file in inbox.files] == ["data.csv"]
    assert "inbox/data.csv was a FIFO; replacing it" in logged


# --- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [ChannelRefused("no such offered file"), ConnectionError("the channel broke off"), OSError(28, "No space")],
    ids=["refused", "broken", "disk-full"],
)
async def test_a_failed_download_leaves_no_partial_file_and_becomes_a_note(
    workspace: Path, error: BaseException
) -> None:
    task, data = task_with(("first.csv", b"1" * 100), ("second.csv", b"2" * 100), notes=["f9 was not given: too large"])
    fetcher = Fetcher(data, fail={0: error})

    inbox = await fill_inbox(task, fetcher, workspace, print)

    assert fetcher.fetched == [0, 1]  # the run goes on to the next file
    assert entries(workspace / "inbox") == ["second.csv"]  # no temp file, no half of first.csv
    assert inbox.files == [InboxFile("second.csv", 100)]
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    assert inbox.notes == ["f9 was not given: too large", f"first.csv was not given: {reason}"]


async def test_a_cancelled_run_leaves_no_temp_file(workspace: Path) -> None:
    task, data = task_with(("first.csv", b"1" * 100))

    with pytest.raises(KeyboardInterrupt):
        await fill_inbox(task, Fetcher(data, fail={0: KeyboardInterrupt()}), workspace, print)

    assert entries(workspace / "inbox") == []


async def test_an_inbox_that_cannot_be_made_notes_every_file(tmp_path: Path) -> None:
    inbox, logged = await fill(tmp_path / "no-workspace", ("a.csv", b"1"), ("b.csv", b"2"))

    assert inbox.files == []
    assert inbox.notes == [
        "a.csv was not given: the inbox could not be made (No such file or directory)",
        "b.csv was not given: the inbox could not be made (No such file or directory)",
    ]
    assert logged[0].startswith("the inbox could not be made")


# --- the task text ------------------------------------------------------------------------------


def test_the_task_text_lists_the_files_as_written_and_the_notes() -> None:
    inbox = Inbox(
        Path("/workspace/inbox"),
        [InboxFile("sales.csv", 412 * 1024, "text/csv"), InboxFile("photo (2).jpg", 3_500_000), InboxFile("a", 7)],
        ["f9 was not given: over the size limit", "- f10 was not given:\nsecond line"],
    )

    assert inbox.describe() == (
        "Files from the chat, in /workspace/inbox/:\n"
        "- sales.csv (412 KB, text/csv)\n"
        "- photo (2).jpg (3.3 MB)\n"
        "- a (7 bytes)\n"
        "- f9 was not given: over the size limit\n"
        "- f10 was not given: second line\n"
        "To send a file from the workspace back to the chat, call send_file(path, caption)."
    )


def test_the_task_text_has_a_files_part_only_with_files_or_notes() -> None:
    assert Inbox(Path("/workspace/inbox")).describe() == ""
    only_notes = Inbox(Path("/workspace/inbox"), [], ["f3 was not given: gone"]).describe()
    assert only_notes.startswith("Files from the chat:\n- f3 was not given: gone\n")
