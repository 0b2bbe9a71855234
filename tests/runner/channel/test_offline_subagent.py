"""The offline subagent model: runs the task's `$ ` lines through the bash tool and its `send_file` lines through
the send_file tool, one per turn in line order, then reports."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runner.channel.offline_subagent import (
    MAX_OUTPUT_CHARS_PER_COMMAND,
    Action,
    OfflineRequestError,
    OfflineSubagentModel,
    parse_actions,
    parse_commands,
    stream_chunks,
)

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the workspace.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
SEND_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "send_file",
        "description": "Send a file from the workspace to the chat.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "caption": {"type": "string"}},
            "required": ["path"],
        },
    },
}
TASK = "Check the workspace\n$ ls -la\nsome prose in between\n  $ cat notes.txt\n"
# As `make run`'s demo hands it over: the chat's `background: $ wc -l ...` line, then a send_file line.
FILES_TASK = "$ wc -l inbox/data.csv > report.txt\n  send_file report.txt  The line count \nsend_file  out.png"


@pytest.fixture
def model() -> OfflineSubagentModel:
    return OfflineSubagentModel(clock=lambda: 1_700_000_000.0)


def request(messages: list[dict[str, Any]], tools: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": "offline", "messages": messages, "tools": [BASH_TOOL] if tools is None else tools, **extra}


def message(completion: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = completion["choices"][0]["message"]
    return result


def tool_call(completion: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    [call] = message(completion)["tool_calls"]
    return call["id"], call["function"]["name"], json.loads(call["function"]["arguments"])


def run_conversation(
    model: OfflineSubagentModel,
    history: list[dict[str, Any]],
    outputs: dict[str, str],
    tools: list[Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Play the agent loop: answer every call from `outputs` (by its command or path) until the model answers
    in text."""
    messages = list(history)
    for _ in range(20):
        completion = model.complete(request(messages, tools))
        reply = message(completion)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return messages, completion
        call_id, _, arguments = tool_call(completion)
        output = outputs[arguments.get("command") or arguments["path"]]
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    raise AssertionError("the model never finished")


def test_commands_are_the_dollar_lines() -> None:
    assert parse_commands(TASK) == ["ls -la", "cat notes.txt"]
    assert parse_commands("$no-space\n$ \n  $   echo  spaced  \nprice: $ 5") == ["echo  spaced"]
    assert parse_commands("no commands at all") == []


def test_send_file_lines_are_calls_in_line_order_with_the_commands() -> None:
    assert parse_actions(FILES_TASK) == [
        Action("bash", {"command": "wc -l inbox/data.csv > report.txt"}, "$ wc -l inbox/data.csv > report.txt"),
        Action(
            "send_file",
            {"path": "report.txt", "caption": "The line count"},
            "send_file report.txt  The line count",
        ),
        Action("send_file", {"path": "out.png"}, "send_file  out.png"),
    ]
    # Only a line that starts with the word and names a path: not prose, not the task text's own mention.
    prose = "To send it, call send_file(path, caption).\nsend_file\nsend_files a.txt\nplease send_file a.txt"
    assert parse_actions(prose) == []


def test_a_task_typed_on_one_line_separates_its_lines_with_double_semicolons() -> None:
    one_line = "$ wc -l inbox/data.csv > n.txt ;; send_file n.txt the count ;; $ case x in x) echo ok;; esac"
    assert [action.tool for action in parse_actions(one_line)] == ["bash", "send_file", "bash"]
    assert parse_actions(one_line)[1].arguments == {"path": "n.txt", "caption": "the count"}
    assert parse_commands("$ echo a;;b") == ["echo a;;b"]  # only ` ;; ` with its blanks separates


