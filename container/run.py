"""One subagent run: history in, the agent's loop through the host's model steps, history out, and the
RunResult to report."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from container.agent import ModelGaveUp, StepLimitReached, Usage, run_agent
from container.channel import ChannelRefused, RunChannel
from container.contract import CHANNEL_DIR, EGRESS_SOCKET_FILE, MAX_ERROR_CHARS, MAX_RESULT_CHARS
from container.forwarder import Forwarder
from container.inbox import fill_inbox
from container.session import dump_history, load_history
from container.task import RunResult, Task
from container.tool_specs import ToolSpec
from container.tools import Toolbox

MAX_ERROR_CAUSES = 3
DOOR = Path(CHANNEL_DIR) / EGRESS_SOCKET_FILE


async def run_task(
    task: Task,
    channel: RunChannel,
    workspace_dir: Path,
    log: Callable[[str], None],
    door: Path = DOOR,
    specs: dict[str, ToolSpec] | None = None,
) -> RunResult:
    """Run the agent on `task`; any failure becomes a `failed` result with a short reason. With egress, the
    bash tool's commands reach `door` (the host's web proxy) through a loopback forwarder while the run lasts.
    `specs`: the tools as offered, read before the task came (None: read now)."""
    usage = Usage()
    try:
        output = await _run(task, channel, workspace_dir, door, usage, log, specs)
    except StepLimitReached:
        return _failed(f"step limit reached: {task.max_steps} model requests", usage)
    except ModelGaveUp as exc:
        return _failed(str(exc), usage)
    except Exception as exc:  # the run's outcome is the report: every error ends up in the result
        return _failed(describe_error(exc), usage)
    return RunResult(
        status="completed",
        result=fit_result(output),
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
    )


async def _run(
    task: Task,
    channel: RunChannel,
    workspace_dir: Path,
    door: Path,
    usage: Usage,
    log: Callable[[str], None],
    specs: dict[str, ToolSpec] | None,
) -> str:
    forwarder = await _start_forwarder(task, door, log)
    try:
        if forwarder is None:
            task = dataclasses.replace(task, egress=None)  # the task text then promises no web
        return await _run_agent(task, channel, workspace_dir, forwarder, usage, log, specs)
    finally:
        if forwarder is not None:
            await forwarder.close()


async def _start_forwarder(task: Task, door: Path, log: Callable[[str], None]) -> Forwarder | None:
    """The loopback forwarder, listening, when the task has egress; None without, or when it cannot listen."""
    if task.egress is None:
        return None
    forwarder = Forwarder(door, log=lambda line: log(f"run {task.run_id}: {line}"))
    try:
        await forwarder.start()
    except OSError as exc:
        log(f"run {task.run_id}: no web access: the loopback proxy could not listen: {describe_error(exc)}")
        return None
    log(f"run {task.run_id}: egress ({task.egress.mode}) through the proxy at {forwarder.url}")
    return forwarder


async def _run_agent(
    task: Task,
    channel: RunChannel,
    workspace_dir: Path,
    forwarder: Forwarder | None,
    usage: Usage,
    log: Callable[[str], None],
    specs: dict[str, ToolSpec] | None,
) -> str:
    history, dropped = load_history(task.history)
    if dropped:
        log(f"run {task.run_id}: {dropped}")
    toolbox = Toolbox(
        workspace_dir=workspace_dir,
        channel=channel,
        bash_timeout_seconds=task.bash_timeout_seconds,
        output_cap_chars=task.output_cap_chars,
        max_file_bytes=task.max_file_bytes,
        max_files_out=task.max_files_out,
        proxy_url=forwarder.url if forwarder is not None else None,
    )
    inbox = await fill_inbox(task, channel, workspace_dir, lambda line: log(f"run {task.run_id}: {line}"))
    if task.files:
        log(f"run {task.run_id}: {len(inbox.files)} of {len(task.files)} files written to {inbox.path}")
    log(f"run {task.run_id}: {len(history)} prior messages, at most {task.max_steps} steps")
    conversation = await run_agent(task, history, channel, toolbox, usage, log, inbox, mcp=channel, specs=specs)
    await _save_session(channel, dump_history(conversation.messages), task.run_id, log)
    return conversation.output or ""


async def _save_session(channel: RunChannel, history_json: bytes, run_id: str, log: Callable[[str], None]) -> None:
    # The session only lets the chat's next run continue: losing it must not lose the answer of this one.
    try:
        await channel.save_session(history_json)
    except (ChannelRefused, OSError) as exc:
        log(f"run {run_id}: the session was not saved ({len(history_json)} bytes): {describe_error(exc)}")


def fit_result(output: str) -> str:
    """The answer as the channel takes it. One over MAX_RESULT_CHARS is cut at the end (the host keeps less
    still): otherwise it fails validation, the run reports nothing, and the whole answer is lost."""
    if len(output) <= MAX_RESULT_CHARS:
        return output
    note = f"\n… [the answer had {len(output)} characters; cut to fit the channel]"
    return output[: MAX_RESULT_CHARS - len(note)] + note


def describe_error(exc: BaseException) -> str:
    """`Type: message`, following the chain to the root cause."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < MAX_ERROR_CAUSES:
        text = str(current).strip()
        parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__ or current.__context__
    message = " <- ".join(parts)
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 3] + "..."


def _failed(error: str, usage: Usage) -> RunResult:
    return RunResult(
        status="failed",
        error=error,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
    )
