"""The subagent's tools, run on the host against temp folders and a scripted host on the run channel."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from container.channel import RunChannel
from container.protocol import CHANNEL_SOCKET_FILE, MAX_PROGRESS_CHARS, MESSAGE_PATH, TaskSpec
from container.tools import MESSAGE_ID_BYTES, Toolbox, ToolFailed
from tests.container.scripted_llm import Refusal, ScriptedLLM

MESSAGE_BUDGET = 2


class NoMessages:
    """A `ChatSender` for tests of the other tools: a message or a file sent through it fails the test."""

    async def send_message(self, message_id: str, text: str) -> str:
        raise AssertionError(f"unexpected progress message {text!r}")

    async def ask(self, ask_id: str, question: str, options: list[str]) -> dict[str, Any]:
        raise AssertionError(f"unexpected question {question!r}")

    async def send_file(self, upload_id: str, name: str, caption: str | None, fd: int, size: int) -> str:
        raise AssertionError(f"unexpected file {name!r}")


@pytest.fixture
def toolbox(tmp_path: Path) -> Toolbox:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return Toolbox(workspace_dir=workspace, channel=NoMessages(), bash_timeout_seconds=5.0, output_cap_chars=1_000)


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / CHANNEL_SOCKET_FILE


@pytest.fixture
async def host(socket_path: Path) -> AsyncIterator[ScriptedLLM]:
    task = TaskSpec(run_id="run-123456", task="t", label="l", max_messages=MESSAGE_BUDGET)
    async with ScriptedLLM(socket_path, [], task=task) as host:
        yield host


@pytest.fixture
async def channel(socket_path: Path) -> AsyncIterator[RunChannel]:
    async with RunChannel(socket_path) as channel:
        yield channel


def with_channel(toolbox: Toolbox, channel: RunChannel) -> Toolbox:
    return Toolbox(
        workspace_dir=toolbox.workspace_dir,
        channel=channel,
        bash_timeout_seconds=toolbox.bash_timeout_seconds,
        output_cap_chars=toolbox.output_cap_chars,
    )


@pytest.fixture
def started_pids() -> Iterator[list[int]]:
    """Pids a test started in the background; whatever still runs is killed afterwards."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _is_running(pid):
            os.kill(pid, signal.SIGKILL)


def _is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pid: int, *, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- bash ---------------------------------------------------------------------------------------


async def test_bash_runs_in_workspace_and_merges_stderr(toolbox: Toolbox) -> None:
    output = await toolbox.bash("pwd; echo to-stderr >&2; exit 3")
    assert output.splitlines() == [str(toolbox.workspace_dir), "to-stderr", "[exit code: 3]"]


async def test_bash_reports_no_output(toolbox: Toolbox) -> None:
    assert await toolbox.bash("true") == "(no output)\n[exit code: 0]"


async def test_bash_timeout_kills_the_process_group(toolbox: Toolbox, tmp_path: Path, started_pids: list[int]) -> None:
    pid_file = tmp_path / "child.pid"
    fast = Toolbox(
        workspace_dir=toolbox.workspace_dir, channel=NoMessages(), bash_timeout_seconds=0.5, output_cap_chars=1_000
    )
    started = time.monotonic()
    output = await fast.bash(f"sleep 60 & echo $! > {pid_file}; echo waiting; sleep 60")
    elapsed = time.monotonic() - started
    child_pid = int(pid_file.read_text())
    started_pids.append(child_pid)

    assert elapsed < 5
    assert output.splitlines() == ["waiting", "[command timed out after 0.5 s; its process group was killed]"]
    assert _gone_within(child_pid, seconds=2), "the background child of the timed-out command survived"


async def test_bash_does_not_wait_for_background_jobs(toolbox: Toolbox, started_pids: list[int]) -> None:
    started = time.monotonic()
    output = await toolbox.bash("sleep 60 & echo $!")
    started_pids.append(int(output.splitlines()[0]))

    assert time.monotonic() - started < 3
    assert output.splitlines()[1:] == [
        "[exit code: 0]",
        "[background processes kept running; their later output is not shown]",
    ]
    assert _is_running(started_pids[0])


