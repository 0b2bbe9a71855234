"""The subagent itself: instructions, the task prompt and the tools, as one pydantic-ai Agent."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_ai import Agent, Tool
from pydantic_ai.models import Model

from container.protocol import TaskSpec
from container.tools import Toolbox

# Tool arguments that fail validation go back to the model this many times before the run fails.
TOOL_ARGUMENT_RETRIES = 3
LOGGED_ARGUMENT_CHARS = 200

INSTRUCTIONS = """\
You are a subagent: the assistant of a group chat handed you one task. Work on it on your own until it
is done; nobody can answer questions while you run.

Your working directory is {workspace}: the chat's workspace, kept between runs, so leave useful files
there. /tmp is scratch space that is lost when you finish. Do not count on network access.

Use the tools: bash for commands, read_file / write_file / edit_file / list_files for files, and
send_message for a short progress note to the chat when a long task reaches a milestone.

When you are done, reply with the result for the chat: complete but concise, plain text (Markdown code
blocks are fine). It is posted to the chat as it is. If you could not finish, say what is missing and why.
"""

ToolFunction = Callable[..., Awaitable[str]]


def build_agent(model: Model, toolbox: Toolbox, log: Callable[[str], None]) -> Agent[None, str]:
    """An agent on `model` with the toolbox's tools (no spawn tool: subagents do not nest)."""
    tool_functions: list[ToolFunction] = [
        toolbox.bash,
        toolbox.read_file,
        toolbox.write_file,
        toolbox.edit_file,
        toolbox.list_files,
        toolbox.send_message,
    ]
    return Agent(
        model,
        output_type=str,
        instructions=INSTRUCTIONS.format(workspace=toolbox.workspace_dir),
        tools=[Tool(_logged(function, log), takes_ctx=False, docstring_format="google") for function in tool_functions],
        retries=TOOL_ARGUMENT_RETRIES,
    )


def build_prompt(task: TaskSpec) -> str:
    """The user prompt: the task, and the recent chat lines when the main agent passed them on."""
    parts = [f"Task ({task.label}):\n{task.task}"]
    if task.context:
        parts.append("Recent chat messages:\n" + "\n".join(task.context))
    return "\n\n".join(parts)


def _logged(function: ToolFunction, log: Callable[[str], None]) -> ToolFunction:
    # functools.wraps keeps the signature and docstring, which pydantic-ai turns into the tool's schema.
    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> str:
        shown = ", ".join([repr(value) for value in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        if len(shown) > LOGGED_ARGUMENT_CHARS:
            shown = shown[:LOGGED_ARGUMENT_CHARS] + "..."
        log(f"tool {function.__name__}({shown})")
        return await function(*args, **kwargs)

    return wrapper
