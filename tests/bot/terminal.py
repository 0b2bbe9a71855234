"""A process on a pseudo-terminal, as a person at a terminal runs it: keys in, screen text out (stdlib `pty`)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import time
from collections.abc import Mapping, Sequence

READ_CHUNK_BYTES = 65536
_ESCAPES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


class TerminalProcess:
    """`pty.fork()`: the child gets the pseudo-terminal as its controlling terminal, so Ctrl-C typed
    there is a SIGINT from the terminal driver, exactly as at a real terminal."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: become the program
            try:
                os.chdir(cwd)
                os.execve(argv[0], list(argv), dict(env))
            finally:
                os._exit(127)
        self.pid = pid
        self._fd = fd
        self._output = bytearray()
        self.exit_status: int | None = None

    @property
    def output(self) -> str:
        """Everything the program wrote, terminal escape sequences removed."""
        return _ESCAPES.sub(b"", bytes(self._output)).decode("utf-8", errors="replace")

    def send(self, data: str) -> None:
        os.write(self._fd, data.encode())

    def _read(self, timeout_seconds: float) -> bool:
        ready, _, _ = select.select([self._fd], [], [], timeout_seconds)
        if not ready:
            return True
        try:
            chunk = os.read(self._fd, READ_CHUNK_BYTES)
        except OSError:  # EIO: the child closed the terminal (it exited)
            return False
        if not chunk:
            return False
        self._output += chunk
        return True

    def expect(self, text: str, timeout_seconds: float) -> None:
        """Wait until `text` has been written (after escape sequences are removed)."""
        deadline = time.monotonic() + timeout_seconds
        while text not in self.output:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.1)):
                if text in self.output:
                    return
                raise AssertionError(f"{text!r} did not appear; the terminal shows:\n{self.output[-3000:]}")

    def expect_last(self, text: str, timeout_seconds: float) -> None:
        """Wait until the output ends with `text` (say, the prompt redrawn under a reply)."""
        deadline = time.monotonic() + timeout_seconds
        while not self.output.endswith(text):
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.1)):
                if self.output.endswith(text):
                    return
                raise AssertionError(f"the output does not end with {text!r}:\n{self.output[-3000:]}")

    def wait_exit(self, timeout_seconds: float) -> int | None:
        """The exit code once it exits (reading what it writes meanwhile); None if it did not in time."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                while select.select([self._fd], [], [], 0)[0] and self._read(0):  # what it wrote last
                    pass
                self.exit_status = os.waitstatus_to_exitcode(status)
                return self.exit_status
            self._read(0.02)
        return None

    def close(self) -> None:
        """Kill it if it still runs (only this process, by its pid) and release the terminal."""
        if self.exit_status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self._fd)
