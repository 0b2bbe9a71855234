"""Inbound path: allow-list, store every visible message, then commands or a turn for triggering ones.

A press of a status card's button takes the same path, but is no chat message: nothing of it enters the
history the model reads. After the allow-list it is recorded (the `card_pressed` log line: chat, run,
action, who, the platform's press id) before anything is decided or done; what it does is recorded where it
happens (a cancelled run's status in the run store). The channel acknowledges the update only after this.
"""

from __future__ import annotations

from bot.card_presses import CardPresses
from bot.channels.buttons import CardAnswer, CardPress
from bot.channels.inbound import InboundMessage
from bot.commands import Commands
from bot.flood import FLOOD_NOTICE, FloodGuard
from bot.senses.transcriber import Job, Transcriber
from bot.senses.window import is_audio_file
from bot.turns.engine import ChatEngine
from core.delivery import Delivery
from core.logging import get_logger
from core.settings import Settings
from core.store.chats import ChatStore
from core.store.messages import MessageStore, NewMessage

log = get_logger(__name__)

MAX_STORED_MESSAGE_CHARS = 32_000  # Telegram caps text at 4,096; this bounds anything else (console, captions)


class InboundRouter:
    def __init__(
        self,
        settings: Settings,
        *,
        chats: ChatStore,
        messages: MessageStore,
        engine: ChatEngine,
        commands: Commands,
        delivery: Delivery,
        flood: FloodGuard,
        presses: CardPresses | None = None,
        transcriber: Transcriber | None = None,
    ) -> None:
        self._settings = settings
        self._chats = chats
        self._messages = messages
        self._engine = engine
        self._commands = commands
        self._delivery = delivery
        self._flood = flood
        self._presses = presses  # the card's buttons and a growing answer's Stop
        self._transcriber = transcriber  # STT_BASE_URL: voice to text, before the turn it may ask for

    async def _allowed(self, message: InboundMessage | CardPress) -> bool:
        # Any of its ids counts: a topic is allowed by its chat, an upgraded group by its old or its new id.
        if message.chat_kind == "console" or self._settings.chat_allowed(message.platform_id):
            return True
        return await self._chats.allowed(message.chat_id, self._settings.chat_allowed)

    async def press(self, press: CardPress) -> CardAnswer:
        """A card's button pressed: its answer, shown to the presser alone (see the module's docstring)."""
        if not await self._allowed(press):
            log.info("card_press_not_allowed", chat_id=press.platform_id, press_id=press.press_id)
            return CardAnswer(f"This chat is not enabled for {self._settings.assistant_name}.")
        log.info(
            "card_pressed",
            chat_id=press.chat_id,
            run_id=press.run_id,
            action=str(press.action),
            user_id=press.user_id,
            message_id=press.message_id,
            press_id=press.press_id,
        )
        if self._presses is None:
            return CardAnswer("Subagents are not enabled here.")
        return await self._presses.press(press)

    async def handle(self, message: InboundMessage) -> None:
        if not await self._allowed(message):
            log.info("chat_not_allowed", chat_id=message.platform_id, chat_kind=message.chat_kind)
            if message.command == "start":
                self._delivery.reply_unstored(
                    message.chat_id,
                    f"This chat is not enabled for {self._settings.assistant_name}. "
                    f"Its chat id is {message.platform_id}: an operator can add it to ALLOWED_CHAT_IDS.",
                )
            return
        await self._chats.ensure(message.chat_id, message.chat_kind, message.chat_title)
        # A reply to a subagent's question answers it (its writer checked, the answer stored): it asks no turn.
        questions = self._presses.questions if self._presses is not None else None
        answered = message.reply_to is not None and questions is not None and await questions.reply(message)
        content = message.text
        if len(content) > MAX_STORED_MESSAGE_CHARS:
            content = content[:MAX_STORED_MESSAGE_CHARS] + " [truncated]"
        row_id = await self._messages.add(
            NewMessage(
                chat_id=message.chat_id,
                sender_name=message.sender_name,
                content=content,
                sender_id=message.sender_id,
                platform_message_id=message.platform_message_id,
                edit_of=message.edit_of,
                edited_at=message.edited_at,
                timestamp=message.timestamp,
                is_trigger=message.triggers and not answered and not self._commands.handles(message.command),
                reply_to=message.reply_to,
                kind=message.kind,
                file=message.file,
            )
        )
        if row_id is None:
            log.info("duplicate_message_ignored", chat_id=message.chat_id, message_id=message.platform_message_id)
            return
        if self._commands.handles(message.command):
            await self._commands.handle(message)
        elif self._transcriber is not None and await self._transcribing(message, row_id):
            return  # its turn, if it asks for one, starts once its words are in (`_heard`)
        elif message.triggers and not answered:
            await self._trigger(message.chat_id, row_id, message.platform_message_id)

    async def _transcribing(self, message: InboundMessage, row_id: int) -> bool:
        stored = await self._messages.get(row_id) if message.file is not None else None
        if self._transcriber is None or stored is None or stored.file is None or not is_audio_file(stored.file):
            return False
        triggers, platform_id = message.triggers, message.platform_message_id

        async def heard(chat_id: int, message_id: int, words: str) -> None:
            if not triggers and not addresses(words, self._settings.assistant_name):
                return
            if not triggers:
                await self._messages.mark_trigger(message_id)
            await self._trigger(chat_id, message_id, platform_id)

        self._transcriber.accept(Job(message.chat_id, row_id, stored.file, message.platform_id), heard)
        return True

    async def _trigger(self, chat_id: int, row_id: int, platform_id: int | None) -> None:
        self._engine.notify(chat_id, row_id)
        if self._flood.should_notice(chat_id):
            log.info("chat_flooding", chat_id=chat_id)
            await self._delivery.notice(chat_id, FLOOD_NOTICE, wait=False, reply_to=platform_id)


def addresses(words: str, assistant_name: str) -> bool:
    """Whether spoken words start with the bot's name ("Crew, summarise this"), as a mention does in text."""
    head = words.lstrip(" \t\n\"'«„“¡¿-—").casefold()
    name = assistant_name.casefold()
    return head.startswith(name) and not head[len(name) : len(name) + 1].isalnum()
