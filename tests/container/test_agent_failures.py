"""The whole container agent on the host, against a scripted host serving its run channel on a socket: runs
that fail (tool errors, the step limit, LLM errors, refused sessions and results) and no usable task."""

from __future__ import annotations

import asyncio

import pytest

from container.__main__ import EXIT_BAD_TASK, EXIT_COMPLETED, EXIT_FAILED, run_main
from container.paths import ContainerPaths
from container.protocol import RESULT_PATH, SESSION_PATH, TASK_PATH
from tests.container.agent_helpers import BASH_HELLO, RUN_ID, scripted_host, tool_messages
from tests.container.scripted_llm import Refusal, ScriptedLLM, TextReply, ToolCallReply

# --- runs that fail -----------------------------------------------------------------------------


async def test_tool_failure_goes_back_to_the_model(paths: ContainerPaths) -> None:
    host = scripted_host(paths, [ToolCallReply("read_file", {"path": "missing.txt"}), TextReply("no such file")])
    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    (tool_message,) = tool_messages(host.requests[1])
    assert "missing.txt: No such file or directory" in tool_message


async def test_step_limit_fails_the_run_and_saves_no_session(paths: ContainerPaths) -> None:
    host = scripted_host(paths, [BASH_HELLO, TextReply("never reached")], max_steps=1)
    async with host:
        assert await run_main(paths) == EXIT_FAILED

    (result,) = host.results
    assert result.status == "failed"
    assert result.error == "step limit reached: 1 model requests"
    assert (result.input_tokens, result.output_tokens) == (11, 7)
    assert host.sessions == []


async def test_llm_error_fails_the_run_with_the_reason(paths: ContainerPaths) -> None:
    host = scripted_host(paths, [])
    async with host:
        assert await run_main(paths) == EXIT_FAILED

    (result,) = host.results
    assert result.status == "failed"
    assert result.error is not None and "500" in result.error and "script has only 0 replies" in result.error


async def test_refused_session_is_logged_and_the_run_still_completes(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    refusals = {SESSION_PATH: Refusal(400, "session not kept: too odd")}
    host = scripted_host(paths, [TextReply("the answer")], refusals=refusals)

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    assert [(r.status, r.result) for r in host.results] == [("completed", "the answer")]
    assert host.sessions == []
    assert "the session was not saved" in capsys.readouterr().out


async def test_refused_result_exits_failed(paths: ContainerPaths, capsys: pytest.CaptureFixture[str]) -> None:
    refusals = {RESULT_PATH: Refusal(403, f"run {RUN_ID} is cancelled or finished")}
    host = scripted_host(paths, [TextReply("too late")], refusals=refusals)

    async with host:
        assert await run_main(paths) == EXIT_FAILED

    assert host.results == []
    assert f"the result could not be reported: ChannelRefused: run {RUN_ID} is cancelled" in capsys.readouterr().out


# --- no usable task -----------------------------------------------------------------------------


async def test_channel_refusing_the_task_exits_bad_task(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    refusals = {TASK_PATH: Refusal(403, f"run {RUN_ID} is cancelled or finished")}
    host = scripted_host(paths, [TextReply("unreached")], refusals=refusals)

    async with host:
        assert await run_main(paths) == EXIT_BAD_TASK

    assert (host.requests, host.results, host.sessions) == ([], [], [])
    logs = capsys.readouterr().out
    assert f"no usable task from the run channel: ChannelRefused: run {RUN_ID} is cancelled or finished" in logs


async def test_channel_without_a_task_exits_bad_task(paths: ContainerPaths) -> None:
    host = ScriptedLLM(paths.channel_socket, [TextReply("unreached")], task=None)

    async with host:
        assert await run_main(paths) == EXIT_BAD_TASK

    assert (host.requests, host.results) == ([], [])


async def test_missing_channel_exits_bad_task(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real channel retries connecting for about 30 s and the agent waits up to 15 minutes for a host
    # that restarts; one attempt and no wait say the same. run_main reads the delays from its own module
    # (container/__main__.py), so that is the name to replace.
    monkeypatch.setattr("container.__main__.CONNECT_RETRY_DELAYS_SECONDS", ())
    monkeypatch.setattr("container.channel.HOST_AWAY_SECONDS", 0.0)

    assert await run_main(paths) == EXIT_BAD_TASK

    logs = capsys.readouterr().out
    assert "no usable task from the run channel: ConnectionError: the run channel did not answer GET /run/task" in logs


async def test_channel_that_comes_up_late_is_waited_for(paths: ContainerPaths) -> None:
    """The socket is missing while the host restarts: the agent retries connecting, then runs."""
    run = asyncio.create_task(run_main(paths))
    await asyncio.sleep(0.3)
    assert not run.done()

    async with scripted_host(paths, [TextReply("late but fine")]) as host:
        assert await asyncio.wait_for(run, timeout=30) == EXIT_COMPLETED

    assert [r.result for r in host.results] == ["late but fine"]


async def test_host_dying_with_the_task_request_in_flight_is_waited_for(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host is killed while GET /run/task is unanswered (the request fails with a read error, which is
    no connect error the transport retries): the agent asks again once the host is back, and runs."""
    monkeypatch.setattr("container.channel.HOST_FIRST_RETRY_SECONDS", 0.05)
    asked = asyncio.Event()

    async def die_on_first_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        asked.set()
        writer.transport.abort()  # like a SIGKILL: no answer, the connection reset

    dying = await asyncio.start_unix_server(die_on_first_request, path=str(paths.channel_socket))
    run = asyncio.create_task(run_main(paths))
    await asyncio.wait_for(asked.wait(), timeout=10)
    dying.close()
    await dying.wait_closed()
    paths.channel_socket.unlink(missing_ok=True)

    async with scripted_host(paths, [TextReply("after the restart")]) as host:
        assert await asyncio.wait_for(run, timeout=30) == EXIT_COMPLETED

    assert [r.result for r in host.results] == ["after the restart"]
    assert "the task: the host is not answering; trying again" in capsys.readouterr().out


async def test_arguments_that_do_not_fit_go_back_to_the_model_to_fix(paths: ContainerPaths) -> None:
    """The host validates the whole conversation each step: the retried tool return must be a valid part."""
    replies = [ToolCallReply("bash", {"cmd": "ls"}), ToolCallReply("no_such_tool", {}), TextReply("fixed")]
    host = scripted_host(paths, replies)
    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    (first,) = tool_messages(host.requests[1])
    assert "unknown argument 'cmd'" in first and "missing argument 'command'" in first
    second = tool_messages(host.requests[2])[-1]  # the conversation so far: the first one, then this one
    assert "unknown tool 'no_such_tool'" in second
    assert [r.result for r in host.results] == ["fixed"]


async def test_a_model_that_never_fits_the_arguments_fails_the_run(paths: ContainerPaths) -> None:
    host = scripted_host(paths, [ToolCallReply("bash", {"cmd": "ls"})] * 5)
    async with host:
        assert await run_main(paths) == EXIT_FAILED

    (result,) = host.results
    assert result.error is not None and result.error.startswith("tool 'bash': arguments did not fit 4 times")
