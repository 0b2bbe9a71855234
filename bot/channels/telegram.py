"""The Telegram channel on python-telegram-bot 22: long polling, rate limiting, triggers, formatting."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from telegram import Bot, ChatMemberUpdated, Message, MessageEntity, ReplyParameters, Update
from telegram.constants import ChatAction, ChatMemberStatus, ChatType
from telegram.error import ChatMigrated, TelegramError
from telegram.ext import Application, ApplicationBuilder

from bot.channels.base import ChatAddress, ChatDirectory, DeliveryError, InboundHandler, MembershipHandler
from bot.channels.buttons import CardButton, PressHandler
from bot.channels.formatting import (
    TELEGRAM_MESSAGE_LIMIT_UNITS,
    split_message,
)
from bot.channels.inbound import InboundMessage
from bot.channels.polling import Poller, PollingTask, ReadableUpdatesRequest
from bot.channels.telegram_cards import Presses, edit_card, send_card
from bot.channels.telegram_files import download, file_of, send_file
from bot.channels.telegram_limits import MessageRateLimiter, delivery_error
from bot.channels.telegram_routing import SameIds, migration_of, thread_of
from bot.channels.telegram_stream import TelegramStreaming, html_or_plain
from bot.channels.webhook import WebhookConfig
from bot.channels.webhook_watch import WebhookReceiving, start_webhook
from core.logging import get_logger
from core.store.outbox import OutgoingFile

log = get_logger(__name__)

POLL_TIMEOUT_SECONDS = 10  # long-poll hold time; Telegram answers at once when updates are waiting
# A 429 goes back to the outbox, which retries that chat alone after retry_after. AIORateLimiter's own
# retries would sleep with every other request of the bot (all chats' sends, admin checks) held back.
RATE_LIMIT_MAX_RETRIES = 0
SPLIT_MARGIN_UNITS = 300  # HTML tags and escapes lengthen a chunk; leave room so it still fits
ALLOWED_UPDATES = [Update.MESSAGE, Update.EDITED_MESSAGE, Update.MY_CHAT_MEMBER, Update.CALLBACK_QUERY]
_MEDIA_KINDS = (
    "photo",
    "video",
    "animation",
    "document",
    "audio",
    "voice",
    "video_note",
    "sticker",
    "contact",
    "location",
    "venue",
    "poll",
    "dice",
    "story",
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_PRESENT_STATUSES = (ChatMemberStatus.MEMBER, ChatMemberStatus.ADMINISTRATOR, ChatMemberStatus.OWNER)


def _valid_unicode(text: str | None) -> str | None:
    """Lone surrogates (which JSON escapes can carry) cannot be stored as UTF-8: replace them."""
    return None if text is None else _valid_text(text)


def _valid_text(text: str) -> str:
    # One code point for one: entity offsets into the text stay right.
    return _LONE_SURROGATE.sub("\ufffd", text)


def _edit_time(message: Message) -> float:
    edit_date = message.edit_date or message.date  # Telegram always sets edit_date on an edit
    return edit_date.timestamp()


def _media_placeholder(message: Message) -> str | None:
    for kind in _MEDIA_KINDS:
        if getattr(message, kind, None):
            return f"[{kind.replace('_', ' ')}]"
    return None


def _sender_name(message: Message) -> tuple[int | None, str]:
    """Names and titles are user input like text: lone surrogates in them are replaced too."""
    if message.sender_chat is not None:
        chat = message.sender_chat
        return chat.id, _valid_text(chat.title or chat.effective_name or "chat")
    user = message.from_user
    if user is None:
        return None, "unknown"
    return user.id, _valid_text(user.full_name or user.username or str(user.id))


class TelegramChannel(TelegramStreaming):
    name = "telegram"

    def __init__(
        self,
        token: str,
        base_url: str,
        *,
        poll_timeout_seconds: int = POLL_TIMEOUT_SECONDS,
        webhook: WebhookConfig | None = None,  # set: webhook mode (Telegram POSTs updates), else long polling
    ) -> None:
        self._token = token
        self._webhook = webhook
        self._base_url = base_url
        self._poll_timeout_seconds = poll_timeout_seconds
        self._app: Application | None = None  # type: ignore[type-arg]
        self._handler: InboundHandler | None = None
        self._on_membership: MembershipHandler | None = None
        self._directory: ChatDirectory = SameIds()
        self._bot_id: int | None = None
        self._bot_username: str | None = None
        self._presses = Presses()  # the status card's buttons pressed (telegram_cards)
        self._drafts_refused: set[int] = set()  # private chats that refused sendMessageDraft (telegram_stream)
        self._polling: PollingTask | WebhookReceiving | None = None

    def _build(self) -> Application:  # type: ignore[type-arg]
        return (
            ApplicationBuilder()
            .token(self._token)
            .base_url(self._base_url)
            .base_file_url(file_url_for(self._base_url))
            .rate_limiter(MessageRateLimiter(max_retries=RATE_LIMIT_MAX_RETRIES))
            # Updates are handled one at a time by our poller: the handler only stores and hands off, so
            # chats still run concurrently in the engine, and order within a chat is Telegram's order.
            .updater(None)
            .get_updates_request(ReadableUpdatesRequest(read_timeout_seconds=self._poll_timeout_seconds + 10))
            .build()
        )

    async def start(
        self,
        handler: InboundHandler,
        on_membership: MembershipHandler | None = None,
        directory: ChatDirectory | None = None,
    ) -> None:
        self._handler = handler
        self._on_membership = on_membership
        self._directory = directory or SameIds()
        app = self._build()
        await app.initialize()  # getMe: fails here, clearly, on a bad token or an unreachable API
        self._app = app
        self._bot_id = app.bot.id
        self._bot_username = app.bot.username
        if self._webhook is not None:  # updates handled as polling's are: stored before Telegram gets its 200
            self._polling = await start_webhook(app.bot, self._webhook, self._on_update, ALLOWED_UPDATES)
        else:
            # Long polling and a webhook exclude each other; what is pending stays, for getUpdates.
            await app.bot.delete_webhook()
            poller = Poller(
                app.bot, self._on_update, timeout_seconds=self._poll_timeout_seconds, allowed_updates=ALLOWED_UPDATES
            )
            self._polling = PollingTask(poller, name="telegram-polling")
        mode = "polling" if self._webhook is None else "webhook"
        log.info("telegram_started", bot_username=self._bot_username, mode=mode)

    async def stop_receiving(self) -> None:
        polling, self._polling = self._polling, None
        if polling is not None:
            await polling.stop()

    def receiving_failure(self) -> BaseException | None:
        return None if self._polling is None else self._polling.failure

    async def wait_receiving_failure(self) -> BaseException:
        if self._polling is None:
            raise RuntimeError("the Telegram channel is not receiving")
        return await self._polling.wait_failure()

    async def stop(self) -> None:
        await self.stop_receiving()
        app, self._app = self._app, None
        if app is not None:
            await app.shutdown()

    def on_press(self, handler: PressHandler) -> None:
        self._presses.handler = handler

    async def _on_update(self, update: Update) -> None:
        if update.callback_query is not None:  # a card's button: answered always, acted on by the handler
            await self._presses.handle(self._bot().bot, update.callback_query, self._directory)
            return
        if update.my_chat_member is not None:
            await self._membership_changed(update.my_chat_member)
            return
        message = update.message or update.edited_message
        moved = migration_of(message) if message is not None else None
        if moved is not None:
            await self._migrated(*moved)
            return
        inbound = self.to_inbound(update)
        if inbound is None or self._handler is None:
            return
        conversation = await self._directory.resolve(
            inbound.chat_id, inbound.thread_id, inbound.chat_kind, inbound.chat_title
        )
        if conversation != inbound.chat_id:
            inbound = dataclasses.replace(inbound, chat_id=conversation, platform_chat_id=inbound.chat_id)
        await self._handler(inbound)

    async def _migrated(self, old_chat_id: int, new_chat_id: int) -> None:
        """The group became a supergroup: its conversations (history, runs, sessions, workspace, what is
        owed to it) stay as they are and are reached at the new id from now on."""
        moved = await self._directory.migrate(old_chat_id, new_chat_id)
        if moved:
            log.info("chat_migrated", old_chat_id=old_chat_id, new_chat_id=new_chat_id, conversations=moved)

    async def _membership_changed(self, change: ChatMemberUpdated) -> None:
        member = change.new_chat_member
        # A restricted member is still in the chat when Telegram says so; left and kicked are not.
        present = member.status in _PRESENT_STATUSES or (
            member.status == ChatMemberStatus.RESTRICTED and bool(getattr(member, "is_member", False))
        )
        chat = change.chat
        log.info("bot_membership_changed", chat_id=chat.id, status=str(member.status), present=present)
        if self._on_membership is not None:
            conversation = await self._directory.resolve(chat.id, None, str(chat.type), chat.title)
            await self._on_membership(conversation, present, f"the bot's status in the chat is now {member.status}")

    # --- classification -------------------------------------------------------------------------

    def to_inbound(self, update: Update) -> InboundMessage | None:
        """Turn an update into what the core understands; None for updates we deliberately skip."""
        edited = update.edited_message is not None
        message = update.edited_message or update.message
        if message is None:
            log.info("update_skipped", update_id=update.update_id, reason="not a message")
            return None
        chat = message.chat
        sender_id, sender_name = _sender_name(message)
        text = _valid_unicode(message.text or message.caption)
        kind = "text"
        file = None if edited else file_of(message)
        if edited:
            kind = "edit"
            text = f"[edited] {text or ''}".strip()
        elif file is not None:
            text, kind = text or "", "file"  # the prompt shows the file itself, with its caption
        elif text is None:
            placeholder = _media_placeholder(message)
            if placeholder is None:
                log.info("update_skipped", update_id=update.update_id, chat_id=chat.id, reason="service message")
                return None
            text, kind = placeholder, "placeholder"
        command, args = (None, ()) if edited else self._command(message)
        triggers = not edited and self._triggers(message, command)
        reply = message.reply_to_message
        return InboundMessage(
            chat_id=chat.id,
            chat_kind=str(chat.type),
            chat_title=_valid_unicode(chat.title or chat.effective_name),
            sender_id=sender_id,
            sender_name=sender_name,
            text=text,
            # An edit shares the original's id; storing it under None keeps the original row intact, and
            # (edit_of, edited_at) makes a redelivered edit a duplicate.
            platform_message_id=None if edited else message.message_id,
            edit_of=message.message_id if edited else None,
            thread_id=thread_of(message),
            edited_at=_edit_time(message) if edited else None,
            reply_to=reply.message_id if reply else None,
            triggers=triggers,
            sent_as_chat=message.sender_chat is not None and message.sender_chat.id == chat.id,
            kind=kind,
            command=command,
            command_args=args,
            timestamp=message.date.timestamp(),
            file=None if file is None else dataclasses.replace(file, name=_valid_text(file.name)),
        )

    def _command(self, message: Message) -> tuple[str | None, tuple[str, ...]]:
        text = _valid_text(message.text or "")  # the arguments reach the store (/cancel <run id>)
        entities = message.entities or ()
        if not text.startswith("/") or not any(e.type == MessageEntity.BOT_COMMAND and e.offset == 0 for e in entities):
            return None, ()
        head, *rest = text.split()
        name, _, addressee = head[1:].partition("@")
        if addressee and (self._bot_username is None or addressee.lower() != self._bot_username.lower()):
            return None, ()  # a command for another bot in the group
        return name.lower(), tuple(rest)

    def _triggers(self, message: Message, command: str | None) -> bool:
        if message.chat.type == ChatType.PRIVATE or command is not None:
            return True
        reply = message.reply_to_message
        if reply is not None and reply.from_user is not None and reply.from_user.id == self._bot_id:
            return True
        username = (self._bot_username or "").lower()
        try:
            entities = message.parse_entities() if message.text else message.parse_caption_entities()
        except UnicodeError:
            # Entity offsets are UTF-16; text with a lone surrogate cannot be sliced by them.
            return f"@{username}" in (message.text or message.caption or "").lower()
        for entity, value in entities.items():
            if entity.type == MessageEntity.MENTION and value.lower() == f"@{username}":
                return True
            if entity.type == MessageEntity.TEXT_MENTION and entity.user and entity.user.id == self._bot_id:
                return True
        return False

    # --- sending --------------------------------------------------------------------------------

    def _bot(self) -> Application:  # type: ignore[type-arg]
        if self._app is None:
            raise DeliveryError("the Telegram channel is not running", permanent=False)
        return self._app

    def split(self, text: str) -> list[str]:
        return split_message(text, TELEGRAM_MESSAGE_LIMIT_UNITS - SPLIT_MARGIN_UNITS)

    async def send_text(self, chat_id: int, text: str) -> list[int]:
        return [await self.send_part(chat_id, part) for part in self.split(text)]

    async def send_part(self, chat_id: int, chunk: str, reply_to: int | None = None) -> int:
        address = await self._directory.address(chat_id)
        # Sent without the reply when the message was deleted meanwhile: the answer matters more.
        reply = None if reply_to is None else ReplyParameters(reply_to, allow_sending_without_reply=True)
        try:
            try:
                return await self._send_to(address, chunk, reply)
            except ChatMigrated as exc:  # the group was upgraded and we had not seen the service message
                await self._migrated(address.platform_chat_id, int(exc.new_chat_id))
                # Sent plainly: the old group's message ids name other messages in the supergroup.
                return await self._send_to(ChatAddress(int(exc.new_chat_id), address.thread_id), chunk, None)
        except TelegramError as exc:
            raise delivery_error(exc) from exc

    async def _send_to(self, address: ChatAddress, chunk: str, reply: ReplyParameters | None) -> int:
        async def send(text: str, parse_mode: str | None) -> int:
            sent = await self._telegram().send_message(
                address.platform_chat_id,
                text,
                parse_mode=parse_mode,
                message_thread_id=address.thread_id,
                reply_parameters=reply,
            )
            return int(sent.message_id)

        return int(await html_or_plain(chunk, send))  # the limit counts the text, not tags

    def _telegram(self) -> Bot:
        bot: Bot = self._bot().bot
        return bot

    async def send_file(self, chat_id: int, file: OutgoingFile, caption: str, reply_to: int | None = None) -> int:
        address = await self._directory.address(chat_id)
        reply = None if reply_to is None else ReplyParameters(reply_to, allow_sending_without_reply=True)
        try:
            return await send_file(
                self._bot().bot, address.platform_chat_id, address.thread_id, file, _valid_text(caption), reply
            )
        except TelegramError as exc:
            raise delivery_error(exc) from exc

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        """A posted file's bytes (FileUnavailable says why not): for a run that needs it."""
        return await download(self._bot().bot, file_id, max_bytes)

    async def post_card(self, chat_id: int, text: str, reply_to: int | None, buttons: Sequence[CardButton] = ()) -> int:
        return await send_card(self._bot().bot, await self._directory.address(chat_id), text, reply_to, buttons)

    async def edit_card(self, chat_id: int, message_id: int, text: str, buttons: Sequence[CardButton] = ()) -> None:
        await edit_card(self._bot().bot, await self._directory.address(chat_id), message_id, text, buttons)

    async def send_typing(self, chat_id: int) -> None:
        address = await self._directory.address(chat_id)
        await self._bot().bot.send_chat_action(
            address.platform_chat_id, ChatAction.TYPING, message_thread_id=address.thread_id
        )

    async def is_chat_admin(self, chat_id: int, user_id: int) -> bool:
        address = await self._directory.address(chat_id)
        member = await self._bot().bot.get_chat_member(address.platform_chat_id, user_id)
        return member.status in (ChatMemberStatus.OWNER, ChatMemberStatus.ADMINISTRATOR)

    async def get_me(self) -> str:
        """For `crewbot doctor`: the bot's @username, raising on a bad token or unreachable API."""
        app = self._build()
        async with app:
            return str(app.bot.username)


def file_url_for(base_url: str) -> str:
    """Where the Bot API serves files: `…/bot` -> `…/file/bot` (Telegram's, a local server's, the test fake's)."""
    root, marker, _ = base_url.rstrip("/").rpartition("/bot")
    return f"{root}/file/bot" if marker else f"{base_url.rstrip('/')}/file/bot"
