"""The whole container agent on the host, against a scripted OpenAI-compatible server on its socket."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models import override_allow_model_requests

from container.__main__ import EXIT_BAD_TASK, EXIT_COMPLETED, EXIT_FAILED, run_main
from container.paths import IPC_DIR_ENV, RUN_DIR_ENV, WORKSPACE_DIR_ENV, ContainerPaths
from container.protocol import RunResult, TaskSpec, write_json_atomic
from container.session import load_history
from tests.container.scripted_llm import ScriptedLLM, TextReply, ToolCallReply

REPO_ROOT = Path(__file__).resolve().parents[2]
BASH_HELLO = ToolCallReply("bash", {"command": "echo hello > out.txt && cat out.txt"})
TOOL_NAMES = {"bash", "read_file", "write_file", "edit_file", "list_files", "send_message"}


@pytest.fixture
def paths(tmp_path: Path) -> ContainerPaths:
    paths = ContainerPaths(run_dir=tmp_path / "run", ipc_dir=tmp_path / "ipc", workspace_dir=tmp_path / "workspace")
    for folder in (paths.run_dir, paths.ipc_dir, paths.workspace_dir):
        folder.mkdir()
    return paths


@pytest.fixture(autouse=True)
def allow_requests_to_the_local_fake() -> Iterator[None]:
    with override_allow_model_requests(True):
        yield


def write_task(paths: ContainerPaths, **overrides: Any) -> TaskSpec:
    fields: dict[str, Any] = {"run_id": "run-abc123", "task": "Say hello via a file.", "label": "hello"}
    task = TaskSpec(**(fields | overrides))
    write_json_atomic(paths.task_file, task)
    return task


def read_result(paths: ContainerPaths) -> RunResult:
    return RunResult.model_validate_json(paths.result_file.read_bytes())


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], str)]


async def test_run_uses_bash_then_answers(paths: ContainerPaths) -> None:
    write_task(paths, context=["alice: can you check?", "bob: please"])
    llm = ScriptedLLM(paths.llm_socket, [BASH_HELLO, TextReply("The file says hello.")])

    async with llm:
        exit_code = await run_main(paths)

    assert exit_code == EXIT_COMPLETED
    result = read_result(paths)
    assert (result.run_id, result.status, result.result, result.error) == (
        "run-abc123",
        "completed",
        "The file says hello.",
        None,
    )
    assert (result.input_tokens, result.output_tokens) == (22, 14)
    assert (paths.workspace_dir / "out.txt").read_text() == "hello\n"

    first, second = llm.requests
    assert {tool["function"]["name"] for tool in first["tools"]} == TOOL_NAMES
    prompt = user_texts(first)[0]
    assert "Say hello via a file." in prompt
    assert "Recent chat messages:\nalice: can you check?\nbob: please" in prompt
    tool_results = [m["content"] for m in second["messages"] if m["role"] == "tool"]
    assert tool_results == ["hello\n[exit code: 0]"]

    history = load_history(paths.session_out_file)
    assert isinstance(history[-1], ModelResponse)
    calls = [p for m in history for p in m.parts if isinstance(p, ToolCallPart)]
    assert [(c.tool_name, c.args_as_dict()) for c in calls] == [("bash", BASH_HELLO.arguments)]


async def test_anthropic_wire_format_through_the_socket(paths: ContainerPaths) -> None:
    write_task(paths, provider_kind="anthropic", model="claude-scripted")
    llm = ScriptedLLM(paths.llm_socket, [BASH_HELLO, TextReply("Anthropic says hello.")])

    async with llm:
        assert await run_main(paths) == EXIT_COMPLETED

    result = read_result(paths)
    assert (result.status, result.result, result.input_tokens) == ("completed", "Anthropic says hello.", 22)
    first, second = llm.requests
    assert first["model"] == "claude-scripted"
    assert {tool["name"] for tool in first["tools"]} == TOOL_NAMES
    tool_results = [
        block
        for m in second["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]
    assert [result["content"] for result in tool_results] == [[{"type": "text", "text": "hello\n[exit code: 0]"}]]


async def test_second_run_continues_the_session(paths: ContainerPaths) -> None:
    write_task(paths)
    async with ScriptedLLM(paths.llm_socket, [BASH_HELLO, TextReply("first answer")]):
        assert await run_main(paths) == EXIT_COMPLETED
    paths.session_in_file.write_bytes(paths.session_out_file.read_bytes())
    paths.session_out_file.unlink()

    write_task(paths, task="And now?")
    llm = ScriptedLLM(paths.llm_socket, [TextReply("second answer")])
    async with llm:
        assert await run_main(paths) == EXIT_COMPLETED

    (request,) = llm.requests
    assert user_texts(request)[0].endswith("Say hello via a file.")
    assert user_texts(request)[-1].endswith("And now?")
    assert any(m["role"] == "tool" and "hello" in m["content"] for m in request["messages"])
    assert {"role": "assistant", "content": "first answer"}.items() <= next(
        m for m in request["messages"] if m.get("content") == "first answer"
    ).items()
    history = load_history(paths.session_out_file)
    returns = [p for m in history if isinstance(m, ModelRequest) for p in m.parts]
    assert sum(isinstance(p, ToolReturnPart) for p in returns) == 1
    assert read_result(paths).result == "second answer"


async def test_send_message_reaches_the_ipc_folder(paths: ContainerPaths) -> None:
    write_task(paths)
    script = [ToolCallReply("send_message", {"text": "working on it"}), TextReply("done")]
    async with ScriptedLLM(paths.llm_socket, script):
        assert await run_main(paths) == EXIT_COMPLETED

    (message_file,) = (paths.ipc_dir / "messages").iterdir()
    message = json.loads(message_file.read_text())
    assert (message["text"], message["run_id"]) == ("working on it", "run-abc123")


async def test_tool_failure_goes_back_to_the_model(paths: ContainerPaths) -> None:
    write_task(paths)
    script = [ToolCallReply("read_file", {"path": "missing.txt"}), TextReply("no such file, sorry")]
    llm = ScriptedLLM(paths.llm_socket, script)
    async with llm:
        assert await run_main(paths) == EXIT_COMPLETED

    tool_message = next(m for m in llm.requests[1]["messages"] if m["role"] == "tool")
    assert "missing.txt: No such file or directory" in tool_message["content"]


async def test_step_limit_fails_the_run(paths: ContainerPaths) -> None:
    write_task(paths, max_steps=1)
    async with ScriptedLLM(paths.llm_socket, [BASH_HELLO, TextReply("never reached")]):
        assert await run_main(paths) == EXIT_FAILED

    result = read_result(paths)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("step limit reached")
    assert not paths.session_out_file.exists()


async def test_missing_llm_socket_fails_the_run(paths: ContainerPaths) -> None:
    write_task(paths)
    assert await run_main(paths) == EXIT_FAILED
    error = read_result(paths).error
    assert error is not None and "llm.sock does not exist" in error


async def test_llm_error_fails_the_run_with_the_reason(paths: ContainerPaths) -> None:
    write_task(paths)
    async with ScriptedLLM(paths.llm_socket, []):
        assert await run_main(paths) == EXIT_FAILED
    error = read_result(paths).error
    assert error is not None and "500" in error and "script has only 0 replies" in error


async def test_unusable_session_fails_the_run(paths: ContainerPaths) -> None:
    write_task(paths)
    paths.session_in_file.write_text('[{"kind": "nonsense"}]')
    async with ScriptedLLM(paths.llm_socket, [TextReply("unreached")]) as llm:
        assert await run_main(paths) == EXIT_FAILED
    assert llm.requests == []
    error = read_result(paths).error
    assert error is not None and error.startswith("unusable session: session_in.json is not")


async def test_unusable_task_file_exits_2_and_keeps_the_run_id(paths: ContainerPaths) -> None:
    paths.task_file.write_text(json.dumps({"run_id": "run-abc123", "label": "x"}))

    assert await run_main(paths) == EXIT_BAD_TASK

    result = read_result(paths)
    assert (result.run_id, result.status) == ("run-abc123", "failed")
    assert result.error is not None and "task: Field required" in result.error


async def test_missing_task_file_exits_2(paths: ContainerPaths) -> None:
    assert await run_main(paths) == EXIT_BAD_TASK
    result = read_result(paths)
    assert (result.run_id, result.status) == ("unknown", "failed")
    assert result.error is not None and "task.json cannot be read" in result.error


async def test_sigterm_stops_the_process_and_still_reports(paths: ContainerPaths) -> None:
    """`python -m container` as a process: SIGTERM mid-command ends it at once with a failed result."""
    write_task(paths)
    environ = {
        **os.environ,
        RUN_DIR_ENV: str(paths.run_dir),
        IPC_DIR_ENV: str(paths.ipc_dir),
        WORKSPACE_DIR_ENV: str(paths.workspace_dir),
    }
    script = [ToolCallReply("bash", {"command": "echo $$ > shell.pid; sleep 60"})]
    async with ScriptedLLM(paths.llm_socket, script):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "container", cwd=REPO_ROOT, env=environ, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(30):
                while b"tool bash(" not in await process.stdout.readline():
                    pass
                await asyncio.to_thread(wait_for_file, paths.workspace_dir / "shell.pid")
                process.send_signal(signal.SIGTERM)
                exit_code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    assert exit_code == EXIT_FAILED
    assert read_result(paths).error == "stopped by a signal"
    assert not is_running(int(read_text(paths.workspace_dir / "shell.pid"))), "the command outlived the agent"


def wait_for_file(path: Path) -> None:
    while not path.exists():
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
