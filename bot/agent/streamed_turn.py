"""One main-agent turn streamed from the model (bot/channels/live_message.py has the design): each model
request's text is passed on as it arrives, and a tool that started something (a subagent, a scheduled task)
adds a line saying so; the text before a tool call stays.

Imported on the first turn with the rest of pydantic-ai (bot/agent/llm_agent.py). Cancelling the task that
runs it closes the provider's HTTP stream: pydantic-ai's stream is an async context left on the cancel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic_ai import Agent
from pydantic_ai.messages import (
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolReturnPart,
)
from pydantic_ai.models import Model
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import UsageLimits

from bot.agent.deps import TurnDeps
from bot.agent.llm_agent import MAX_MODEL_REQUESTS_PER_TURN, Shown, user_prompt
from bot.agent.metered import MeteredModel, TokenCounter
from core.allowances import Allowances
from core.store.spend import SpendKind

# Tools whose start the chat is shown in the growing answer (their result's first sentence).
STARTING_TOOLS = frozenset({"spawn_subagent", "schedule_task"})
MAX_NOTE_CHARS = 200
NOTE_MARK = "▸ "

TextSink = Callable[[str], None]  # the whole text so far, at each change


def _note(part: ToolReturnPart) -> str | None:
    if part.tool_name not in STARTING_TOOLS:
        return None
    first = part.model_response_str().strip().split("\n", 1)[0]
    sentence = first.split(". ", 1)[0].rstrip(".")
    return f"{NOTE_MARK}{sentence[:MAX_NOTE_CHARS]}." if sentence else None


async def run_turn_streamed(
    agent: Agent[TurnDeps, str],
    text: str,
    deps: TurnDeps,
    show: TextSink,
    *,
    allowances: Allowances | None = None,
    kind: SpendKind = SpendKind.MAIN,
    on_tokens: TokenCounter | None = None,
    images: Shown = (),
    toolsets: Sequence[AbstractToolset[TurnDeps]] = (),
) -> str:
    """The turn's answer as shown: every model response's text and the notes of what tools started, a blank
    line apart. With `allowances` each model request is metered, as run_turn does."""
    model: Model | None = None
    if allowances is not None:
        if not isinstance(agent.model, Model):
            raise TypeError("a metered turn needs the agent's model object")
        model = MeteredModel(agent.model, allowances, deps.chat_id, kind, on_tokens)
    shown: list[str] = []
    limits = UsageLimits(request_limit=MAX_MODEL_REQUESTS_PER_TURN)
    prompt = user_prompt(text, images)
    async with agent.iter(prompt, deps=deps, model=model, usage_limits=limits, toolsets=toolsets) as run:
        async for node in run:
            if Agent.is_model_request_node(node):
                current = ""
                async with node.stream(run.ctx) as stream:
                    async for event in stream:
                        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                            current += event.part.content
                        elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                            current += event.delta.content_delta
                        else:
                            continue
                        if current.strip():
                            show("\n\n".join([*shown, current.strip()]))
                if current.strip():
                    shown.append(current.strip())
            elif Agent.is_call_tools_node(node):
                async with node.stream(run.ctx) as events:
                    async for event in events:
                        if isinstance(event, FunctionToolResultEvent) and isinstance(event.part, ToolReturnPart):
                            note = _note(event.part)
                            if note is not None:
                                shown.append(note)
                                show("\n\n".join(shown))
    return "\n\n".join(shown)
