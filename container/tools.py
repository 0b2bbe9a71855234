"""The subagent's tools: a shell, files in the workspace, and progress messages to the chat.

Each public coroutine of `Toolbox` is offered to the model as it is (container/tool_specs.py): its
docstring is the description the model reads. Failures raise `ToolFailed`, which the model sees as a
failed tool result (the run goes on); only a bug escapes as another exception.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from container.bash import run_command
from container.channel import ChannelRefused
from container.contract import MAX_PROGRESS_CHARS
from container.output import cap_text

READ_FILE_MAX_BYTES = 10_000_000
BINARY_SNIFF_BYTES = 8_192
LIST_MAX_ENTRIES = 500
MESSAGE_ID_BYTES = 8


class ToolFailed(Exception):
    """The tool call is done and failed; the model sees the message and adapts."""


class MessageSender(Protocol):
    """The run channel's side that carries progress messages to the chat."""

    async def send_message(self, message_id: str, text: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Toolbox:
    workspace_dir: Path
    channel: MessageSender
    bash_timeout_seconds: float
    output_cap_chars: int

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
        try:
            detail = await self.channel.send_message(secrets.token_hex(MESSAGE_ID_BYTES), text)
        except ChannelRefused as exc:
            raise ToolFailed(f"the message was not sent: {exc}") from exc
        except OSError as exc:
            raise ToolFailed(f"the message could not be sent: {exc.strerror or exc}") from exc
        return f"message sent{f' ({detail})' if detail else ''}"

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


def _os_failure(path: str, exc: OSError) -> ToolFailed:
    return ToolFailed(f"{path}: {exc.strerror or exc}")