def test_send_file_lines_call_the_send_file_tool_then_the_report_lists_them(model: OfflineSubagentModel) -> None:
    outputs = {
        "wc -l inbox/data.csv > report.txt": "",
        "report.txt": "sent report.txt (12 bytes) to the chat (sent)",
        "out.png": '{"error":"out.png: No such file or directory"}',
    }

    messages, final = run_conversation(
        model, [{"role": "user", "content": FILES_TASK}], outputs, tools=[BASH_TOOL, SEND_FILE_TOOL]
    )

    calls = [m["tool_calls"][0]["function"] for m in messages if m.get("tool_calls")]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("bash", {"command": "wc -l inbox/data.csv > report.txt"}),
        ("send_file", {"path": "report.txt", "caption": "The line count"}),
        ("send_file", {"path": "out.png"}),
    ]
    assert message(final)["content"] == (
        "Ran 1 command(s), 2 send_file call(s).\n"
        "$ wc -l inbox/data.csv > report.txt\n(no output)\n"
        "send_file report.txt  The line count\nsent report.txt (12 bytes) to the chat (sent)\n"
        'send_file  out.png\n{"error":"out.png: No such file or directory"}'
    )


def test_send_file_lines_without_the_tool_are_listed_as_not_done(model: OfflineSubagentModel) -> None:
    outputs = {"wc -l inbox/data.csv > report.txt": "3"}

    _, final = run_conversation(model, [{"role": "user", "content": FILES_TASK}], outputs)

    assert message(final)["content"] == (
        "Ran 1 command(s).\n$ wc -l inbox/data.csv > report.txt\n3\n"
        "Also in the task, but the `send_file` tool is not available. Not done:\n"
        "send_file report.txt  The line count\nsend_file  out.png"
    )
    only_files = model.complete(request([{"role": "user", "content": "send_file a.txt"}], tools=[]))
    assert message(only_files)["content"] == (
        "I cannot run commands here: the `send_file` tool is not available. Not done:\nsend_file a.txt"
    )


