"""One main-agent turn: prompt from the store, the LLM with the spawn tool, the reply stored and sent; and the
main agent's pydantic-ai model built from settings (openai-compatible, anthropic, or offline)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from bot.agent.announce import SKIP_MARKER
from bot.agent.deps import AdminCheck, SubagentDesk, TurnDeps
from bot.agent.live_reply import LiveReplies, LiveReply
from bot.agent.memory import Memory
from bot.agent.prompt import Prompt, build_prompt
from bot.ports.spawner import Spawner
from bot.schedules.book import TaskBook
from bot.senses.vision import ImageRefusals, model_name, refuses_images, vision_on
from bot.senses.window import WindowSenses
from bot.turns.engine import AbortReason, Turn
from core.allowances import Allowances, AllowanceSpent, spent_line
from core.delivery import Delivery
from core.logging import get_logger
from core.mcp_servers import McpServers
from core.setting_senses import VisionMode
from core.settings import LLMProvider, Settings
from core.store.messages import MessageStore, StoredMessage
from core.store.spend import SpendKind

if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.models import Model
    from pydantic_ai.toolsets import AbstractToolset

    from bot.agent.llm_agent import Shown

log = get_logger(__name__)

__all__ = ["APOLOGY", "LLM_MAX_RETRIES", "MainAgent", "TurnDeps", "build_main_model"]

APOLOGY = "Sorry, I could not answer just now (the language model did not respond). Please try again."
# An announcement turn refused for the allowance before it took its runs: they are told at the next turn let in.
UNANNOUNCED = "A subagent run has finished meanwhile: /subagents shows it, and I will tell you more when I can."
FINISHED = "Subagent runs have finished meanwhile: /subagents shows them."  # refused after taking them
MAX_NAME_CHARS = 64  # of who stopped an answer, in its mark
_MARKDOWN_SPECIALS = re.compile(r"[!-/:-@\[-`{-~]")  # ASCII punctuation: each may be backslash-escaped
LLM_MAX_RETRIES = 3  # 429s and 5xx are retried this often, with the SDK's backoff (honouring retry-after)


def build_main_model(settings: Settings) -> Model:
    """Called on the main agent's first turn, not at start."""
    # Each provider's SDK is imported only when it is the configured one: the anthropic SDK alone is
    # about 3,000 modules and 50 MiB of the process, which a bot on another provider never uses.
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    model_name = settings.llm_model or ""
    if settings.llm_provider is LLMProvider.OPENAI:
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        # A local OpenAI-compatible server may need no key; the client insists on some string.
        client = AsyncOpenAI(base_url=settings.llm_base_url, api_key=key or "not-needed", max_retries=LLM_MAX_RETRIES)
        return OpenAIChatModel(model_name, provider=OpenAIProvider(openai_client=client))
    if settings.llm_provider is LLMProvider.ANTHROPIC:
        from anthropic import AsyncAnthropic
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        anthropic = AsyncAnthropic(api_key=key, base_url=settings.llm_base_url, max_retries=LLM_MAX_RETRIES)
        return AnthropicModel(model_name, provider=AnthropicProvider(anthropic_client=anthropic))
    from bot.agent.offline import offline_main_model

    return offline_main_model(settings.assistant_name)


def turn_askers(window: Sequence[StoredMessage], answered_up_to: int | None) -> tuple[int | None, ...]:
    """Who asked for this turn, oldest first: the senders of the triggering messages after the newest one a
    completed turn answered (more than one when messages merged). Decided by the turns' own record, never by
    where an answer sits in the window: an answer stored after a member's message does not answer it. With
    no completed turn on record, every trigger in the window counts: too many askers only ever refuse more."""
    return tuple(
        m.sender_id
        for m in window
        if m.is_trigger and not m.is_bot and (answered_up_to is None or m.id > answered_up_to)
    )


