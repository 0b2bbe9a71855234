"""The console channel: chat with the same engine from a terminal, as a member of a local group chat."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import getpass
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from bot.channels.base import ChatDirectory, DeliveryError, InboundHandler, MembershipHandler
from bot.channels.buttons import CardAction, CardButton, CardPress, PressHandler
from bot.channels.console_files import FILE_COMMAND, AttachError, attach, read_local, save_copy
from bot.channels.inbound import InboundMessage
from bot.channels.terminal import CANONICAL_LINE_LIMIT_CHARS, TerminalLines, plain, printable
from core.logging import get_logger
from core.store.outbox import OutgoingFile

log = get_logger(__name__)

CONSOLE_CHAT_ID = -1  # a local "group" that never collides with a Telegram chat id (those are ≠ -1)
CONSOLE_USER_ID = 1
QUIT_COMMANDS = frozenset({"/quit", "/exit"})
ANSWER_COMMAND = "/answer"  # `/answer <question id> <option number>`: a question's button, pressed on a terminal


class ConsoleChannel:
    """Every line you type is a message that asks for a turn; commands (/subagents, /stop...) work as in Telegram.

    End with /quit or end-of-input (Ctrl-D); `eof` is set then. On a terminal the caller stops at once; with
    piped input it can wait for running work first, so a scripted demo shows its results.
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
        intro: Sequence[str] = (),
        files_dir: Path | None = None,
    ) -> None:
        self._assistant_name = assistant_name
        self._user_name = user_name or getpass.getuser() or "you"
        self._lines = TerminalLines(stdin or sys.stdin, stdout or sys.stdout)
        self._typing_quiet_seconds = typing_quiet_seconds
        self._intro = list(intro)
        self._files_dir = files_dir  # where files a subagent sends are saved (DATA_DIR/console-files)
        self._last_typing = 0.0
        self._reader: asyncio.Task[None] | None = None
        self._press: PressHandler | None = None  # a question's buttons, typed as /answer (bot/question_presses.py)
        self.eof = asyncio.Event()

    def on_press(self, handler: PressHandler) -> None:
        self._press = handler

    @property
    def interactive(self) -> bool:
        """A person at a terminal (prompt, line editing), rather than piped input."""
        return self._lines.interactive

    async def start(
        self,
        handler: InboundHandler,
        on_membership: MembershipHandler | None = None,
        directory: ChatDirectory | None = None,
    ) -> None:
        self.say(
            f"crewbot console: you are {self._user_name} in a local group chat with {self._assistant_name}; "
            "every line you type is for it. /help lists commands; /quit or Ctrl-D leaves."
        )
        for line in self._intro:
            self.say(line)
        self._lines.start()
        self._reader = asyncio.create_task(self._read_loop(handler), name="console-reader")

    async def stop_receiving(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def stop(self) -> None:
        await self.stop_receiving()
        self._lines.restore()

    def say(self, text: str) -> None:
        """A line from crewbot itself (not the chat), shown above the prompt."""
        self._lines.write(text)

    def finish(self, text: str) -> None:
        """The last words of the session; the terminal is handed back as it was."""
        self._lines.finish(text)

    def abandon(self) -> None:
        """Leaving without a shutdown (a second Ctrl-C): at least give the terminal back."""
        self._lines.restore()

    async def _read_loop(self, handler: InboundHandler) -> None:
        try:
            while True:
                line = await self._lines.next_line()
                if line is None:
                    break
                text = line.strip()
                if not text:
                    continue
                if text.lower() in QUIT_COMMANDS:
                    break
                if self._lines.canonical_tty and len(line) >= CANONICAL_LINE_LIMIT_CHARS:
                    self.say(
                        f"(the terminal cut this line at {CANONICAL_LINE_LIMIT_CHARS:,} characters: "
                        "send long text in several lines)"
                    )
                if text.split(maxsplit=1)[0].lower() == ANSWER_COMMAND:
                    await self._answer(text)
                    continue
                try:
                    inbound = await self._file_message(text) if _is_file_command(text) else self._inbound(text)
                    if inbound is not None:
                        await handler(inbound)
                except Exception:
                    log.exception("console_message_failed")
                    self.say("(that message could not be handled; the log says why)")
        finally:
            self.eof.set()

    async def _answer(self, text: str) -> None:
        """`/answer <question id> <option number>`: the press of that button, decided by the press handler."""
        parts = text.split()
        if len(parts) != 3 or not parts[2].isascii() or not parts[2].isdigit():
            self.say(f"(usage: {ANSWER_COMMAND} <question id> <option number>)")
            return
        if self._press is None:
            self.say("(not now: the bot is starting)")
            return
        press = CardPress(
            chat_id=CONSOLE_CHAT_ID,
            chat_kind="console",
            user_id=CONSOLE_USER_ID,
            user_name=self._user_name,
            action=CardAction.ANSWER,
            run_id=parts[1][:64],
            press_id=f"console-{time.monotonic_ns()}",
            option=int(parts[2][:3]) - 1,
        )
        try:
            answer = await self._press(press)
        except Exception:
            log.exception("console_press_failed")
            self.say("(that answer could not be handled; the log says why)")
            return
        self.say(f"({answer.text})" if answer.text else "(done)")

    def _inbound(self, text: str) -> InboundMessage:
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
            # The console has no message ids: with one per process, a restart's ids would collide with
            # the stored ones and be ignored as duplicates.
            platform_message_id=None,
            triggers=True,
            command=command,
            command_args=args,
        )

    async def _file_message(self, text: str) -> InboundMessage | None:
        """`/file PATH [text]`: the file, posted with the text as its caption (a message for the bot)."""
        try:
            file, caption = await attach(text)
        except AttachError as exc:
            self.say(f"(no file attached: {exc})")
            return None
        self.say(f"(attached {file.name}, {file.size_bytes} bytes)")
        return dataclasses.replace(self._inbound(caption or ""), kind="file", file=file)

    def split(self, text: str) -> list[str]:
        return [text]  # a terminal has no message size limit

    async def send_part(self, chat_id: int, part: str, reply_to: int | None = None) -> int | None:
        self._last_typing = 0.0
        self.say(plain(part))
        return None

    async def post_card(
        self, chat_id: int, text: str, reply_to: int | None, buttons: Sequence[CardButton] = ()
    ) -> int | None:
        self.say(card_text(text, buttons))
        return None  # nothing to edit on a terminal: each change prints the card again

    async def edit_card(self, chat_id: int, message_id: int, text: str, buttons: Sequence[CardButton] = ()) -> None:
        self.say(card_text(text, buttons))

    async def send_text(self, chat_id: int, text: str) -> list[int]:
        await self.send_part(chat_id, text)
        return []

    async def send_file(
        self, chat_id: int, file: OutgoingFile, caption: str, reply_to: int | None = None
    ) -> int | None:
        self._last_typing = 0.0
        if self._files_dir is None:
            self.say(
                f"(a file, {file.name}: not saved, this console keeps no files)"
                + (f": {plain(caption)}" if caption else "")
            )
            return None
        try:
            saved = await asyncio.to_thread(save_copy, self._files_dir, file)
        except OSError as exc:
            raise DeliveryError(f"the file {file.name} was not saved: {exc.strerror or exc}", permanent=True) from exc
        self.say(f"(a file, {file.name}, saved as {saved})" + (f": {plain(caption)}" if caption else ""))
        return None

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        return await asyncio.to_thread(read_local, file_id, max_bytes)

    async def send_typing(self, chat_id: int) -> None:
        now = time.monotonic()
        # Printing every few seconds would flood the terminal; say it once per quiet spell.
        if now - self._last_typing > self._typing_quiet_seconds:
            self.say(f"({self._assistant_name} is typing…)")
        self._last_typing = now

    async def is_chat_admin(self, chat_id: int, user_id: int) -> bool:
        return True


def card_text(text: str, buttons: Sequence[CardButton]) -> str:
    """The card with its buttons as the commands that do the same: a terminal has nothing to press."""
    lines = [printable(text)]  # a run's label and task, a subagent's question and options: hostile text
    for button in buttons:
        if button.action is CardAction.ANSWER and button.option is not None:
            lines.append(f"  {ANSWER_COMMAND} {button.run_id} {button.option + 1} – {printable(button.label)}")
        elif button.action is CardAction.CANCEL:
            lines.append(f"  /cancel {button.run_id} – {printable(button.label)}")
        else:  # the console is one chat: its runs are this card's and those of any other turn
            lines.append("  /cancel all – cancel every run of this chat")
    return "\n".join(lines)


def _is_file_command(text: str) -> bool:
    return text == FILE_COMMAND or text.startswith(f"{FILE_COMMAND} ")
