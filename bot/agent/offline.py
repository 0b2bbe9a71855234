"""The offline demo model: a deterministic stand-in (not an LLM) so crewbot runs with no API key.

It answers plainly, quoting the latest message and what it can see of the chat. When the latest message
contains `background:` it calls spawn_subagent with the text after it as the task; the offline subagent
model then runs each line of that task that starts with `$ ` as a shell command, e.g.

    @crew background: $ echo hello from a container
"""

from __future__ import annotations

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.prompt import LATEST_MARKER

BACKGROUND_PHRASE = "background:"
SPAWN_TOOL = "spawn_subagent"
MAX_QUOTE_CHARS = 200


def prompt_text(messages: list[ModelMessage]) -> str:
    """The user prompt of a model request (the transcript the prompt builder made)."""
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _latest(prompt: str) -> tuple[str, str]:
    """(sender, text) of the latest message, as the prompt builder marks it."""
    _, marker, tail = prompt.rpartition(LATEST_MARKER)
    if not marker:
        return "", ""
    sender, _, rest = tail.partition(":\n")
    text, _, _ = rest.rpartition("\n\nWrite ")
    return sender, text.strip()


def _label_for(task: str) -> str:
    first = task.strip().splitlines()[0] if task.strip() else "task"
    first = first.removeprefix("$ ").strip()
    return first if len(first) <= 40 else first[:39] + "…"


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_QUOTE_CHARS else flat[: MAX_QUOTE_CHARS - 1] + "…"


def offline_main_model(assistant_name: str) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest):
            for part in last.parts:
                if isinstance(part, ToolReturnPart) and part.tool_name == SPAWN_TOOL:
                    return ModelResponse(parts=[TextPart(f"{part.content}")])
        prompt = prompt_text(messages)
        sender, text = _latest(prompt)
        can_spawn = any(tool.name == SPAWN_TOOL for tool in info.function_tools)
        lowered = text.lower()
        if can_spawn and BACKGROUND_PHRASE in lowered:
            task = text[lowered.index(BACKGROUND_PHRASE) + len(BACKGROUND_PHRASE) :].strip()
            if task:
                args = {"task": task, "label": _label_for(task), "include_context": False}
                return ModelResponse(parts=[ToolCallPart(SPAWN_TOOL, args, tool_call_id="offline-spawn")])
        lines = [line for line in prompt.splitlines() if line.startswith("[")]
        results = [line for line in lines if "] [Subagent]: " in line]
        reply = [f"Offline demo model here: no LLM is configured, so {assistant_name} answers from a script."]
        if text:
            reply.append(f"{sender or 'You'} wrote: “{_quote(text)}”.")
        reply.append(f"I can see {len(lines)} message(s) of this chat.")
        if results:
            reply.append(f"Latest subagent result: {_quote(results[-1].split('] [Subagent]: ', 1)[1])}")
        if can_spawn:
            reply.append(f"To try a subagent, write: {BACKGROUND_PHRASE} $ echo hello")
        return ModelResponse(parts=[TextPart(" ".join(reply))])

    return FunctionModel(respond, model_name="crewbot-offline")
