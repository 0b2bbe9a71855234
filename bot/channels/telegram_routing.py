"""Where a Telegram message belongs: its forum topic, a group's upgrade to a supergroup, and the plain
mapping used when no conversation directory is given (chat ids are Telegram's own)."""

from __future__ import annotations

from telegram import Message

from core.store.chats import ChatAddress


def thread_of(message: Message) -> int | None:
    """The forum topic a message was written in. Outside forums `message_thread_id` marks reply threads,
    which are not conversations of their own."""
    if message.chat.is_forum and message.is_topic_message and message.message_thread_id is not None:
        return int(message.message_thread_id)
    return None


def migration_of(message: Message) -> tuple[int, int] | None:
    """(old id, new id) when the message is the service message of a group's upgrade: Telegram posts
    `migrate_to_chat_id` in the old group and `migrate_from_chat_id` in the new supergroup."""
    if message.migrate_to_chat_id is not None:
        return message.chat.id, int(message.migrate_to_chat_id)
    if message.migrate_from_chat_id is not None:
        return int(message.migrate_from_chat_id), message.chat.id
    return None


class SameIds:
    """The directory when none is given: every chat id is its own address and there are no topics."""

    async def resolve(self, platform_chat_id: int, thread_id: int | None, kind: str, title: str | None) -> int:
        return platform_chat_id

    async def address(self, chat_id: int) -> ChatAddress:
        return ChatAddress(chat_id)

    async def conversations_of(self, platform_chat_id: int) -> list[int]:
        return [platform_chat_id]

    async def migrate(self, old_platform_id: int, new_platform_id: int) -> list[int]:
        return []
