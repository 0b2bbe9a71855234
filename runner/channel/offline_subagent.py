"""The offline subagent model: a deterministic stand-in for an LLM, speaking OpenAI chat completions.

It is not a language model. It lets the whole subagent path (container, agent loop, bash tool, LLM proxy,
result) run with no provider and no API key, and it makes that path testable. Its rules:

- The task is the text of the LAST user message (earlier ones belong to previous sessions).
- Every line of the task that starts with `$ ` (leading blanks allowed) is a shell command, run through the
  `bash` tool. Every line `send_file PATH [caption...]` (leading blanks allowed; PATH has no blanks) sends a
  file through the `send_file` tool, with `{"path": PATH}` and the caption if the line has one.
- Every line `ask_chat QUESTION` asks the chat through the `ask_chat` tool; ` | ` after the question separates
  the options (`ask_chat Which file? | a.txt | b.txt`), one button each.
- ` ;; ` separates lines too, for a task typed on one line: `$ wc -l inbox/data.csv > n.txt ;; send_file n.txt`.
- It makes these calls one at a time, in the task's line order: the first right after the task, the next
  after each tool result. After the last result it answers `Ran N command(s).` (`Ran N command(s), M
  send_file call(s).` when there were send_file lines) with each line and its (trimmed) tool result.
  With neither kind of line it says so, quoting the task's first line.
- A line whose tool is not offered is not done: the answer lists it. If no tool is offered, or
  `tool_choice` is `none`, it answers in text instead.
- If the request demands a tool call for the final answer (`tool_choice` `required` or naming a tool),
  the answer goes through the output tool (`final_result…`, pydantic-ai's name) instead of text.

Tool-call ids are derived from the task, its position and the call's index, so a replay gives the same
ids. Usage is estimated at four characters a token.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MODEL_NAME = "offline-subagent"
COMMAND_PREFIX = "$ "
LINE_SEPARATOR = " ;; "
BASH_TOOL_NAME = "bash"
BASH_ARGUMENT_NAME = "command"
SEND_FILE_TOOL_NAME = "send_file"
ASK_TOOL_NAME = "ask_chat"
ASK_PREFIX = "ask_chat "
OPTION_SEPARATOR = " | "
_SEND_FILE_LINE = re.compile(r"send_file[ \t]+(?P<path>\S+)(?:[ \t]+(?P<caption>.*\S))?[ \t]*")
OUTPUT_TOOL_PREFIX = "final_result"  # pydantic-ai names its output tools so
MAX_OUTPUT_CHARS_PER_COMMAND = 2_000
MAX_QUOTED_TASK_CHARS = 200
CHARS_PER_TOKEN = 4


class OfflineRequestError(ValueError):
    """The request is not a chat-completions request the offline model can answer (the proxy says 400)."""


@dataclass(frozen=True, slots=True)
class Action:
    """One tool call the task's lines ask for, and the line as the final answer shows it."""

    tool: str
    arguments: dict[str, Any]
    line: str


@dataclass(frozen=True, slots=True)
class _Progress:
    task: str
    task_index: int  # position of the task message in `messages`
    results: list[str]  # tool results that came after the task, in order


def parse_commands(task: str) -> list[str]:
    """The task's shell commands: lines that start with `$ `, without the prefix."""
    commands = []
    for line in task_lines(task):
        stripped = line.lstrip()
        if stripped.startswith(COMMAND_PREFIX):
            command = stripped.removeprefix(COMMAND_PREFIX).strip()
            if command:
                commands.append(command)
    return commands


def task_lines(task: str) -> list[str]:
    """The task's lines; ` ;; ` also ends one, so a task typed on one line (the console's) can have several."""
    return [part for line in task.splitlines() for part in line.split(LINE_SEPARATOR)]


def parse_actions(task: str) -> list[Action]:
    """The task's tool calls, in line order: `$ ` lines for bash, `send_file PATH [caption]` lines for send_file."""
    actions = []
    for line in task_lines(task):
        stripped = line.strip()
        if line.lstrip().startswith(COMMAND_PREFIX):
            command = line.lstrip().removeprefix(COMMAND_PREFIX).strip()
            if command:
                actions.append(Action(BASH_TOOL_NAME, {BASH_ARGUMENT_NAME: command}, f"{COMMAND_PREFIX}{command}"))
        elif stripped.startswith(ASK_PREFIX):
            question, *options = stripped.removeprefix(ASK_PREFIX).split(OPTION_SEPARATOR)
            arguments: dict[str, Any] = {"question": question.strip()}
            if options:
                arguments["options"] = [option.strip() for option in options]
            actions.append(Action(ASK_TOOL_NAME, arguments, stripped))
        elif match := _SEND_FILE_LINE.fullmatch(stripped):
            arguments = {"path": match["path"]}
            if match["caption"]:
                arguments["caption"] = match["caption"]
            actions.append(Action(SEND_FILE_TOOL_NAME, arguments, stripped))
    return actions


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text, whether `content` is a string or a list of typed parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return str(content)


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def trim_output(output: str, limit: int = MAX_OUTPUT_CHARS_PER_COMMAND) -> str:
    text = output.rstrip()
    if not text:
        return "(no output)"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… [{len(text) - limit} more characters]"


def _progress(messages: Sequence[Any]) -> _Progress:
    task_index = -1
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise OfflineRequestError(f"messages[{index}] is not an object")
        if message.get("role") == "user":
            task_index = index
    if task_index < 0:
        raise OfflineRequestError("no user message: the offline model needs a task")
    results = [message_text(m) for m in messages[task_index + 1 :] if m.get("role") == "tool"]
    return _Progress(task=message_text(messages[task_index]), task_index=task_index, results=results)


