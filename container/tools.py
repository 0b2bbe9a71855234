"""The subagent's tools: a shell, files in the workspace, progress messages and files to the chat.

Each public coroutine of `Toolbox` is offered to the model as it is (container/tool_specs.py): its
docstring is the description the model reads. Failures raise `ToolFailed`, which the model sees as a
failed tool result (the run goes on); only a bug escapes as another exception.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from container.bash import run_command
from container.channel import ChannelRefused
from container.contract import (
    MAX_ASK_OPTIONS,
    MAX_CAPTION_CHARS,
    MAX_OPTION_CHARS,
    MAX_PROGRESS_CHARS,
    MAX_QUESTION_CHARS,
)
from container.forwarder import shell_environment
from container.output import cap_text
from container.task import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_FILES_OUT

READ_FILE_MAX_BYTES = 10_000_000
BINARY_SNIFF_BYTES = 8_192
LIST_MAX_ENTRIES = 500
MESSAGE_ID_BYTES = 8
ASK_ID_BYTES = 8
UPLOAD_ID_BYTES = 8
TOO_MANY_STATUS = 429  # the host's answer once the run has sent its SUBAGENT_MAX_MESSAGES
# The last component is opened as it is: a link is refused (ELOOP), a FIFO opens at once (no writer needed)
# so fstat can refuse it; the bytes are then read from this fd, never by name again.
_OPEN_TO_SEND = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ToolFailed(Exception):
    """The tool call is done and failed; the model sees the message and adapts."""


class MessageSender(Protocol):
    """The run channel's side that carries progress messages to the chat."""

    async def send_message(self, message_id: str, text: str) -> str: ...


class FileSender(Protocol):
    """The run channel's side that carries files to the chat: `size` bytes of the open file `fd`."""

    async def send_file(self, upload_id: str, name: str, caption: str | None, fd: int, size: int) -> str: ...


class QuestionAsker(Protocol):
    """The run channel's side that asks the chat and brings its answer back (an AskAnswer as JSON)."""

    async def ask(self, ask_id: str, question: str, options: list[str]) -> dict[str, Any]: ...


class ChatSender(MessageSender, FileSender, QuestionAsker, Protocol):
    """All three: what the run channel is to the tools."""


@dataclass(slots=True)
class FilesSent:
    """The run's count of files sent, and why it may send no more messages: the mutable part of the Toolbox."""

    count: int = 0
    messages_refused: str | None = None  # the host's word once the run's messages are used up
    questions_refused: str | None = None  # the host's word once the run's questions are used up


