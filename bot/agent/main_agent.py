"""One main-agent turn: prompt from the store, the LLM with the spawn tool, the reply stored and sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.models import Model
from pydantic_ai.usage import UsageLimits

from bot.agent.deps import Spawner, SubagentDesk, TurnDeps
from bot.agent.prompt import build_prompt, instructions_for
from bot.agent.subagents_tool import subagents
from bot.agent.task_tools import TASK_TOOLS
from bot.announce import SKIP_MARKER
from bot.engine import Turn
from bot.schedules.book import TaskBook
from core.delivery import Delivery
from core.logging import get_logger
from core.store.messages import MessageStore

log = get_logger(__name__)

__all__ = ["APOLOGY", "MainAgent", "Spawner", "TurnDeps", "spawn_subagent"]

MAX_MODEL_REQUESTS_PER_TURN = 8
APOLOGY = "Sorry, I could not answer just now (the language model did not respond). Please try again."


async def spawn_subagent(
    ctx: RunContext[TurnDeps], task: str, label: str | None = None, include_context: bool = False
) -> str:
    """Start a subagent in a sandboxed container for long work or anything that needs running code.

    Returns at once with the run id; the result is posted to the chat when the subagent finishes. When
    all slots are busy it waits in a queue and starts as soon as one frees (the chat is told its place).

    Args:
        task: Complete instructions for the subagent; it cannot ask questions back.
        label: A short name for the task, shown with its result.
        include_context: Also give the subagent the chat's recent messages.
    """
    deps = ctx.deps
    try:
        run_id = await deps.spawner.spawn(deps.chat_id, deps.turn.id, task, label, include_context)
    except Exception as exc:
        log.error("spawn_failed", error=str(exc))
        return f"Could not start the subagent: {exc}"
    shown = f" ({label})" if label else ""
    return (
        f"Started subagent run {run_id}{shown}. Its result will be posted here when it finishes; "
        f"/subagents {run_id} shows its output so far."
    )


class MainAgent:
    """Callable as the engine's TurnRunner."""

    def __init__(
        self,
        model: Model,
        messages: MessageStore,
        delivery: Delivery,
        spawner: Spawner | None,
        *,
        assistant_name: str,
        history_window: int,
        timeout_seconds: float,
        tasks: TaskBook | None = None,
        on_answered: Callable[[str, int | None], None] | None = None,
        desk: SubagentDesk | None = None,
        announcements: Callable[[int], Awaitable[str | None]] | None = None,
    ) -> None:
        self._messages = messages
        self._delivery = delivery
        self._spawner = spawner
        self._desk = desk
        self._announcements = announcements  # announce mode: finished runs the chat has not been told of
        self._assistant_name = assistant_name
        self._history_window = history_window
        self._timeout_seconds = timeout_seconds
        self._tasks = tasks
        self._on_answered = on_answered  # the status card replies to the answer (turn id, platform id)
        tools: list[Tool[TurnDeps]] = [Tool(spawn_subagent)] if spawner is not None else []
        if desk is not None:
            tools.append(Tool(subagents))
        if tasks is not None:
            tools += [Tool(tool) for tool in TASK_TOOLS]
        self._agent: Agent[TurnDeps, str] = Agent(
            model,
            deps_type=TurnDeps,
            instructions=instructions_for(
                assistant_name, can_spawn=spawner is not None, can_schedule=tasks is not None
            ),
            tools=tools,
        )

    @property
    def agent(self) -> Agent[TurnDeps, str]:
        return self._agent

    async def __call__(self, turn: Turn) -> None:
        reply, kind = await self._answer(turn)
        if reply == SKIP_MARKER:
            log.info("turn_skipped", turn_id=turn.id)  # an announcement the chat need not hear of
            return
        turn.begin_delivery()
        # Once delivery starts it completes even if the turn is cancelled, so a reply is never half-sent.
        message_id = await asyncio.shield(self._post_answer(turn, reply, kind))
        if self._on_answered is not None:
            self._on_answered(turn.id, message_id)

    async def _answer(self, turn: Turn) -> tuple[str, str]:
        """The reply and its kind. A frame of its own: the prompt, its window and the agent's run are
        freed before the send, which can wait on Telegram's rate limits (bench: memory)."""
        prompt = await build_prompt(
            self._messages, turn.chat_id, self._history_window, self._assistant_name, up_to_id=turn.trigger_id
        )
        text = prompt.text
        announced = await self._announcements(turn.chat_id) if self._announcements is not None else None
        if announced:
            text = f"{text}\n\n{announced}"
        asker = next((m for m in reversed(prompt.window) if m.is_trigger and not m.is_bot), None)
        deps = TurnDeps(
            chat_id=turn.chat_id,
            turn=turn,
            spawner=self._spawner or _NoSpawner(),
            tasks=self._tasks,
            requester_id=asker.sender_id if asker else None,
            desk=self._desk,
        )
        try:
            async with asyncio.timeout(self._timeout_seconds):
                result = await self._agent.run(
                    text,
                    deps=deps,
                    usage_limits=UsageLimits(request_limit=MAX_MODEL_REQUESTS_PER_TURN),
                )
            return result.output.strip() or "(no answer)", "reply"
        except TimeoutError:
            log.error("llm_timeout", timeout_seconds=self._timeout_seconds)
            return APOLOGY, "notice"
        except Exception as exc:  # any provider failure: apologise, keep the bot running
            log.error("llm_failed", error_type=type(exc).__name__, error=str(exc)[:500])
            return APOLOGY, "notice"

    async def _post_answer(self, turn: Turn, reply: str, kind: str) -> int | None:
        # A reply to the message that asked, looked up now: an upgrade meanwhile retires its old id.
        asked = None if turn.trigger_id is None else await self._messages.platform_id_of(turn.trigger_id, turn.chat_id)
        return await self._delivery.post_answer(turn.chat_id, reply, kind=kind, reply_to=asked)


class _NoSpawner:
    async def spawn(self, chat_id: int, turn_id: str, task: str, label: str | None, include_context: bool) -> str:
        raise RuntimeError("subagents are not available in this process")