class MainAgent:
    """Callable as the engine's TurnRunner."""

    def __init__(
        self,
        model: Callable[[], Model],
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
        is_admin: AdminCheck | None = None,
        answered_up_to: Callable[[int, int], Awaitable[int | None]] | None = None,
        abilities: Callable[[], str] | None = None,
        allowances: Allowances | None = None,
        on_tokens: Callable[[SpendKind, int, int], None] | None = None,
        live: LiveReplies | None = None,
        senses: WindowSenses | None = None,
        vision: Callable[[], VisionMode] = lambda: VisionMode.OFF,
        memory: Memory | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self._messages = messages
        self._delivery = delivery
        self._spawner = spawner
        self._desk = desk
        self._announcements = announcements  # announce mode: finished runs the chat has not been told of
        self._is_admin = is_admin  # admin-only tools: None refuses them
        self._answered_up_to = answered_up_to  # (chat, trigger) -> the newest trigger a completed turn answered
        self._abilities = abilities  # what subagents can reach and use, read at each turn (settings change live)
        self._allowances = allowances  # daily LLM allowances: each model request is metered; None: not counted
        self._on_tokens = on_tokens  # each metered request's (kind, input, output): the metrics
        self._mcp = mcp  # the operator's MCP servers: the chat's tools, read at each turn (the file changes live)
        self._live = live  # STREAM_REPLIES: answers shown as they are written; None: sent whole
        self._senses = senses  # transcripts and images in the prompt; None: files show as their lines only
        self._vision = vision  # LLM_VISION, read at each turn
        self._memory = memory  # notes in the prompt, the memory tools; None: neither
        self._image_refusals = ImageRefusals()  # models shown no images again until the bot restarts
        self._assistant_name = assistant_name
        self._history_window = history_window
        self._timeout_seconds = timeout_seconds
        self._tasks = tasks
        self._on_answered = on_answered  # the status card replies to the answer (turn id, platform id)
        self._model = model
        self._agent: Agent[TurnDeps, str] | None = None
        self._loading = asyncio.Lock()

    async def llm_agent(self) -> Agent[TurnDeps, str]:
        """The pydantic-ai agent, built on first use: its import (about a second of CPU) runs in a thread,
        so the first turn does not stall the event loop and a bot that is never asked never pays it."""
        async with self._loading:
            if self._agent is None:
                self._agent = await asyncio.to_thread(self._build)
            return self._agent

    def _build(self) -> Agent[TurnDeps, str]:
        from bot.agent.llm_agent import build_llm_agent

        return build_llm_agent(
            self._model(),
            assistant_name=self._assistant_name,
            can_spawn=self._spawner is not None,
            with_desk=self._desk is not None,
            can_schedule=self._tasks is not None,
            can_remember=self._memory is not None,
        )

    async def __call__(self, turn: Turn) -> None:
        live: LiveReply | None = None
        try:
            # An announcement may be skipped: not streamed, unless a merged turn left its message for this one
            # (an announcement waited, so the merged question is this turn's): kept ids never outlive it.
            if self._live is not None and (turn.trigger_id is not None or self._live.kept(turn.chat_id)):
                live = await self._live.open(turn.chat_id, turn.id, await self._asked(turn), turn.trigger_id)
            reply, kind = await self._answer(turn, live)
            # Only an announcement with nothing on screen may be skipped: a member who asked is answered, and a
            # streamed answer's message (with its Stop) never stays on screen unfinished.
            if reply == SKIP_MARKER and turn.trigger_id is None and live is None:
                log.info("turn_skipped", turn_id=turn.id)  # an announcement the chat need not hear of
                return
            # The answer is complete: a merge or a Stop no longer aborts it (bot/turns/engine.py), and what is
            # left (the last write on screen, the final text stored and owed) completes even if the turn is
            # cancelled (the bot stopping, /stop), so a reply is never half-sent.
            turn.begin_delivery()
            message_id = await asyncio.shield(self._deliver(turn, reply, kind, live))
        except asyncio.CancelledError:
            if live is not None and not turn.delivering:  # a merge keeps the message; a Stop leaves it marked
                await asyncio.shield(self._abandon(turn, live))
            raise
        except Exception:
            if live is not None and not turn.delivering:  # the words shown stay, finished and without Stop
                await asyncio.shield(self._deliver(turn, _cut(live, APOLOGY), "notice", live))
            raise
        if self._on_answered is not None:
            self._on_answered(turn.id, message_id)

    async def _deliver(self, turn: Turn, reply: str, kind: str, live: LiveReply | None) -> int | None:
        edit_ids = await live.settle() if live is not None else ()
        return await self._post_answer(turn, reply, kind, edit_ids, live is not None)

    async def _abandon(self, turn: Turn, live: LiveReply) -> None:
        edit_ids = await live.settle()
        if turn.abort_reason is AbortReason.MERGE:
            self._live_replies().keep(turn.chat_id, edit_ids, turn.id)
            return
        if turn.abort_reason is None:
            # The bot is stopping: the message stays recorded, and the next start answers the turn into it.
            await live.record()
            return
        if not edit_ids and not live.text:
            return  # nothing was shown: nothing to mark
        mark = f"_(stopped by {_plain(turn.stopped_by)})_" if turn.stopped_by else "_(stopped)_"
        text = f"{live.text}\n\n{mark}" if live.text else mark
        await self._post_answer(turn, text, "stopped", edit_ids, True)

    def _live_replies(self) -> LiveReplies:
        assert self._live is not None
        return self._live

    async def _answer(self, turn: Turn, live: LiveReply | None = None) -> tuple[str, str]:
        """The reply and its kind. A frame of its own: the prompt, its window and the agent's run are
        freed before the send, which can wait on Telegram's rate limits (bench: memory)."""
        refused = await self._allowances.left_for(turn.chat_id) if self._allowances is not None else None
        if refused is not None:  # no LLM call at all; the message that asked stays stored
            log.info("turn_refused_allowance", turn_id=turn.id, chat_id=turn.chat_id)
            return spent_line(refused) + ("" if turn.trigger_id is not None else f" {UNANNOUNCED}"), "notice"
        with_images = await self._with_images()
        prompt, text = await self._prompt(turn, with_images)
        announced = await self._announcements(turn.chat_id) if self._announcements is not None else None
        if announced:
            text = f"{text}\n\n{announced}"
        askers: tuple[int | None, ...] = ()  # an announcement (no trigger): no one asked
        if turn.trigger_id is not None:
            answered = await self._answered_up_to(turn.chat_id, turn.trigger_id) if self._answered_up_to else None
            askers = turn_askers(prompt.window, answered)
        deps = TurnDeps(
            chat_id=turn.chat_id,
            turn=turn,
            spawner=self._spawner or _NoSpawner(),
            tasks=self._tasks,
            requester_id=askers[-1] if askers else None,
            desk=self._desk,
            askers=askers,
            is_admin=self._is_admin,
            memory=self._memory,
            asker_names={
                m.sender_id: m.sender_name for m in prompt.window if m.sender_id is not None and m.sender_id in askers
            },
            asker_messages={m.sender_id: m.id for m in prompt.window if m.is_trigger and m.sender_id in askers},
        )
        try:
            agent = await self.llm_agent()
            # An announcement turn (no message asked) is counted as such; any other as the main agent's.
            kind = SpendKind.ANNOUNCE if turn.trigger_id is None else SpendKind.MAIN
            async with asyncio.timeout(self._timeout_seconds):
                try:
                    output = await self._run(agent, text, deps, kind, live, prompt.images)
                except Exception as exc:
                    if not prompt.images or not refuses_images(exc):
                        raise
                    # The provider refused the images: the turn again without them, once. Only a model that
                    # takes no images (said so, or refused them in two chats) is shown none again until the
                    # bot restarts (LLM_VISION=off says so for good); a content policy costs only this turn.
                    name = model_name(agent.model)
                    marked = self._image_refusals.refused(name, turn.chat_id, exc)
                    log.warning("llm_refused_images", model=name, marked=marked, error=str(exc)[:200])
                    prompt, text = await self._prompt(turn, False)
                    text = f"{text}\n\n{announced}" if announced else text
                    output = await self._run(agent, text, deps, kind, live, prompt.images)
            return output.strip() or "(no answer)", "reply"
        except AllowanceSpent as exc:  # used up during the turn (its own requests, or racing chats)
            log.info("turn_stopped_allowance", turn_id=turn.id, chat_id=turn.chat_id)
            return _cut(live, spent_line(str(exc)) + (f" {FINISHED}" if announced else "")), "notice"
        except TimeoutError:
            log.error("llm_timeout", timeout_seconds=self._timeout_seconds)
            return _cut(live, APOLOGY), "notice"
        except Exception as exc:  # any provider failure: apologise, keep the bot running
            log.error("llm_failed", error_type=type(exc).__name__, error=str(exc)[:500])
            return _cut(live, APOLOGY), "notice"

    async def _prompt(self, turn: Turn, with_images: bool) -> tuple[Prompt, str]:
        prompt = await build_prompt(
            self._messages,
            turn.chat_id,
            self._history_window,
            self._assistant_name,
            up_to_id=turn.trigger_id,
            senses=self._senses,
            with_images=with_images,
        )
        text = prompt.text
        if self._memory is not None:
            notes = await self._memory.prompt_section(turn.chat_id, prompt.window)
            text = f"{notes}\n\n{text}" if notes else text
        if self._abilities is not None and self._spawner is not None:
            text = f"{self._abilities()}\n\n{text}"
        return prompt, text

    async def _run(
        self,
        agent: Agent[TurnDeps, str],
        text: str,
        deps: TurnDeps,
        kind: SpendKind,
        live: LiveReply | None,
        images: Shown = (),
    ) -> str:
        toolsets = await self._mcp_toolsets(deps.chat_id)
        if live is None:
            from bot.agent.llm_agent import run_turn  # loaded by llm_agent()

            return await run_turn(
                agent,
                text,
                deps,
                allowances=self._allowances,
                kind=kind,
                on_tokens=self._on_tokens,
                images=images,
                toolsets=toolsets,
            )
        from bot.agent.streamed_turn import run_turn_streamed

        return await run_turn_streamed(
            agent,
            text,
            deps,
            live.show,
            allowances=self._allowances,
            kind=kind,
            on_tokens=self._on_tokens,
            images=images,
            toolsets=toolsets,
        )

    async def _with_images(self) -> bool:
        """Whether this turn shows the model the window's images (LLM_VISION, and in `auto` the model's ability)."""
        mode = self._vision()
        if self._senses is None or mode is VisionMode.OFF:
            return False
        try:
            return vision_on(mode, (await self.llm_agent()).model, self._image_refusals.refusing)
        except Exception:  # the turn's own call reports a model that cannot be built
            return False

    async def _mcp_toolsets(self, chat_id: int) -> list[AbstractToolset[TurnDeps]]:
        if self._mcp is None:
            return []
        from bot.agent.mcp_tools import turn_toolset  # with pydantic-ai, loaded by llm_agent()

        toolset = await turn_toolset(self._mcp, chat_id)
        return [toolset] if toolset is not None else []

    async def _asked(self, turn: Turn) -> int | None:
        # A reply to the message that asked, looked up now: an upgrade meanwhile retires its old id.
        return None if turn.trigger_id is None else await self._messages.platform_id_of(turn.trigger_id, turn.chat_id)

    async def _post_answer(
        self, turn: Turn, reply: str, kind: str, edit_ids: tuple[int, ...] = (), streamed: bool = False
    ) -> int | None:
        """Stored once and owed to the chat; a streamed answer's record of its message ends in that step."""
        asked, live = await self._asked(turn), turn.id if streamed else None
        return await self._delivery.post_answer(
            turn.chat_id, reply, kind=kind, reply_to=asked, edit_ids=edit_ids, finishes_live=live
        )


def _plain(name: str) -> str:
    """A member's display name inside the bot's Markdown: shown as written, never as a link or a style (every
    ASCII punctuation mark escaped, as CommonMark allows), on one line, at most MAX_NAME_CHARS."""
    flat = " ".join(name.split())[:MAX_NAME_CHARS]
    return _MARKDOWN_SPECIALS.sub(r"\\\g<0>", flat)


def _cut(live: LiveReply | None, notice: str) -> str:
    """A failure after words were shown: they stay, and the notice says the answer was cut short there."""
    if live is None or not live.text:
        return notice
    return f"{live.text}\n\n_({notice})_"


class _NoSpawner:
    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        raise RuntimeError("subagents are not available in this process")
