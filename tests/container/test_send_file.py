"""Files out: the send_file tool sends only a regular file under the workspace, within the run's size and count,
read from the fd it opened. Each refusal is a one-line ToolFailed and nothing reaches the channel."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from container.channel import ChannelRefused, RunChannel
from container.protocol import CHANNEL_SOCKET_FILE, ID_PATTERN, MAX_CAPTION_CHARS, TaskSpec
from container.tools import UPLOAD_ID_BYTES, Toolbox, ToolFailed
from tests.container.fake_files import FakeFiles
from tests.container.scripted_llm import ScriptedLLM

MAX_FILE_BYTES = 1_000
MAX_FILES_OUT = 2
FIFO_TIMEOUT_SECONDS = 10  # opening a FIFO for reading without O_NONBLOCK waits for a writer for ever


class RecordingChannel:
    """A channel that takes every file and keeps what it read of it, from the fd it was given."""

    def __init__(self, refuse: str | None = None) -> None:
        self.sent: list[tuple[str, str, str | None, bytes]] = []
        self.refuse = refuse

    async def send_message(self, message_id: str, text: str) -> str:
        raise AssertionError("no messages here")

    async def ask(self, ask_id: str, question: str, options: list[str]) -> dict[str, Any]:
        raise AssertionError(f"unexpected question {question!r}")

    async def send_file(self, upload_id: str, name: str, caption: str | None, fd: int, size: int) -> str:
        if self.refuse is not None:
            raise ChannelRefused(self.refuse)
        self.sent.append((upload_id, name, caption, os.pread(fd, min(size, 1 << 20) + 1, 0)))
        return "sent"


@pytest.fixture
def channel() -> RecordingChannel:
    return RecordingChannel()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def toolbox(workspace: Path, channel: RecordingChannel) -> Toolbox:
    return Toolbox(
        workspace_dir=workspace,
        channel=channel,
        bash_timeout_seconds=5.0,
        output_cap_chars=1_000,
        max_file_bytes=MAX_FILE_BYTES,
        max_files_out=MAX_FILES_OUT,
    )


async def refused(toolbox: Toolbox, channel: RecordingChannel, path: str, caption: str | None = None) -> str:
    """The one-line reason send_file gives; fails the test if anything reached the channel."""
    with pytest.raises(ToolFailed) as failure:
        await toolbox.send_file(path, caption)
    assert channel.sent == []
    reason = str(failure.value)
    assert "\n" not in reason
    return reason


async def test_a_file_in_the_workspace_is_sent_with_its_name_and_caption(
    toolbox: Toolbox, channel: RecordingChannel, workspace: Path
) -> None:
    (workspace / "out").mkdir()
    (workspace / "out" / "report.txt").write_bytes(b"the report")

    reply = await toolbox.send_file("out/report.txt", "This week")
    again = await toolbox.send_file(str(workspace / "out" / "report.txt"))

    assert (reply, again) == ("sent report.txt (10 bytes) to the chat (sent)",) * 2
    (first_id, *first), (second_id, *second) = channel.sent
    assert first == ["report.txt", "This week", b"the report"]
    assert second == ["report.txt", None, b"the report"]
    assert first_id != second_id and len(first_id) == 2 * UPLOAD_ID_BYTES


async def test_a_path_outside_the_workspace_is_refused(
    toolbox: Toolbox, channel: RecordingChannel, tmp_path: Path
) -> None:
    (tmp_path / "host.txt").write_bytes(b"not yours")

    assert "outside the workspace" in await refused(toolbox, channel, str(tmp_path / "host.txt"))
    assert "outside the workspace" in await refused(toolbox, channel, "/etc/hostname")


async def test_a_dot_dot_escape_is_refused(toolbox: Toolbox, channel: RecordingChannel, tmp_path: Path) -> None:
    (tmp_path / "host.txt").write_bytes(b"not yours")
    (toolbox.workspace_dir / "sub").mkdir()

    assert "outside the workspace" in await refused(toolbox, channel, "../host.txt")
    assert "outside the workspace" in await refused(toolbox, channel, "sub/../../host.txt")


async def test_a_folder_linked_out_of_the_workspace_is_refused(
    toolbox: Toolbox, channel: RecordingChannel, tmp_path: Path
) -> None:
    (tmp_path / "host.txt").write_bytes(b"not yours")
    (toolbox.workspace_dir / "door").symlink_to(tmp_path)

    assert "outside the workspace" in await refused(toolbox, channel, "door/host.txt")


async def test_a_symlink_to_proc_self_mem_is_refused(toolbox: Toolbox, channel: RecordingChannel) -> None:
    (toolbox.workspace_dir / "mem").symlink_to("/proc/self/mem")

    assert await refused(toolbox, channel, "mem") == "mem is a symbolic link; only a file itself is sent"


async def test_a_symlink_to_a_file_in_the_workspace_is_refused_too(toolbox: Toolbox, channel: RecordingChannel) -> None:
    (toolbox.workspace_dir / "real.txt").write_bytes(b"data")
    (toolbox.workspace_dir / "link.txt").symlink_to("real.txt")

    assert "symbolic link" in await refused(toolbox, channel, "link.txt")


@pytest.mark.timeout(FIFO_TIMEOUT_SECONDS)
async def test_a_fifo_is_refused_without_hanging(toolbox: Toolbox, channel: RecordingChannel) -> None:
    os.mkfifo(toolbox.workspace_dir / "pipe")

    assert "not a regular file" in await refused(toolbox, channel, "pipe")


async def test_a_directory_is_refused(toolbox: Toolbox, channel: RecordingChannel) -> None:
    (toolbox.workspace_dir / "folder").mkdir()

    assert "folder is a directory" in await refused(toolbox, channel, "folder")
    assert "is a directory" in await refused(toolbox, channel, "folder/")
    assert "is a directory" in await refused(toolbox, channel, ".")


async def test_a_sparse_10_gb_file_is_refused_by_its_size_unread(toolbox: Toolbox, channel: RecordingChannel) -> None:
    huge = toolbox.workspace_dir / "huge.bin"
    with huge.open("wb") as handle:
        handle.truncate(10 * 1024**3)  # a hole: no disk used

    assert await refused(toolbox, channel, "huge.bin") == (
        f"huge.bin has {10 * 1024**3} bytes; a file sent may have at most {MAX_FILE_BYTES}"
    )


async def test_a_file_just_over_the_limit_is_refused_and_one_at_it_sent(
    toolbox: Toolbox, channel: RecordingChannel
) -> None:
    (toolbox.workspace_dir / "over.bin").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    assert "at most" in await refused(toolbox, channel, "over.bin")

    (toolbox.workspace_dir / "at.bin").write_bytes(b"x" * MAX_FILE_BYTES)
    assert (await toolbox.send_file("at.bin")).startswith("sent at.bin")


async def test_more_files_than_allowed_are_refused(toolbox: Toolbox, channel: RecordingChannel) -> None:
    (toolbox.workspace_dir / "a.txt").write_bytes(b"a")
    for _ in range(MAX_FILES_OUT):
        await toolbox.send_file("a.txt")

    with pytest.raises(ToolFailed, match=f"this run has sent its {MAX_FILES_OUT} files, the limit"):
        await toolbox.send_file("a.txt")
    assert len(channel.sent) == MAX_FILES_OUT


async def test_a_refused_or_failed_send_does_not_count(workspace: Path) -> None:
    channel = RecordingChannel(refuse="the file is over the limit of 5 bytes")
    toolbox = Toolbox(workspace, channel, 5.0, 1_000, max_file_bytes=MAX_FILE_BYTES, max_files_out=1)
    (workspace / "a.txt").write_bytes(b"a")

    with pytest.raises(ToolFailed, match=r"^a\.txt was not sent: the file is over the limit of 5 bytes$"):
        await toolbox.send_file("a.txt")

    channel.refuse = None
    assert (await toolbox.send_file("a.txt")).startswith("sent a.txt")


async def test_a_caption_over_the_limit_is_refused(toolbox: Toolbox, channel: RecordingChannel) -> None:
    (toolbox.workspace_dir / "a.txt").write_bytes(b"a")

    reason = await refused(toolbox, channel, "a.txt", "c" * (MAX_CAPTION_CHARS + 1))

    assert reason == f"the caption has {MAX_CAPTION_CHARS + 1} characters; the limit is {MAX_CAPTION_CHARS}"


@pytest.mark.parametrize(
    ("path", "reason"),
    [("", "the path is empty"), ("a\0b", "is not a usable path"), ("missing.txt", "No such file")],
)
async def test_unusable_paths_are_refused(toolbox: Toolbox, channel: RecordingChannel, path: str, reason: str) -> None:
    assert reason in await refused(toolbox, channel, path)


async def test_an_empty_file_is_refused(toolbox: Toolbox, channel: RecordingChannel) -> None:
    (toolbox.workspace_dir / "empty.txt").write_bytes(b"")

    assert await refused(toolbox, channel, "empty.txt") == "empty.txt is empty; the chat takes no empty files"


# --- over the run channel -----------------------------------------------------------------------


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[ScriptedLLM]:
    task = TaskSpec(run_id="run-files1", task="t", label="l", max_file_bytes=MAX_FILE_BYTES, max_files_out=1)
    async with ScriptedLLM(tmp_path / CHANNEL_SOCKET_FILE, [], task=task, files=FakeFiles()) as host:
        yield host


async def test_the_host_receives_the_multipart_upload_with_its_meta_and_bytes(
    host: ScriptedLLM, workspace: Path
) -> None:
    data = bytes(range(256)) * 3
    (workspace / "chart ü.png").write_bytes(data)
    async with RunChannel(host.socket_path) as channel:
        toolbox = Toolbox(workspace, channel, 5.0, 1_000, max_file_bytes=MAX_FILE_BYTES, max_files_out=5)

        assert (
            await toolbox.send_file("chart ü.png", "Sales by month")
            == "sent chart ü.png (768 bytes) to the chat (sent)"
        )
        # The host's own count: refused there, the reason reaches the model.
        with pytest.raises(ToolFailed, match=r"^chart ü\.png was not sent: this run has sent its 1 files$"):
            await toolbox.send_file("chart ü.png")

    (upload,) = host.files.uploads
    assert upload.data == data
    assert (upload.meta.name, upload.meta.caption) == ("chart ü.png", "Sales by month")
    assert re.fullmatch(ID_PATTERN, upload.meta.upload_id)
    assert toolbox.files_sent.count == 1


async def test_a_retried_upload_id_is_sent_once(workspace: Path, tmp_path: Path) -> None:
    (workspace / "a.txt").write_bytes(b"abc")
    fd = os.open(workspace / "a.txt", os.O_RDONLY)
    host = ScriptedLLM(tmp_path / CHANNEL_SOCKET_FILE, [], task=TaskSpec(run_id="run-files2", task="t", label="l"))
    try:
        async with host, RunChannel(host.socket_path) as channel:
            first = await channel.send_file("upload-0001", "a.txt", None, fd, 3)
            second = await channel.send_file("upload-0001", "a.txt", None, fd, 3)
    finally:
        os.close(fd)

    assert (first, second) == ("sent", "already sent")
    assert [upload.data for upload in host.files.uploads] == [b"abc"]
    assert host.files.upload_requests == 2
