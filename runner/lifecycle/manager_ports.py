"""What the task manager is handed: its stores, and the two small protocols it needs of others."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from core.questions import Questions
from core.store.chats import ChatStore
from core.store.messages import MessageStore
from core.store.run_files import RunFileStore
from core.store.runs import RunStore
from runner.channel.llm_allowance import Payer
from runner.channel.llm_proxy import Spent
from runner.channel.run_endpoint import RunInbox


class RunChannels(Protocol):
    """What the manager needs of the channel server (the LLM proxy): one socket per run."""

    async def open_run(
        self,
        run_id: str,
        socket_path: Path,
        *,
        endpoint: RunInbox,
        spent: Spent,
        payer: Payer,
        listening: socket.socket | None = None,
    ) -> None: ...

    async def close_run(self, run_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class RunStores:
    runs: RunStore
    chats: ChatStore
    messages: MessageStore
    files: RunFileStore
    questions: Questions | None = None  # the desk of questions to the chat (ask_chat, the door, approvals)


class TypingHolder(Protocol):
    def acquire(self, chat_id: int) -> None: ...

    def release(self, chat_id: int) -> None: ...
