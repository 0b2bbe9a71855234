"""The whole container agent on the host, against a scripted host serving its run channel on a socket: runs
that complete (results, sessions continued and trimmed, both wire formats) and progress messages."""

from __future__ import annotations

import json
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

from container.__main__ import EXIT_COMPLETED, run_main
from container.paths import ContainerPaths
from container.protocol import MAX_RESULT_CHARS, MAX_SESSION_BYTES, RunResult
from tests.container.agent_helpers import BASH_HELLO, PROMPT, RUN_ID, scripted_host, tool_messages, user_texts
from tests.container.scripted_llm import TextReply, ToolCallReply

TOOL_NAMES = {"bash", "read_file", "write_file", "edit_file", "list_files", "send_message", "send_file", "ask_chat"}


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
    assert f"run {RUN_ID}: 4 prior messages" in capsys.readouterr().out


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
    assert f"run {RUN_ID}: the prior session is not a message history; starting fresh" in logs
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


def as_json_values(messages: list[ModelMessage]) -> list[Any]:
    """A history the way the host puts it into a task: pydantic-ai messages as JSON values."""
    values: list[Any] = json.loads(ModelMessagesTypeAdapter.dump_json(messages))
    return values


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
