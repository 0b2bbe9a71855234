"""The whole container agent on the host, against a scripted host serving its run channel on a socket."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import override_allow_model_requests

from container.__main__ import EXIT_BAD_TASK, EXIT_COMPLETED, EXIT_FAILED, run_main
from container.paths import CHANNEL_SOCKET_ENV, WORKSPACE_DIR_ENV, ContainerPaths
from container.protocol import (
    CHANNEL_SOCKET_FILE,
    MAX_RESULT_CHARS,
    MAX_SESSION_BYTES,
    RESULT_PATH,
    SESSION_PATH,
    TASK_PATH,
    RunResult,
    TaskSpec,
)
from tests.container.scripted_llm import Refusal, Reply, ScriptedLLM, TextReply, ToolCallReply

REPO_ROOT = Path(__file__).resolve().parents[2]
BASH_HELLO = ToolCallReply("bash", {"command": "echo hello > out.txt && cat out.txt"})
TOOL_NAMES = {"bash", "read_file", "write_file", "edit_file", "list_files", "send_message"}
RUN_ID = "run-abc123"
PROCESS_START_SECONDS = 120
STOP_SECONDS = 30
PROMPT = "Task (hello):\nSay hello via a file."  # build_prompt of make_task()


@pytest.fixture
def paths(tmp_path: Path) -> ContainerPaths:
    paths = ContainerPaths(
        channel_socket=tmp_path / "channel" / CHANNEL_SOCKET_FILE, workspace_dir=tmp_path / "workspace"
    )
    paths.channel_socket.parent.mkdir()
    paths.workspace_dir.mkdir()
    return paths


@pytest.fixture(autouse=True)
def allow_requests_to_the_local_fake() -> Iterator[None]:
    with override_allow_model_requests(True):
        yield


def make_task(**overrides: Any) -> TaskSpec:
    fields: dict[str, Any] = {"run_id": RUN_ID, "task": "Say hello via a file.", "label": "hello"}
    return TaskSpec(**(fields | overrides))


def scripted_host(
    paths: ContainerPaths, replies: Sequence[Reply], *, refusals: dict[str, Refusal] | None = None, **task: Any
) -> ScriptedLLM:
    return ScriptedLLM(paths.channel_socket, replies, task=make_task(**task), refusals=refusals or {})


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], str)]


def tool_messages(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def as_json_values(messages: list[ModelMessage]) -> list[Any]:
    """A history the way the host puts it into a task: pydantic-ai messages as JSON values."""
    values: list[Any] = json.loads(ModelMessagesTypeAdapter.dump_json(messages))
    return values


# --- runs that complete -------------------------------------------------------------------------


async def test_run_uses_bash_then_answers_and_reports_result_and_session(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    host = scripted_host(paths, [BASH_HELLO, TextReply("The file says hello.")], context=["alice: check?", "bob: pls"])

    async with host:
        exit_code = await run_main(paths)

    assert exit_code == EXIT_COMPLETED
    assert host.results == [
        RunResult(status="completed", result="The file says hello.", error=None, input_tokens=22, output_tokens=14)
    ]
    assert (paths.workspace_dir / "out.txt").read_text() == "hello\n"

    first, second = host.requests
    assert {tool["function"]["name"] for tool in first["tools"]} == TOOL_NAMES
    prompt = user_texts(first)[0]
    assert "Say hello via a file." in prompt
    assert "Recent chat messages:\nalice: check?\nbob: pls" in prompt
    assert tool_messages(second) == ["hello\n[exit code: 0]"]

    history = host.saved_history()
    assert [type(message) for message in history] == [ModelRequest, ModelResponse, ModelRequest, ModelResponse]
    calls = [p for m in history for p in m.parts if isinstance(p, ToolCallPart)]
    assert [(c.tool_name, c.args_as_dict()) for c in calls] == [("bash", BASH_HELLO.arguments)]
    assert history[-1].parts == [TextPart(content="The file says hello.")]
    assert host.messages == []
    logs = capsys.readouterr().out
    assert f"crewbot-agent: run {RUN_ID}: starting task 'hello'" in logs
    assert f"crewbot-agent: run {RUN_ID}: completed (22 in / 14 out tokens)" in logs


async def test_an_answer_over_the_channel_limit_is_reported_cut(paths: ContainerPaths) -> None:
    answer = "line of a very long answer\n" * (MAX_RESULT_CHARS // 10)
    host = scripted_host(paths, [TextReply(answer)])

    async with host:
        exit_code = await run_main(paths)

    assert exit_code == EXIT_COMPLETED
    (result,) = host.results
    assert result.status == "completed" and len(result.result) <= MAX_RESULT_CHARS
    assert answer.startswith(result.result.rsplit("\n… [", 1)[0])
    assert result.result.endswith(f"[the answer had {len(answer)} characters; cut to fit the channel]")


async def test_anthropic_wire_format_through_the_socket(paths: ContainerPaths) -> None:
    host = scripted_host(
        paths, [BASH_HELLO, TextReply("Anthropic says hello.")], provider_kind="anthropic", model="claude-scripted"
    )

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    (result,) = host.results
    assert (result.status, result.result, result.input_tokens) == ("completed", "Anthropic says hello.", 22)
    first, second = host.requests
    assert first["model"] == "claude-scripted"
    assert {tool["name"] for tool in first["tools"]} == TOOL_NAMES
    tool_results = [
        block
        for m in second["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]
    assert [block["content"] for block in tool_results] == [[{"type": "text", "text": "hello\n[exit code: 0]"}]]
    assert len(host.saved_history()) == 4


async def test_prior_history_in_the_task_is_continued(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    first_host = scripted_host(paths, [BASH_HELLO, TextReply("first answer")])
    async with first_host:
        assert await run_main(paths) == EXIT_COMPLETED
    (first_session,) = first_host.sessions

    second_host = scripted_host(paths, [TextReply("second answer")], task="And now?", history=json.loads(first_session))
    async with second_host:
        assert await run_main(paths) == EXIT_COMPLETED

    (request,) = second_host.requests
    assert user_texts(request)[0].endswith("Say hello via a file.")
    assert user_texts(request)[-1].endswith("And now?")
    assert tool_messages(request) == ["hello\n[exit code: 0]"]
    assert {"role": "assistant", "content": "first answer"}.items() <= next(
        m for m in request["messages"] if m.get("content") == "first answer"
    ).items()
    history = second_host.saved_history()
    assert len(history) == 6
    returns = [p for m in history if isinstance(m, ModelRequest) for p in m.parts]
    assert sum(isinstance(p, ToolReturnPart) for p in returns) == 1
    assert [r.result for r in second_host.results] == ["second answer"]
    assert f"run {RUN_ID}: model offline-subagent (openai), 4 prior messages" in capsys.readouterr().out


async def test_unusable_history_is_dropped_with_a_log_line_and_the_run_completes(
    paths: ContainerPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    host = scripted_host(paths, [TextReply("fresh answer")], history=[{"kind": "nonsense"}, 42])

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    assert [(r.status, r.result) for r in host.results] == [("completed", "fresh answer")]
    (request,) = host.requests
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert user_texts(request)[0].endswith("Say hello via a file.")
    assert len(host.saved_history()) == 2
    logs = capsys.readouterr().out
    assert f"run {RUN_ID}: the prior session is not a message history (2 errors); starting fresh" in logs
    assert "0 prior messages" in logs


async def test_session_upload_is_trimmed_to_the_channel_limit(paths: ContainerPaths) -> None:
    big = MAX_SESSION_BYTES // 2 + 1_000  # two such exchanges are over the limit; one and this run fit
    prior: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content="old " + "a" * big)]),
        ModelResponse(parts=[TextPart(content="old answer")]),
        ModelRequest(parts=[UserPromptPart(content="recent " + "b" * big)]),
        ModelResponse(parts=[TextPart(content="recent answer")]),
    ]
    host = scripted_host(paths, [TextReply("new answer")], history=as_json_values(prior))

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    (request,) = host.requests
    assert user_texts(request)[0].startswith("old a")  # the run itself saw the whole history
    (session,) = host.sessions
    assert MAX_SESSION_BYTES // 2 < len(session) <= MAX_SESSION_BYTES
    # The oldest messages went (the host trims the rest to start at a user prompt); the newest stayed.
    kept = part_texts(host.saved_history())
    everything = [*part_texts([*prior, ModelRequest(parts=[UserPromptPart(content=PROMPT)])]), "new answer"]
    assert 0 < len(kept) < len(everything)
    assert kept == everything[-len(kept) :]
    assert kept[-4:] == ["recent " + "b" * big, "recent answer", PROMPT, "new answer"]
    assert [r.status for r in host.results] == ["completed"]


def part_texts(messages: list[ModelMessage]) -> list[str]:
    parts = [part for message in messages for part in message.parts]
    return [
        part.content for part in parts if isinstance(part, (UserPromptPart, TextPart)) and isinstance(part.content, str)
    ]


# --- progress messages --------------------------------------------------------------------------


async def test_send_message_goes_over_the_channel(paths: ContainerPaths) -> None:
    host = scripted_host(paths, [ToolCallReply("send_message", {"text": "working on it"}), TextReply("done")])

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    assert [message.text for message in host.messages] == ["working on it"]
    assert tool_messages(host.requests[1]) == ["message sent (sent)"]


async def test_messages_over_the_budget_are_refused_with_the_hosts_reason(paths: ContainerPaths) -> None:
    script = [
        ToolCallReply("send_message", {"text": "one"}),
        ToolCallReply("send_message", {"text": "two"}),
        TextReply("done anyway"),
    ]
    host = scripted_host(paths, script, max_messages=1)

    async with host:
        assert await run_main(paths) == EXIT_COMPLETED

    assert [message.text for message in host.messages] == ["one"]
    refused = tool_messages(host.requests[2])[-1]
    assert "the message was not sent: this run has sent its 1 progress messages" in refused
    assert [(r.status, r.result) for r in host.results] == [("completed", "done anyway")]


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
    # The real channel retries connecting for about 30 s (a host restart); one attempt says the same.
    monkeypatch.setattr("container.channel.CHANNEL_CONNECT_RETRIES", 0)

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


# --- the process --------------------------------------------------------------------------------


async def test_sigterm_stops_the_process_and_still_reports(paths: ContainerPaths) -> None:
    """`python -m container` as a process: SIGTERM mid-command ends it at once with a failed result."""
    environ = {
        **os.environ,
        CHANNEL_SOCKET_ENV: str(paths.channel_socket),
        WORKSPACE_DIR_ENV: str(paths.workspace_dir),
    }
    # The pid file appears whole (rename), so the signal never lands between its creation and its write.
    script = [ToolCallReply("bash", {"command": "echo $$ > shell.pid.tmp && mv shell.pid.tmp shell.pid; sleep 60"})]
    async with scripted_host(paths, script) as host:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "container", cwd=REPO_ROOT, env=environ, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(PROCESS_START_SECONDS):  # generous: a loaded machine starts Python slowly
                while b"tool bash(" not in await process.stdout.readline():
                    pass
                await asyncio.to_thread(wait_for_file, paths.workspace_dir / "shell.pid")
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(STOP_SECONDS):  # the command sleeps 60 s: only the signal ends it sooner
                exit_code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    assert exit_code == EXIT_FAILED
    assert [(r.status, r.error) for r in host.results] == [("failed", "stopped by a signal")]
    assert host.sessions == []
    assert not is_running(int(read_text(paths.workspace_dir / "shell.pid"))), "the command outlived the agent"


def wait_for_file(path: Path, timeout_seconds: float = PROCESS_START_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def read_text(path: Path) -> str:
    return path.read_text()


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