@dataclass(frozen=True, slots=True)
class Toolbox:
    workspace_dir: Path
    channel: ChatSender
    bash_timeout_seconds: float
    output_cap_chars: int
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_files_out: int = DEFAULT_MAX_FILES_OUT
    files_sent: FilesSent = field(default_factory=FilesSent)
    proxy_url: str | None = None  # the loopback forwarder's, when the run has egress: bash's commands use it

    async def bash(self, command: str) -> str:
        """Run a shell command with `bash -c` in the workspace directory and return its output.

        stdout and stderr are merged; the exit code is shown on the last line. Long output is cut in
        the middle. Commands are killed at the time limit, so start long jobs in the background and
        redirect their output to a file.

        Args:
            command: the shell command line, e.g. `ls -la && python3 script.py`.
        """
        if not command.strip():
            raise ToolFailed("the command is empty")
        result = await run_command(
            command,
            cwd=self.workspace_dir,
            timeout_seconds=self.bash_timeout_seconds,
            output_cap_chars=self.output_cap_chars,
            env=shell_environment(os.environ, self.proxy_url),
        )
        return result.render(self.bash_timeout_seconds)

    async def read_file(self, path: str) -> str:
        """Return the text of a file. Long files are cut in the middle (use bash `sed -n` for parts).

        Args:
            path: file path, relative to the workspace directory or absolute.
        """
        target = self._resolve(path)
        try:
            size = target.stat().st_size
            if target.is_dir():
                raise ToolFailed(f"{path} is a directory; use list_files")
            if size > READ_FILE_MAX_BYTES:
                raise ToolFailed(
                    f"{path} has {size} bytes, more than {READ_FILE_MAX_BYTES}; read parts of it with bash"
                )
            data = target.read_bytes()
        except OSError as exc:
            raise _os_failure(path, exc) from exc
        if b"\0" in data[:BINARY_SNIFF_BYTES]:
            raise ToolFailed(f"{path} is a binary file ({size} bytes); inspect it with bash")
        return cap_text(data.decode("utf-8", errors="replace"), self.output_cap_chars)

    async def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file with `content`, creating missing parent directories.

        Args:
            path: file path, relative to the workspace directory or absolute.
            content: the complete new text of the file.
        """
        target = self._resolve(path)
        try:
            if target.is_dir():
                raise ToolFailed(f"{path} is a directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise _os_failure(path, exc) from exc
        return f"wrote {len(content)} characters to {path}"

    async def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace one exact occurrence of `old` with `new` in a file.

        `old` must occur exactly once: include enough surrounding lines to make it unique.

        Args:
            path: file path, relative to the workspace directory or absolute.
            old: the exact text to replace, whitespace included.
            new: the replacement text.
        """
        if not old:
            raise ToolFailed("`old` is empty; use write_file to create or overwrite a file")
        target = self._resolve(path)
        try:
            if target.is_dir():
                raise ToolFailed(f"{path} is a directory")
            text = target.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ToolFailed(f"{path} is not UTF-8 text; edit it with bash") from exc
        except OSError as exc:
            raise _os_failure(path, exc) from exc
        count = text.count(old)
        if count == 0:
            raise ToolFailed(f"`old` was not found in {path}; read the file and copy the text exactly")
        if count > 1:
            raise ToolFailed(f"`old` occurs {count} times in {path}; include more surrounding text to make it unique")
        try:
            target.write_text(text.replace(old, new, 1), encoding="utf-8")
        except OSError as exc:
            raise _os_failure(path, exc) from exc
        return f"edited {path}: replaced 1 occurrence ({len(old)} -> {len(new)} characters)"

    async def list_files(self, path: str = ".") -> str:
        """List a directory: one entry per line, `/` after directories, sizes of files in bytes.

        Args:
            path: directory path, relative to the workspace directory or absolute; default the workspace.
        """
        target = self._resolve(path)
        try:
            if not target.is_dir():
                target.stat()  # raises for a missing path
                return _describe(target, target.name)
            entries = sorted(target.iterdir(), key=lambda entry: entry.name)
            lines = [_describe(entry, entry.name) for entry in entries[:LIST_MAX_ENTRIES]]
        except OSError as exc:
            raise _os_failure(path, exc) from exc
        if not entries:
            return f"{path} is empty"
        if len(entries) > LIST_MAX_ENTRIES:
            lines.append(f"[... {len(entries) - LIST_MAX_ENTRIES} more entries; use bash to filter]")
        return "\n".join(lines)

    async def send_message(self, text: str) -> str:
        """Send a short progress message to the chat now, while you keep working.

        Use it sparingly, for news the users should not wait for; your final answer is sent anyway.

        Args:
            text: the message, plain text.
        """
        if not text.strip():
            raise ToolFailed("the message is empty")
        if len(text) > MAX_PROGRESS_CHARS:
            raise ToolFailed(f"the message has {len(text)} characters; the limit is {MAX_PROGRESS_CHARS}")
        if self.files_sent.messages_refused is not None:
            # Asked once: the host counts a run that keeps sending past its budget as misbehaving.
            raise ToolFailed(f"the message was not sent: {self.files_sent.messages_refused}")
        try:
            detail = await self.channel.send_message(secrets.token_hex(MESSAGE_ID_BYTES), text)
        except ChannelRefused as exc:
            if exc.status == TOO_MANY_STATUS:
                self.files_sent.messages_refused = str(exc)
            raise ToolFailed(f"the message was not sent: {exc}") from exc
        except OSError as exc:
            raise ToolFailed(f"the message could not be sent: {exc.strerror or exc}") from exc
        return f"message sent{f' ({detail})' if detail else ''}"

    async def send_file(self, path: str, caption: str | None = None) -> str:
        """Send a file from the workspace to the chat, e.g. a report or a chart you made.

        Only a regular file under the workspace directory (not a link); the run may send a few files, each
        up to a size limit, and a refusal says which limit.

        Args:
            path: file path, relative to the workspace directory or absolute (under it).
            caption: optional text shown with the file, up to 1024 characters.
        """
        if caption is not None and len(caption) > MAX_CAPTION_CHARS:
            raise ToolFailed(f"the caption has {len(caption)} characters; the limit is {MAX_CAPTION_CHARS}")
        if self.files_sent.count >= self.max_files_out:
            raise ToolFailed(f"{path} was not sent: this run has sent its {self.max_files_out} files, the limit")
        fd, name = self._open_to_send(path)
        try:
            size = self._size_to_send(path, fd)
            self.files_sent.count += 1  # counted before the await: a second call meanwhile sees it
            try:
                detail = await self.channel.send_file(
                    secrets.token_hex(UPLOAD_ID_BYTES), name, caption or None, fd, size
                )
            except BaseException:
                self.files_sent.count -= 1
                raise
        except ChannelRefused as exc:
            raise ToolFailed(f"{path} was not sent: {exc}") from exc
        except OSError as exc:
            raise ToolFailed(f"{path} could not be sent: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        return f"sent {name} ({size} bytes) to the chat{f' ({detail})' if detail else ''}"

    async def ask_chat(self, question: str, options: list[str] | None = None) -> str:
        """Ask the chat a question and wait for its answer: use it only for a decision you cannot make yourself.

        The question appears in the chat as a reply to the request that started you; with `options` each is a
        button to tap, without them a member answers by replying. Only one question at a time, and a few per
        run. The answer comes back as this tool's result; if nobody answers in time, it says so: then decide
        yourself, or say in your result what you need.

        Args:
            question: the question, plain text, short and self-contained (up to 1000 characters).
            options: optional list of short answers to choose from, one button each (up to 8, 60 characters each).
        """
        text = question.strip()
        choices = [option.strip() for option in options or []]
        if not text:
            raise ToolFailed("the question is empty")
        if len(text) > MAX_QUESTION_CHARS:
            raise ToolFailed(f"the question has {len(text)} characters; the limit is {MAX_QUESTION_CHARS}")
        if len(choices) > MAX_ASK_OPTIONS:
            raise ToolFailed(f"{len(choices)} options; at most {MAX_ASK_OPTIONS} (one button each)")
        if any(not choice or len(choice) > MAX_OPTION_CHARS for choice in choices):
            raise ToolFailed(f"each option needs 1 to {MAX_OPTION_CHARS} characters: it is a button's label")
        if self.files_sent.questions_refused is not None:
            raise ToolFailed(f"the question was not asked: {self.files_sent.questions_refused}")
        try:
            answer = await self.channel.ask(secrets.token_hex(ASK_ID_BYTES), text, choices)
        except ChannelRefused as exc:
            if exc.status == TOO_MANY_STATUS:
                self.files_sent.questions_refused = str(exc)
            raise ToolFailed(f"the question was not asked: {exc}") from exc
        except OSError as exc:
            raise ToolFailed(f"the question could not be asked: {exc.strerror or exc}") from exc
        return _answer_text(answer)

    def _open_to_send(self, path: str) -> tuple[int, str]:
        """The open file and its name, if `path` is under the workspace and no link; else ToolFailed."""
        if not path.strip():
            raise ToolFailed("the path is empty")
        full = os.path.join(self.workspace_dir, path)  # an absolute `path` replaces the workspace part
        parent, name = os.path.split(full)
        if name in ("", ".", ".."):
            raise ToolFailed(f"{path} is a directory; send a file")
        try:
            # The real folder holding it, links and `..` resolved; the last component is not resolved but
            # opened with O_NOFOLLOW, so a link there (to /proc/self/mem, or to anything) is refused.
            workspace = os.path.realpath(self.workspace_dir)
            real_parent = os.path.realpath(parent)
            if os.path.commonpath([workspace, real_parent]) != workspace:
                raise ToolFailed(f"{path} is outside the workspace {self.workspace_dir}; only files under it are sent")
            dir_fd = os.open(real_parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                return os.open(name, _OPEN_TO_SEND, dir_fd=dir_fd), name
            finally:
                os.close(dir_fd)
        except ValueError as exc:  # a NUL byte, or text the file system cannot encode
            raise ToolFailed(f"{path[:100]!r} is not a usable path: {exc}") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolFailed(f"{path} is a symbolic link; only a file itself is sent") from exc
            raise _os_failure(path, exc) from exc

    def _size_to_send(self, path: str, fd: int) -> int:
        """The open file's size, if it is a regular file within the limit (by its size: nothing is read)."""
        mode, size = (info := os.fstat(fd)).st_mode, info.st_size
        if stat.S_ISDIR(mode):
            raise ToolFailed(f"{path} is a directory; send a file (pack a folder with zip or tar first)")
        if not stat.S_ISREG(mode):
            raise ToolFailed(f"{path} is not a regular file (a FIFO, a socket or a device); it is not sent")
        if size > self.max_file_bytes:
            raise ToolFailed(f"{path} has {size} bytes; a file sent may have at most {self.max_file_bytes}")
        if size == 0:
            raise ToolFailed(f"{path} is empty; the chat takes no empty files")
        return size

    def _resolve(self, path: str) -> Path:
        # No confinement here: the container's mounts and permissions are the boundary, as for bash.
        if not path.strip():
            raise ToolFailed("the path is empty")
        return self.workspace_dir / path  # an absolute `path` replaces the workspace part


def _describe(entry: Path, name: str) -> str:
    if entry.is_symlink():
        return f"{name} -> {entry.readlink()}"
    if entry.is_dir():
        return f"{name}/"
    return f"{name} ({entry.stat().st_size} bytes)"


def _answer_text(answer: dict[str, Any]) -> str:
    """ask_chat's result as the model reads it."""
    outcome, detail = answer.get("outcome"), str(answer.get("detail") or "")
    if outcome == "answered":
        return f"{answer.get('by') or 'A member'} answered: {answer.get('answer') or ''}"
    if outcome == "no_answer":
        return f"Nobody answered in time{f' ({detail})' if detail else ''}: decide yourself, or say what you need."
    return f"The question was closed without an answer{f' ({detail})' if detail else ''}."


def _os_failure(path: str, exc: OSError) -> ToolFailed:
    return ToolFailed(f"{path}: {exc.strerror or exc}")
