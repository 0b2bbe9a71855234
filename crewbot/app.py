"""Builds every object once, in one place, and wires them together; runs and stops them in order."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from bot.agent.announce import Announcer
from bot.agent.live_reply import LiveReplies
from bot.agent.live_restart import LiveRestart
from bot.agent.main_agent import MainAgent, build_main_model
from bot.agent.memory import Memory, MemoryLimits
from bot.agent.prompt import subagent_abilities
from bot.agent.spawn_guard import AllowanceCheckedSpawner
from bot.budget_command import BudgetCommand
from bot.card_presses import CardPresses, StopOutcome
from bot.channels.base import CardChannel, Channel
from bot.channels.buttons import PressChannel
from bot.channels.edit_pacer import EditPacer
from bot.channels.live_message import LiveChannel
from bot.commands import Commands
from bot.flood import FloodGuard
from bot.memory_command import MemoryCommand
from bot.ports.spawner import Spawner
from bot.question_board import QuestionBoard
from bot.question_presses import QuestionPresses
from bot.router import InboundRouter
from bot.schedules.service import ChatPoster, Schedules
from bot.status_card import StatusCards
from bot.turns.engine import AbortReason, ChatEngine
from bot.web_command import WebCommand
from core.allowances import Allowances, BudgetStatus
from core.delivery import Delivery
from core.live_config import LiveConfig
from core.logging import get_logger
from core.mcp_servers import McpServers
from core.outbox import Outbox
from core.questions import Questions
from core.settings import LLMProvider, ResultMode, Settings
from core.store.announcements import AnnouncementStore
from core.store.questions import Audience, NewQuestion, QuestionKind, QuestionStore
from core.store.runs import RunStore
from core.store.spend import SpendKind, SpendStore
from core.store.streamed_answers import StreamedAnswerStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.senses import build_senses
from crewbot.stream_record import CountStream, StreamRecorder
from crewbot.subagent_system import SubagentFactory
from crewbot.turn_recorder import AllowedTopics, TurnRecorder

if TYPE_CHECKING:
    from pydantic_ai.models import Model

log = get_logger(__name__)

TOP_UP_BUTTON = "Add a day's top-up"
TOP_UP_OFFER_SECONDS = 24 * 3600.0  # the most a button works; it ends with the day it tops up (at its reset)


class App:
    def __init__(
        self,
        settings: Settings,
        channel: Channel,
        stores: Stores,
        subagent_factory: SubagentFactory | None = None,
        model: Model | None = None,
        config: LiveConfig | None = None,
        allowances: Allowances | None = None,
        count_tokens: Callable[[SpendKind, int, int], None] | None = None,
        count_stream: CountStream | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self.settings = settings
        self.channel = channel
        self.stores = stores
        # One object for every LLM call of the process (main agent, announcements, subagents' proxy): the
        # racing-calls rule holds only if they all reserve from the same one.
        self.allowances = allowances or Allowances(settings, SpendStore(stores.db))
        self.budget = BudgetCommand(self.allowances, settings)
        self._notices: set[asyncio.Task[bool]] = set()
        self.allowances.on_notice(self._allowance_notice)
        self.typing = TypingIndicator(channel.send_typing, settings.typing_interval_seconds)
        self.outbox = Outbox(stores.outbox, channel, on_unreachable=self._chat_unreachable)
        self.delivery = Delivery(stores.outbox, self.outbox, settings.assistant_name)
        subagents = subagent_factory(self.delivery, self.typing) if subagent_factory else None
        self.subagents = subagents
        self.questions = subagents.questions if subagents else Questions(QuestionStore(stores.db))
        if isinstance(channel, CardChannel):
            self.questions.show_on(QuestionBoard(channel))
        self.memory = Memory(stores.notes, stores.history, MemoryLimits.from_settings(settings))
        # A scheduled subagent goes through the same spawner as the main agent's: caps, allowances and typing
        # apply. The chat's notes are not in its stored task: the runner hands them to the run as it starts.
        spawner: Spawner | None = None
        if subagents is not None:
            spawner = AllowanceCheckedSpawner(subagents.spawner, self.allowances.left_for)
        self.schedules = Schedules(
            settings,
            stores.db,
            spawner=spawner,
            poster=ChatPoster(stores.messages, lambda chat_id, row_id: self.engine.notify(chat_id, row_id)),
            notifier=self.delivery,
            is_admin=self._is_admin,
            allowed=self.conversation_allowed,
            spent=self.allowances.left_for,
        )
        self.announcer: Announcer | None = None
        if subagents is not None and settings.subagent_result_mode is ResultMode.ANNOUNCE:
            self.announcer = Announcer(
                RunStore(stores.db),
                AnnouncementStore(stores.db),
                lambda chat_id: self.engine.notify(chat_id, merge=False),
            )
            subagents.watch_runs(self.announcer.run_changed)
        self.cards: StatusCards | None = None
        if subagents is not None and settings.status_card and isinstance(channel, CardChannel):
            self.cards = StatusCards(channel, RunStore(stores.db), questions=self.questions.store)
            subagents.watch_runs(self.cards.run_changed)
        self.live: LiveReplies | None = None
        self.streams: StreamRecorder | None = None
        if settings.stream_replies and isinstance(channel, LiveChannel):
            pacer = EditPacer(
                settings.stream_edit_interval_seconds,
                settings.stream_edits_per_second,
                draft_interval_seconds=settings.stream_draft_interval_seconds,
                drafts_for=channel.drafts_for,
            )
            # Each settled answer's first-text time and edits: the metrics and crewbot stats.
            self.streams = StreamRecorder(StreamedAnswerStore(stores.db), count_stream)
            self.live = LiveReplies(
                channel,
                pacer,
                self.typing,
                settings.assistant_name,
                on_finished=self.streams.finished,
                records=stores.live,  # recorded while on screen: a restart answers into it (bot/agent/live_restart.py)
            )
        self.senses = build_senses(settings, stores, channel, self.allowances)
        self.agent = MainAgent(
            (lambda: model) if model is not None else functools.partial(build_main_model, settings),
            stores.messages,
            self.delivery,
            spawner,
            assistant_name=settings.assistant_name,
            history_window=settings.history_window_messages,
            timeout_seconds=settings.llm_timeout_seconds,
            tasks=self.schedules.book,
            on_answered=self.cards.answered if self.cards else None,
            desk=subagents.desk if subagents else None,
            announcements=self.announcer.take if self.announcer else None,
            is_admin=self._is_admin,
            answered_up_to=stores.turns.answered_up_to,
            abilities=functools.partial(subagent_abilities, settings),
            allowances=self.allowances,
            on_tokens=count_tokens,  # the main agent's tokens in the metrics (crewbot_llm_tokens_total)
            live=self.live,
            senses=self.senses.window,
            vision=lambda: settings.llm_vision,
            memory=self.memory,
            mcp=mcp,
        )
        self.mcp = mcp
        control = subagents.control if subagents else None
        self.recorder = TurnRecorder(stores.turns, settings.merge_cancel_scope, control)
        self.engine = ChatEngine(
            self.agent,
            self.recorder,
            self.typing,
            settings.merge_window_seconds,
            max_concurrent_turns=settings.max_concurrent_turns,
        )
        self.commands = Commands(
            channel,
            self.delivery,
            self.engine,
            control,
            settings.admin_user_ids,
            workspaces=subagents.workspaces if subagents else None,
            tasks=self.schedules.book,
            conversations=stores.chats.conversations_of,
            config=config,
            budget=self.budget,
            memory=MemoryCommand(self.memory, stores.chats.get, stores.chats.conversations_of),
            web=WebCommand(settings, self.questions.store),
            mcp=mcp,
        )
        self.router = InboundRouter(
            settings,
            chats=stores.chats,
            messages=stores.messages,
            engine=self.engine,
            commands=self.commands,
            delivery=self.delivery,
            flood=FloodGuard(),
            # The card's buttons (a card of before a restart too): by who asked for the run, or _is_admin.
            presses=CardPresses(
                RunStore(stores.db),
                stores.turns,
                control,
                self._is_admin,
                stop=self._stop_pressed,
                writing=self.live.writing_into if self.live is not None else None,
                questions=QuestionPresses(
                    self.questions,
                    RunStore(stores.db),
                    stores.turns,
                    self._is_admin,
                    top_up=self._top_up,
                    decides=functools.partial(self._is_admin, private_chats=False),
                ),
            ),
            transcriber=self.senses.transcriber,
        )

    def _stop_pressed(self, chat_id: int, turn_id: str, by: str) -> StopOutcome:
        """A growing answer's Stop button: its turn, if it is still the chat's turn in flight, is stopped."""
        if self.engine.stop_turn(chat_id, by=by, turn_id=turn_id, reason=AbortReason.STOP_BUTTON) is not None:
            return StopOutcome.STOPPED
        turn = self.engine.current_turn(chat_id)
        if turn is not None and turn.id == turn_id and turn.delivering and not turn.aborted:
            return StopOutcome.ANSWERED
        return StopOutcome.NOT_WRITING

    async def _top_up(self, chat_id: int, user_id: int, user_name: str) -> str:
        log.info("allowance_topped_up", chat_id=chat_id, user_id=user_id)
        return await self.budget.top_up(chat_id)

    def _allowance_notice(self, chat_id: int, status: BudgetStatus) -> None:
        """A chat passed 80 % of its allowance (told once a day: the store keeps the day's record)."""
        log.info("allowance_notice", chat_id=chat_id, used=status.used, allowance=status.allowance)
        task = asyncio.create_task(self._tell_allowance(chat_id, status))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    async def _tell_allowance(self, chat_id: int, status: BudgetStatus) -> bool:
        """The notice, stored and sent; then, where the chat shows buttons, a day's top-up for its admins to tap
        (a stored question: bot/question_presses.py checks the presser and adds it)."""
        told = await self.delivery.notice(chat_id, self.budget.notice_text(status))
        if isinstance(self.channel, CardChannel):
            question = NewQuestion(
                chat_id=chat_id,
                run_id=None,
                kind=QuestionKind.TOPUP,
                text=self.budget.top_up_question(status),
                options=(TOP_UP_BUTTON,),
                audience=Audience.ADMINS,
                # Never past the reset: a tap after it would top up the next day, not the one the notice was about.
                expires_at=min(time.time() + TOP_UP_OFFER_SECONDS, status.resets_at),
            )
            await self.questions.ask(question)
        return told

    async def conversation_allowed(self, chat_id: int) -> bool:
        """As the router decides for a message: the console, or any of the conversation's ids listed."""
        return await self.stores.chats.allowed(chat_id, self.settings.chat_allowed)

    async def _is_admin(self, chat_id: int, user_id: int, *, private_chats: bool = True) -> bool:
        """May manage every scheduled task of the chat and cancel its runs through the main agent:
        ADMIN_USER_IDS, the chat's own admins, or anyone in a private chat or the console (as /cancel).
        `private_chats` off, for what the operator's admins decide (an approval, a web host, a top-up): a private
        chat's user is no admin of the operator's bot, so there only ADMIN_USER_IDS (and the console) decide."""
        if user_id in self.settings.admin_user_ids:
            return True
        chat = await self.stores.chats.get(chat_id)
        if chat is not None and chat.kind in ("private", "console"):
            return private_chats or chat.kind == "console"
        try:
            return await self.channel.is_chat_admin(chat_id, user_id)
        except Exception as exc:
            log.warning("admin_check_failed", chat_id=chat_id, error=str(exc))
            return False

    async def start(self) -> None:
        if self.settings.llm_provider is LLMProvider.OFFLINE:
            log.warning(
                "offline_model",
                message="no real LLM is configured (LLM_PROVIDER=offline): answers come from the offline demo model",
            )
        await self.senses.start(self.stores)
        interrupted = await self.stores.turns.close_interrupted()
        if interrupted:
            log.info("turns_interrupted_by_restart", count=interrupted)
        # Before polling: a growing answer a crash cut short is marked interrupted (owed, sent once the outbox
        # runs) or handed to the live replies, so the chat's next answer, even one asked meanwhile, goes into it.
        resumed = await LiveRestart(
            self.stores.live, self.stores.messages, self.delivery, self.live, self.conversation_allowed
        ).recover()
        if isinstance(self.channel, PressChannel):
            self.channel.on_press(self.router.press)
        # The channel first: re-attached runs show typing at once. Spawn requests that new turns write
        # meanwhile wait in their folders until recovery is done and the watcher starts.
        await self.channel.start(
            self.router.handle,
            on_membership=self._membership_changed,
            directory=AllowedTopics(self.stores.chats, self.conversation_allowed),
        )
        if self.subagents is not None:
            await self.subagents.start()
        await self.schedules.start()  # after the subagents: a due time missed while down may start one now
        self.outbox.start()  # also sends whatever a crash left owed
        if self.announcer is not None:
            await self.announcer.restore()  # results a crash left unannounced get their turns
        for turn in resumed:  # the questions whose answers a crash cut short are answered into their messages
            self.engine.notify(turn.chat_id, turn.trigger_id)
        log.info("crewbot_started", channel=self.channel.name, provider=self.settings.llm_provider.value)

    async def _chat_unreachable(self, chat_id: int, reason: str) -> None:
        """Removed or blocked: the runs of the chat and of its other topics stop (their results could not
        arrive), what they are owed is given up and their scheduled tasks end. Coming back needs nothing:
        the next message is answered as usual."""
        address = await self.stores.chats.address(chat_id)
        conversations = await self.stores.chats.conversations_of(address.platform_chat_id) or [chat_id]
        control = self.subagents.control if self.subagents is not None else None
        why = f"the bot can no longer reach the chat ({reason})"
        cancelled = tasks_cancelled = 0
        for conversation in conversations:
            if conversation != chat_id:
                await self.outbox.give_up_chat(conversation, reason)
            if control is not None:
                cancelled += await control.cancel_chat(conversation, why)
            tasks_cancelled += await self.schedules.book.cancel_chat(conversation, why)
        log.warning(
            "chat_work_stopped",
            chat_id=address.platform_chat_id,
            reason=reason,
            runs_cancelled=cancelled,
            tasks_cancelled=tasks_cancelled,
        )

    async def _membership_changed(self, chat_id: int, present: bool, reason: str) -> None:
        if not await self.conversation_allowed(chat_id):
            return  # a chat the bot does not work in: nothing of it is kept
        if present:
            log.info("chat_rejoined", chat_id=chat_id)
            return
        await self.outbox.chat_unreachable(chat_id, reason)

    async def wait_quiet(self, chat_id: int) -> None:
        """Until the chat has no turn and no subagent: both hold its typing indicator while they run, and a
        subagent whose result is in the chat is waited for until its container is gone."""
        while True:
            await self.typing.wait_idle(chat_id)
            if self.subagents is not None:
                await self.subagents.wait_ended(chat_id)
            if self.typing.holders(chat_id) == 0:
                return

    async def stop(self) -> None:
        """Stop taking work, finish writing, leave containers running for the next start to re-attach."""
        await self.channel.stop_receiving()
        await self.schedules.stop()
        await self.senses.close()
        await self.engine.close()
        if self.subagents is not None:
            await self.subagents.stop()
        if self.cards is not None:
            await self.cards.close()
        await self.questions.close_board()
        if self.announcer is not None:
            await self.announcer.close()
        await asyncio.gather(*self._notices, return_exceptions=True)  # stored, then sent by the outbox
        if self.streams is not None:
            await self.streams.close()
        if self.mcp is not None:
            await self.mcp.close()  # stdio servers' processes end with the bot
        await self.typing.close()
        await self.outbox.close()
        await self.channel.stop()
        await self.stores.db.close()
        log.info("crewbot_stopped")
