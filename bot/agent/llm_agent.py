"""The main agent's pydantic-ai side: the Agent with its tools, and one turn's run of it.

Imported on the first turn, not at start: pydantic-ai and the provider's SDK are most of a just-started
bot's memory (bench: memory), and a bot may sit idle for long.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import BinaryContent, UserContent
from pydantic_ai.models import Model
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import UsageLimits

from bot.agent.deps import TurnDeps
from bot.agent.memory_tools import MEMORY_TOOLS
from bot.agent.metered import MeteredModel, TokenCounter
from bot.agent.prompt import instructions_for
from bot.agent.subagents_tool import subagents
from bot.agent.task_tools import TASK_TOOLS
from bot.senses.image_prep import PreparedImage
from core.allowances import Allowances
from core.logging import get_logger
from core.store.chat_files import ChatFile
from core.store.spend import SpendKind

log = get_logger(__name__)

MAX_MODEL_REQUESTS_PER_TURN = 8

Shown = Sequence[tuple[ChatFile, PreparedImage]]  # the window's images the model is shown, in order


def user_prompt(text: str, images: Shown = ()) -> str | list[UserContent]:
    """The turn's prompt: the transcript, then each image it marks as shown, labelled with its number and ref."""
    if not images:
        return text
    content: list[UserContent] = [text]
    for number, (file, image) in enumerate(images, start=1):
        content += [f"[image {number}: {file.ref}]", BinaryContent(image.data, media_type=image.media_type)]
    return content


async def spawn_subagent(
    ctx: RunContext[TurnDeps],
    task: str,
    label: str | None = None,
    include_context: bool = False,
    files: list[str] | None = None,
) -> str:
    """Start a subagent in a sandboxed container for long work or anything that needs running code.

    Returns at once with the run id; the result is posted to the chat when the subagent finishes. When
    all slots are busy it waits in a queue and starts as soon as one frees (the chat is told its place).

    Args:
        task: Complete instructions for the subagent; it cannot ask questions back.
        label: A short name for the task, shown with its result.
        include_context: Also give the subagent the chat's recent messages.
        files: Ids of the chat's files the task needs, as the transcript shows them (`f3`); the subagent
            finds them in its inbox/ folder.
    """
    deps = ctx.deps
    try:
        run_id = await deps.spawner.spawn(deps.chat_id, deps.turn.id, task, label, include_context, files or ())
    except Exception as exc:
        log.error("spawn_failed", error=str(exc))
        return f"Could not start the subagent: {exc}"
    shown = f" ({label})" if label else ""
    return (
        f"Started subagent run {run_id}{shown}. Its result will be posted here when it finishes; "
        f"/subagents {run_id} shows its output so far."
    )


def build_llm_agent(
    model: Model,
    *,
    assistant_name: str,
    can_spawn: bool,
    with_desk: bool,
    can_schedule: bool,
    can_remember: bool = False,
) -> Agent[TurnDeps, str]:
    tools: list[Tool[TurnDeps]] = [Tool(spawn_subagent)] if can_spawn else []
    if with_desk:
        tools.append(Tool(subagents))
    if can_schedule:
        tools += [Tool(tool) for tool in TASK_TOOLS]
    if can_remember:
        tools += [Tool(tool) for tool in MEMORY_TOOLS]
    return Agent(
        model,
        deps_type=TurnDeps,
        instructions=instructions_for(
            assistant_name, can_spawn=can_spawn, can_schedule=can_schedule, can_remember=can_remember
        ),
        tools=tools,
    )


async def run_turn(
    agent: Agent[TurnDeps, str],
    text: str,
    deps: TurnDeps,
    *,
    allowances: Allowances | None = None,
    kind: SpendKind = SpendKind.MAIN,
    on_tokens: TokenCounter | None = None,
    images: Shown = (),
    toolsets: Sequence[AbstractToolset[TurnDeps]] = (),
) -> str:
    """One turn's run, with `toolsets` besides the agent's own tools (the chat's MCP tools). With `allowances`
    each of its model requests is metered for the turn's chat and kind (and may raise AllowanceSpent when
    nothing is left)."""
    model: Model | None = None
    if allowances is not None:
        if not isinstance(agent.model, Model):
            raise TypeError("a metered turn needs the agent's model object")
        model = MeteredModel(agent.model, allowances, deps.chat_id, kind, on_tokens)
    limits = UsageLimits(request_limit=MAX_MODEL_REQUESTS_PER_TURN)
    result = await agent.run(user_prompt(text, images), deps=deps, model=model, usage_limits=limits, toolsets=toolsets)
    return result.output
