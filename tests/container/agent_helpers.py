"""What the container agent tests share: the task a scripted host hands the agent, the host itself, and
reads of what the model was sent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from container.paths import ContainerPaths
from container.protocol import TaskSpec
from tests.container.fake_files import FakeFiles
from tests.container.scripted_llm import Refusal, Reply, ScriptedLLM, ToolCallReply

BASH_HELLO = ToolCallReply("bash", {"command": "echo hello > out.txt && cat out.txt"})
RUN_ID = "run-abc123"
PROMPT = "Task (hello):\nSay hello via a file."  # build_prompt of make_task()


def make_task(**overrides: Any) -> TaskSpec:
    fields: dict[str, Any] = {"run_id": RUN_ID, "task": "Say hello via a file.", "label": "hello"}
    return TaskSpec(**(fields | overrides))


def scripted_host(
    paths: ContainerPaths,
    replies: Sequence[Reply],
    *,
    refusals: dict[str, Refusal] | None = None,
    offered: dict[int, bytes] | None = None,
    **task: Any,
) -> ScriptedLLM:
    """A scripted host for `make_task(**task)`; `offered` are the bytes of the task's files by index."""
    return ScriptedLLM(
        paths.channel_socket,
        replies,
        task=make_task(**task),
        refusals=refusals or {},
        files=FakeFiles(offered=offered or {}),
    )


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], str)]


def tool_messages(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]
