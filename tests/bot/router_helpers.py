"""What the InboundRouter tests share: the chats and users they use, `Bot` (the router with its engine,
stores and recording edges) and `handle_command`. The `bot` fixture is in conftest.py."""

from __future__ import annotations

from dataclasses import dataclass

from bot.router import InboundRouter
from bot.turns.engine import ChatEngine
from core.settings import Settings
from core.store import ChatStore, MessageStore, StoredMessage
from core.typing_indicator import TypingIndicator
from tests.bot.helpers import ControlledRunner, FakeRunControl, RecordingChannel, inbound

ALLOWED = -100777
STRANGER = -100999
ADMIN = 7
MEMBER = 42


class RecordingWorkspaces:
    """The `WorkspaceControl` at the edge: records what the commands asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def describe(self, chat_id: int) -> str:
        self.calls.append(("describe", chat_id))
        return "uses 1.0 MB of 1024 MB"

    async def clear(self, chat_id: int) -> str:
        self.calls.append(("clear", chat_id))
        return "Cleared this chat's workspace."


@dataclass
class Bot:
    settings: Settings
    channel: RecordingChannel
    chats: ChatStore
    messages: MessageStore
    runner: ControlledRunner
    engine: ChatEngine
    typing: TypingIndicator
    runs: FakeRunControl
    router: InboundRouter
    workspaces: RecordingWorkspaces

    async def stored(self, chat_id: int) -> list[StoredMessage]:
        return await self.messages.recent(chat_id, 100)

    async def last_reply(self, chat_id: int) -> str:
        await self.channel.wait_for(lambda: bool(self.channel.texts(chat_id)))
        return self.channel.texts(chat_id)[-1]


async def handle_command(
    bot: Bot, text: str, *, sender_id: int = MEMBER, platform_message_id: int = 50, chat_kind: str = "group"
) -> str:
    name, *args = text.removeprefix("/").split()
    await bot.router.handle(
        inbound(
            ALLOWED,
            text,
            platform_message_id=platform_message_id,
            sender_id=sender_id,
            chat_kind=chat_kind,
            triggers=True,
            command=name,
            command_args=tuple(args),
        )
    )
    return await bot.last_reply(ALLOWED)