async def test_bash_output_is_capped_with_a_note_of_what_was_cut(toolbox: Toolbox) -> None:
    output = await toolbox.bash("seq 1 100000; echo the-end")

    lines = output.splitlines()
    assert lines[0] == "1"
    assert lines[-2:] == ["the-end", "[exit code: 0]"]
    total_chars = sum(len(f"{n}\n") for n in range(1, 100_001)) + len("the-end\n")
    assert f"[... {total_chars - 1_000} characters cut ...]" in output
    assert len(output) < 1_100


async def test_bash_rejects_an_empty_command(toolbox: Toolbox) -> None:
    with pytest.raises(ToolFailed, match="empty"):
        await toolbox.bash("   ")


# --- files --------------------------------------------------------------------------------------


async def test_write_then_read_relative_path_creates_parents(toolbox: Toolbox) -> None:
    reply = await toolbox.write_file("src/pkg/mod.py", "print('hi')\n")

    assert reply == "wrote 12 characters to src/pkg/mod.py"
    assert (toolbox.workspace_dir / "src/pkg/mod.py").read_text() == "print('hi')\n"
    assert await toolbox.read_file("src/pkg/mod.py") == "print('hi')\n"


async def test_absolute_paths_are_taken_as_they_are(toolbox: Toolbox, tmp_path: Path) -> None:
    outside = tmp_path / "scratch" / "note.txt"
    await toolbox.write_file(str(outside), "absolute")
    assert outside.read_text() == "absolute"
    assert await toolbox.read_file(str(outside)) == "absolute"


async def test_read_file_errors_are_tool_failures(toolbox: Toolbox) -> None:
    (toolbox.workspace_dir / "dir").mkdir()
    (toolbox.workspace_dir / "blob.bin").write_bytes(b"\x00\x01\x02")

    with pytest.raises(ToolFailed, match=r"missing\.txt: No such file"):
        await toolbox.read_file("missing.txt")
    with pytest.raises(ToolFailed, match="is a directory"):
        await toolbox.read_file("dir")
    with pytest.raises(ToolFailed, match="binary file"):
        await toolbox.read_file("blob.bin")
    with pytest.raises(ToolFailed, match="path is empty"):
        await toolbox.read_file("")


async def test_read_file_caps_long_files(toolbox: Toolbox) -> None:
    (toolbox.workspace_dir / "long.txt").write_text("a" * 600 + "b" * 600)

    text = await toolbox.read_file("long.txt")

    assert text == "a" * 500 + "\n[... 200 characters cut ...]\n" + "b" * 500


async def test_write_file_refuses_a_directory(toolbox: Toolbox) -> None:
    (toolbox.workspace_dir / "dir").mkdir()
    with pytest.raises(ToolFailed, match="is a directory"):
        await toolbox.write_file("dir", "x")


async def test_edit_file_replaces_one_exact_occurrence(toolbox: Toolbox) -> None:
    (toolbox.workspace_dir / "app.py").write_text("x = 1\ny = 2\n")

    reply = await toolbox.edit_file("app.py", "y = 2", "y = 3")

    assert reply.startswith("edited app.py: replaced 1 occurrence")
    assert (toolbox.workspace_dir / "app.py").read_text() == "x = 1\ny = 3\n"


async def test_edit_file_errors_name_the_problem(toolbox: Toolbox) -> None:
    path = toolbox.workspace_dir / "app.py"
    path.write_text("a = 1\na = 1\n")

    with pytest.raises(ToolFailed, match=r"was not found in app\.py"):
        await toolbox.edit_file("app.py", "b = 1", "b = 2")
    with pytest.raises(ToolFailed, match=r"occurs 2 times in app\.py"):
        await toolbox.edit_file("app.py", "a = 1", "a = 2")
    with pytest.raises(ToolFailed, match="`old` is empty"):
        await toolbox.edit_file("app.py", "", "a = 2")
    with pytest.raises(ToolFailed, match="No such file"):
        await toolbox.edit_file("nope.py", "a", "b")
    assert path.read_text() == "a = 1\na = 1\n"