def test_first_turn_calls_bash_with_the_first_command(model: OfflineSubagentModel) -> None:
    completion = model.complete(request([{"role": "system", "content": "be brief"}, {"role": "user", "content": TASK}]))

    call_id, name, arguments = tool_call(completion)
    assert (name, arguments) == ("bash", {"command": "ls -la"})
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert message(completion)["content"] is None
    assert completion["object"] == "chat.completion" and completion["created"] == 1_700_000_000
    usage = completion["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # Deterministic: the same request gives the same id.
    again = model.complete(request([{"role": "system", "content": "be brief"}, {"role": "user", "content": TASK}]))
    assert tool_call(again)[0] == call_id


def test_each_tool_result_leads_to_the_next_command_then_a_report(model: OfflineSubagentModel) -> None:
    outputs = {"ls -la": "total 0\nnotes.txt\n", "cat notes.txt": ""}

    messages, final = run_conversation(model, [{"role": "user", "content": TASK}], outputs)

    calls = [m["tool_calls"][0] for m in messages if m.get("tool_calls")]
    assert [json.loads(c["function"]["arguments"])["command"] for c in calls] == ["ls -la", "cat notes.txt"]
    assert len({c["id"] for c in calls}) == 2
    assert message(final)["content"] == "Ran 2 command(s).\n$ ls -la\ntotal 0\nnotes.txt\n$ cat notes.txt\n(no output)"
    assert final["choices"][0]["finish_reason"] == "stop"


def test_long_output_is_trimmed(model: OfflineSubagentModel) -> None:
    long_output = "x" * (MAX_OUTPUT_CHARS_PER_COMMAND + 500)

    _, final = run_conversation(model, [{"role": "user", "content": "$ yes x"}], {"yes x": long_output})

    content = message(final)["content"]
    assert "[500 more characters]" in content and len(content) < MAX_OUTPUT_CHARS_PER_COMMAND + 100


def test_only_the_last_user_message_is_the_task(model: OfflineSubagentModel) -> None:
    first_session, _ = run_conversation(model, [{"role": "user", "content": "$ echo old"}], {"echo old": "old"})
    history = [*first_session, {"role": "user", "content": "Now this\n$ echo new"}]

    completion = model.complete(request(history))
    call_id, _, arguments = tool_call(completion)
    assert arguments == {"command": "echo new"}
    assert call_id not in {m["tool_calls"][0]["id"] for m in first_session if m.get("tool_calls")}

    _, final = run_conversation(model, history, {"echo new": "new"})
    assert message(final)["content"] == "Ran 1 command(s).\n$ echo new\nnew"


def test_same_task_twice_in_history_gets_fresh_ids(model: OfflineSubagentModel) -> None:
    first_session, _ = run_conversation(model, [{"role": "user", "content": "$ date"}], {"date": "today"})
    again = model.complete(request([*first_session, {"role": "user", "content": "$ date"}]))
    old_ids = {m["tool_calls"][0]["id"] for m in first_session if m.get("tool_calls")}
    assert tool_call(again)[0] not in old_ids


def test_no_commands_gets_a_plain_reply_quoting_the_task(model: OfflineSubagentModel) -> None:
    completion = model.complete(request([{"role": "user", "content": "\n  Summarise the repo\nplease"}]))

    content = message(completion)["content"]
    assert "no commands to run" in content and '"Summarise the repo"' in content
    assert "tool_calls" not in message(completion)


def test_without_the_bash_tool_it_answers_in_text(model: OfflineSubagentModel) -> None:
    for completion in (
        model.complete(request([{"role": "user", "content": TASK}], tools=[])),
        model.complete(request([{"role": "user", "content": TASK}], tool_choice="none")),
    ):
        content = message(completion)["content"]
        assert "`bash` tool is not available" in content and "$ ls -la\n$ cat notes.txt" in content


def test_content_parts_and_other_argument_names(model: OfflineSubagentModel) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {"timeout": {"type": "number"}, "cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
    }
    parts = [{"type": "text", "text": "Do it\n"}, {"type": "text", "text": "$ uname -a"}]

    completion = model.complete(request([{"role": "user", "content": parts}], tools=[tool]))

    assert tool_call(completion)[2] == {"cmd": "uname -a"}


def test_required_tool_choice_sends_the_report_through_the_output_tool(model: OfflineSubagentModel) -> None:
    output_tool = {
        "type": "function",
        "function": {
            "name": "final_result",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
        },
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": "$ true"}]
    first = model.complete(request(messages, tools=[BASH_TOOL, output_tool], tool_choice="required"))
    call_id, name, _ = tool_call(first)
    assert name == "bash"
    messages += [message(first), {"role": "tool", "tool_call_id": call_id, "content": ""}]

    final = model.complete(request(messages, tools=[BASH_TOOL, output_tool], tool_choice="required"))

    _, name, arguments = tool_call(final)
    assert name == "final_result" and arguments == {"summary": "Ran 1 command(s).\n$ true\n(no output)"}


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"role": "system", "content": "no task"}]},
        {"messages": [1]},
    ],
)
def test_malformed_requests_are_refused(model: OfflineSubagentModel, bad: dict[str, Any]) -> None:
    with pytest.raises(OfflineRequestError):
        model.complete(bad)


def test_stream_chunks_carry_the_same_answer(model: OfflineSubagentModel) -> None:
    call = model.complete(request([{"role": "user", "content": "$ ls"}]))
    chunks = stream_chunks(call, include_usage=True)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 3
    delta = chunks[0]["choices"][0]["delta"]
    assert delta["tool_calls"][0]["index"] == 0 and delta["tool_calls"][0]["id"] == tool_call(call)[0]
    assert chunks[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[2]["choices"] == [] and chunks[2]["usage"] == call["usage"]

    text = model.complete(request([{"role": "user", "content": "nothing to run"}]))
    text_chunks = stream_chunks(text, include_usage=False)
    assert len(text_chunks) == 2 and text_chunks[0]["choices"][0]["delta"]["content"] == message(text)["content"]
