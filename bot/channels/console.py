"""The console channel: chat with the same engine from a terminal, as a member of a local group chat."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
import time
from typing import TextIO

from bot.channels.base import InboundHandler
from bot.inbound import InboundMessage
from bot.logging import get_logger

log = get_logger(__name__)

CONSOLE_CHAT_ID = -1  # a local "group" that never collides with a Telegram chat id (those are ≠ -1)
CONSOLE_USER_ID = 1
QUIT_COMMANDS = frozenset({"/quit", "/exit"})


class ConsoleChannel:
    """Every line you type is a message that asks for a turn; commands (/subagents, /stop...) work as in Telegram.

    End with /quit or end-of-input (Ctrl-D); `eof` is set then, so the caller can wait for running work.
    """

    name = "console"

    def __init__(
        self,
        assistant_name: str,
        *,
        user_name: str | None = None,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        typing_quiet_seconds: float = 8.0,
    ) -> None:
        self._assistant_name = assistant_name
        self._user_name = user_name or getpass.getuser() or "you"
        self._stdin = stdin or sys.stdin
        self._stdout = stdout or sys.stdout
        self._typing_quiet_seconds = typing_quiet_seconds
        self._last_typing = 0.0
        self._reader: asyncio.Task[None] | None = None
        self._next_id = 0
        self.eof = asyncio.Event()

    async def start(self, handler: InboundHandler) -> None:
        self._print(
            f"crewbot console: you are {self._user_name} in a local group chat with {self._assistant_name}. "
            "Type a message, /help, or /quit."
        )
        self._reader = asyncio.create_task(self._read_loop(handler), name="console-reader")

    async def stop_receiving(self) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _read_loop(self, handler: InboundHandler) -> None:
        try:
            while True:
                # A thread keeps this working for terminals, pipes and files alike.
                line = await asyncio.to_thread(self._stdin.readline)
                if not line:
                    break
                text = line.strip()
                if not text:
                    continue
                if text.lower() in QUIT_COMMANDS:
                    break
                try:
                    await handler(self._inbound(text))
                except Exception:
                    log.exception("console_message_failed")
        finally:
            self.eof.set()

    def _inbound(self, text: str) -> InboundMessage:
        self._next_id += 1
        command: str | None = None
        args: tuple[str, ...] = ()
        if text.startswith("/"):
            head, *rest = text.split()
            command, args = head[1:].partition("@")[0].lower(), tuple(rest)
        return InboundMessage(
            chat_id=CONSOLE_CHAT_ID,
            chat_kind="console",
            chat_title="console",
            sender_id=CONSOLE_USER_ID,
            sender_name=self._user_name,
            text=text,
            platform_message_id=self._next_id,
            triggers=True,
            command=command,
            command_args=args,
        )

    def _print(self, text: str) -> None:
        self._stdout.write(text + "\n")
        self._stdout.flush()

    def split(self, text: str) -> list[str]:
        return [text]  # a terminal has no message size limit

    async def send_part(self, chat_id: int, part: str) -> int | None:
        self._last_typing = 0.0
        self._print(part)
        return None

    async def send_text(self, chat_id: int, text: str) -> list[int]:
        await self.send_part(chat_id, text)
        return []

    async def send_typing(self, chat_id: int) -> None:
        now = time.monotonic()
        # Printing every few seconds would flood the terminal; say it once per quiet spell.
        if now - self._last_typing > self._typing_quiet_seconds:
            self._print(f"({self._assistant_name} is typing…)")
        self._last_typing = now

    async def is_chat_admin(self, chat_id: int, user_id: int) -> bool:
        return True
