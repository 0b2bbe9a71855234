"""Lines in and out of a terminal for the console: readline editing, a prompt that survives replies, Ctrl-C at once.

Lines are read on a daemon thread of our own, not the event loop's executor: `asyncio.run` joins executor
threads on exit, so a reader blocked in `input()` would hold Ctrl-C until Enter was pressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import threading
from types import ModuleType
from typing import Any, TextIO

PROMPT = "> "
# A terminal without readline is in canonical mode: the kernel cuts a line at this many characters.
CANONICAL_LINE_LIMIT_CHARS = 4095
CLEAR_LINE = "\r\x1b[K"
# Everything a terminal could take as a command (escape sequences, bells, backspaces) except newline and tab:
# replies carry subagent output, which a hostile task controls.
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*([^*\n]+)\*\*")


def printable(text: str) -> str:
    """Text without what a terminal could take as a command (newline and tab stay): a card or a question shows a
    task, a label or a question a subagent wrote."""
    return _CONTROL_CHARS.sub("", text.replace("\r\n", "\n"))


def plain(text: str) -> str:
    """Markdown as a terminal shows it: inline `code` and **bold** lose their marks, fenced blocks stay."""
    lines = []
    fenced = False
    for line in printable(text).split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            line = _BOLD.sub(r"\1", _INLINE_CODE.sub(r"\1", line))
        lines.append(line)
    return "\n".join(lines)


def _load_readline() -> ModuleType | None:
    try:
        import readline
    except ImportError:  # some Python builds have none
        return None
    readline.set_completer(lambda text, state: None)  # Tab completing file names would only confuse
    return readline


class TerminalLines:
    """Reads lines from `stdin` and writes text to `stdout`.

    Interactive (both are this process's terminal): `input()` with readline, so arrow keys edit the line and
    recall earlier ones, and a line has no length limit; text written meanwhile appears above the prompt,
    which is redrawn with what was typed so far. Otherwise (a pipe, a file, a test's StringIO): plain lines.
    """

    def __init__(self, stdin: TextIO, stdout: TextIO, prompt: str = PROMPT) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._prompt = prompt
        on_terminal = stdin is sys.stdin and stdout is sys.stdout and stdin.isatty() and stdout.isatty()
        self._readline = _load_readline() if on_terminal else None
        self.interactive = self._readline is not None
        self.canonical_tty = on_terminal and self._readline is None
        self._saved_tty: list[Any] | None = None  # termios attributes, as tcgetattr gives them
        self._at_prompt = False
        self._lock = threading.Lock()
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interactive:
            self._saved_tty = self._tty_attributes()
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._read, args=(loop,), name="console-input", daemon=True)
        self._thread.start()

    async def next_line(self) -> str | None:
        """The next line without its newline; None at end of input."""
        return await self._queue.get()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            line: str | None
            try:
                if self.interactive:
                    self._at_prompt = True
                    try:
                        line = input(self._prompt)
                    finally:
                        self._at_prompt = False
                else:
                    raw = self._stdin.readline()
                    line = raw.rstrip("\r\n") if raw else None
            except EOFError:
                line = None
            except (OSError, ValueError):  # the terminal went away, or stdin was closed at exit
                line = None
            try:
                loop.call_soon_threadsafe(self._queue.put_nowait, line)
            except RuntimeError:  # the loop is closed: the program is ending
                return
            if line is None:
                return

    def write(self, text: str) -> None:
        """Print `text` as its own line(s); at the prompt, above it, keeping what was typed."""
        with self._lock:
            if self._at_prompt and self._readline is not None:
                typed = self._readline.get_line_buffer()
                self._stdout.write(f"{CLEAR_LINE}{text}\n{self._prompt}{typed}")
            else:
                self._stdout.write(text + "\n")
            self._stdout.flush()

    def finish(self, text: str = "") -> None:
        """End the session on a clean line (the prompt may still be showing) and give the terminal back."""
        with self._lock:
            if self._at_prompt:
                self._stdout.write(CLEAR_LINE)
            if text:
                self._stdout.write(text + "\n")
            self._stdout.flush()
            self._at_prompt = False
        self.restore()

    def restore(self) -> None:
        """readline puts the terminal in raw mode while it reads; leaving mid-line must not leave it so."""
        if self._saved_tty is None:
            return
        with contextlib.suppress(ImportError, OSError, ValueError):
            import termios

            termios.tcsetattr(self._stdin.fileno(), termios.TCSADRAIN, self._saved_tty)

    def _tty_attributes(self) -> list[Any] | None:
        try:
            import termios

            return list(termios.tcgetattr(self._stdin.fileno()))
        except (ImportError, OSError, ValueError):
            return None