def _function_tools(request: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    tools: dict[str, Mapping[str, Any]] = {}
    for tool in request.get("tools") or []:
        if isinstance(tool, Mapping) and tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
            function = tool["function"]
            tools[str(function.get("name", ""))] = function
    return tools


def _argument_name(function: Mapping[str, Any], preferred: str) -> str:
    """The string parameter to fill: `preferred` if the schema has it, else the first required string."""
    parameters = function.get("parameters") or {}
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    if preferred in properties or not properties:
        return preferred
    strings = [
        name for name, schema in properties.items() if isinstance(schema, Mapping) and schema.get("type") == "string"
    ]
    required_strings = [name for name in parameters.get("required") or [] if name in strings]
    return str(next(iter([*required_strings, *strings, *properties])))


class OfflineSubagentModel:
    """Answers OpenAI chat-completions request JSON with completion JSON; see the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    def complete(self, request: Mapping[str, Any]) -> dict[str, Any]:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OfflineRequestError("`messages` must be a non-empty list")
        progress = _progress(messages)
        actions = parse_actions(progress.task)
        tools = _function_tools(request)
        tool_choice = request.get("tool_choice", "auto")
        digest = hashlib.sha256(f"{progress.task_index}:{progress.task}".encode()).hexdigest()[:12]

        offered = set() if tool_choice == "none" else set(tools)
        runnable = [action for action in actions if action.tool in offered]
        done = len(progress.results)
        if done < len(runnable):
            action = runnable[done]
            arguments = dict(action.arguments)
            if action.tool == BASH_TOOL_NAME:
                arguments = {_argument_name(tools[BASH_TOOL_NAME], BASH_ARGUMENT_NAME): arguments[BASH_ARGUMENT_NAME]}
            message = _tool_call_message(f"call_offline_{digest}_{done}", action.tool, arguments)
            return self._completion(request, messages, digest, message, "tool_calls")

        text = _final_text(progress, actions, runnable)
        output_tool = _output_tool(tools, tool_choice)
        if output_tool is not None:
            arguments = {_argument_name(tools[output_tool], "response"): text}
            message = _tool_call_message(f"call_offline_{digest}_final", output_tool, arguments)
            return self._completion(request, messages, digest, message, "tool_calls")
        return self._completion(request, messages, digest, {"role": "assistant", "content": text}, "stop")

    def _completion(
        self,
        request: Mapping[str, Any],
        messages: Sequence[Any],
        digest: str,
        message: dict[str, Any],
        finish_reason: str,
    ) -> dict[str, Any]:
        prompt_tokens = estimate_tokens(json.dumps(messages, default=str))
        answer = message.get("content") or json.dumps(message.get("tool_calls"))
        completion_tokens = estimate_tokens(str(answer))
        return {
            "id": f"chatcmpl-offline-{digest}-{len(messages)}",
            "object": "chat.completion",
            "created": int(self._clock()),
            "model": str(request.get("model") or MODEL_NAME),
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _tool_call_message(call_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


def _output_tool(tools: Mapping[str, Any], tool_choice: Any) -> str | None:
    """The tool the final answer must go through, if the request forbids a plain text answer."""
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
        return str(name) if name in tools else None
    if tool_choice == "required":
        return next((name for name in tools if name.startswith(OUTPUT_TOOL_PREFIX)), None)
    return None


def _final_text(progress: _Progress, actions: list[Action], runnable: list[Action]) -> str:
    if not actions:
        first_line = next((line.strip() for line in progress.task.splitlines() if line.strip()), "")
        if len(first_line) > MAX_QUOTED_TASK_CHARS:
            first_line = first_line[:MAX_QUOTED_TASK_CHARS] + "…"
        return (
            f"I have no commands to run: no line of the task starts with `{COMMAND_PREFIX}` "
            f'or `{SEND_FILE_TOOL_NAME} ` or `{ASK_PREFIX}`. The task begins: "{first_line}"'
        )
    skipped = [action for action in actions if action not in runnable]
    missing = [f"`{tool}`" for tool in dict.fromkeys(action.tool for action in skipped)]
    tools = f"the {missing[0]} tool is" if len(missing) == 1 else f"the {' and '.join(missing)} tools are"
    not_done = f"{tools} not available. Not done:\n" + "\n".join(action.line for action in skipped)
    if not runnable:
        return f"I cannot run commands here: {not_done}"
    commands = sum(action.tool == BASH_TOOL_NAME for action in runnable)
    questions = sum(action.tool == ASK_TOOL_NAME for action in runnable)
    files = len(runnable) - commands - questions
    lines = [
        f"Ran {commands} command(s)"
        + (f", {files} send_file call(s)" if files else "")
        + (f", {questions} question(s)" if questions else "")
        + "."
    ]
    for action, output in zip(runnable, progress.results, strict=False):
        lines.append(action.line)
        lines.append(trim_output(output))
    if skipped:
        lines.append(f"Also in the task, but {not_done}")
    return "\n".join(lines)


def stream_chunks(completion: Mapping[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The same completion as `chat.completion.chunk` objects, for a client that asked for `stream: true`."""
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    head = {key: completion[key] for key in ("id", "created", "model")}
    chunks: list[dict[str, Any]] = [
        {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
        },
    ]
    if include_usage:
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]})
    return chunks