async def test_list_files_shows_dirs_and_sizes(toolbox: Toolbox) -> None:
    (toolbox.workspace_dir / "sub").mkdir()
    (toolbox.workspace_dir / "b.txt").write_text("12345")
    (toolbox.workspace_dir / "a.txt").write_text("")

    assert await toolbox.list_files() == "a.txt (0 bytes)\nb.txt (5 bytes)\nsub/"
    assert await toolbox.list_files("sub") == "sub is empty"
    assert await toolbox.list_files("b.txt") == "b.txt (5 bytes)"
    with pytest.raises(ToolFailed, match="No such file"):
        await toolbox.list_files("missing")


# --- send_message -------------------------------------------------------------------------------


async def test_send_message_goes_to_the_host(toolbox: Toolbox, host: ScriptedLLM, channel: RunChannel) -> None:
    tools = with_channel(toolbox, channel)

    assert await tools.send_message("half way there") == "message sent (sent)"
    assert await tools.send_message("nearly done") == "message sent (sent)"

    assert [message.text for message in host.messages] == ["half way there", "nearly done"]
    ids = [message.message_id for message in host.messages]
    assert len(set(ids)) == 2
    assert all(len(message_id) == 2 * MESSAGE_ID_BYTES for message_id in ids)


async def test_send_message_over_the_budget_fails_with_the_hosts_reason(
    toolbox: Toolbox, host: ScriptedLLM, channel: RunChannel
) -> None:
    tools = with_channel(toolbox, channel)
    for number in range(MESSAGE_BUDGET):
        await tools.send_message(f"message {number}")

    with pytest.raises(ToolFailed) as refused:
        await tools.send_message("one too many")

    assert str(refused.value) == (
        f"the message was not sent: this run has sent its {MESSAGE_BUDGET} progress messages; "
        "put the rest in the final answer"
    )
    assert [message.text for message in host.messages] == ["message 0", "message 1"]

    # Told once: the next ones are refused here, never sent (the host counts a run that keeps sending).
    with pytest.raises(ToolFailed) as again:
        await tools.send_message("and another")
    assert str(again.value) == str(refused.value)
    assert host.messages_over_budget == 1


async def test_send_message_refused_by_the_host_fails_with_its_reason(toolbox: Toolbox, socket_path: Path) -> None:
    task = TaskSpec(run_id="run-123456", task="t", label="l")
    refusals = {MESSAGE_PATH: Refusal(403, "run run-123456 is cancelled or finished")}
    async with ScriptedLLM(socket_path, [], task=task, refusals=refusals) as host, RunChannel(socket_path) as channel:
        with pytest.raises(ToolFailed, match=r"^the message was not sent: run run-123456 is cancelled or finished$"):
            await with_channel(toolbox, channel).send_message("still there?")
    assert host.messages == []


async def test_send_message_without_a_host_is_a_tool_failure(toolbox: Toolbox, socket_path: Path) -> None:
    # One connect attempt: the default delays are bound when RunChannel is defined, so only this argument
    # spares the test their 31.5 s of retries.
    async with RunChannel(socket_path, connect_delays_seconds=()) as channel:
        with pytest.raises(ToolFailed, match=r"^the message could not be sent: the run channel did not answer POST"):
            await with_channel(toolbox, channel).send_message("anyone?")


async def test_send_message_rejects_empty_and_oversized_text(toolbox: Toolbox) -> None:
    # `toolbox` has a channel that fails the test if anything reaches it.
    with pytest.raises(ToolFailed, match="empty"):
        await toolbox.send_message(" \n")
    with pytest.raises(ToolFailed, match=f"limit is {MAX_PROGRESS_CHARS}"):
        await toolbox.send_message("x" * (MAX_PROGRESS_CHARS + 1))
