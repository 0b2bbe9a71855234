"""What a subagent run has printed: a live container's output so far, or the log kept after it ended, the
files it was given and sent, and its connections through the egress door (bot/run_web.py words them).

Only the tail is shown, cleaned of terminal control characters (a task's output is written by an LLM that
follows strangers' instructions). Used by `/subagents <run id>` and by `crewbot logs <run id>`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from bot.ports.runs import RunCancels, RunSummary, age_text, when_text
from bot.question_lines import question_lines
from bot.run_web import CHAT_CONNECTIONS, web_lines
from core.store.chat_files import size_text
from core.store.egress import EgressRecord, EgressStore, EgressTotals
from core.store.questions import Question, QuestionStore
from core.store.run_files import Direction, RunFile, RunFileStore
from core.store.runs import FINAL_STATUSES, FollowUp, RunRecord, RunStatus, RunStore

LATEST_PROGRESS_CHARS = 1_000  # what the main agent is shown of a run's latest message or outcome
CHAT_OUTPUT_TAIL_CHARS = 3_000  # fits one Telegram message (4,096) with the heading
BYTES_PER_CHAR_MAX = 4  # UTF-8: reading this many bytes per wanted character always covers the tail
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ANSI_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
MAX_LISTED_FILES = 10  # of each direction; the rest are counted ("and 3 more")
MAX_SHOWN_NAME_CHARS = 80  # a file's name is safe already (no paths, no control characters), but may be long


class ContainerLogs(Protocol):
    async def logs(self, container_id: str) -> bytes:
        """stdout and stderr so far; empty if the container is gone."""


@dataclass(frozen=True, slots=True)
class RunOutput:
    record: RunRecord
    text: str  # the tail, cleaned
    total_chars: int  # of the whole output that was read
    problem: str | None = None  # why there is no output to show, when there is none
    files: Sequence[RunFile] = field(default_factory=tuple)  # given and sent, in the order recorded
    web: EgressTotals = field(default_factory=EgressTotals)  # every connection through the door, counted
    connections: Sequence[EgressRecord] = field(default_factory=tuple)  # the latest recorded, oldest first
    questions: Sequence[Question] = field(default_factory=tuple)  # to the chat, and their decisions, in order

    @property
    def extra_lines(self) -> list[str]:
        """Its files in and out, its web totals and latest connections, then its questions and decisions: each
        only when it has any."""
        return [*files_lines(self.files), *web_lines(self.web, self.connections), *question_lines(self.questions)]


def clean(data: bytes) -> str:
    text = _ANSI_SEQUENCE.sub("", data.decode("utf-8", errors="replace")).replace("\r\n", "\n")
    return _CONTROL_CHARS.sub("", text.replace("\r", "\n"))


def _read_tail(path: Path, max_bytes: int) -> bytes | None:
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(0, size - max_bytes))
            return file.read(max_bytes)
    except FileNotFoundError:
        return None


def _shown_name(name: str) -> str:
    shown = name if len(name) <= MAX_SHOWN_NAME_CHARS else name[: MAX_SHOWN_NAME_CHARS - 1] + "…"
    return shown.replace("`", "'")  # the chat renders Markdown: a name opens no code span


def _file_text(file: RunFile) -> str:
    kind = f", {file.kind}" if file.direction is Direction.OUT else ""
    return f"{_shown_name(file.name)} ({size_text(file.size_bytes)}{kind})"


def files_lines(files: Sequence[RunFile]) -> list[str]:
    """`Files in: sales.csv (412 KB)` and `Files out: chart.png (34 KB, photo)`, each only when there are any."""
    lines: list[str] = []
    for direction, heading in ((Direction.IN, "Files in"), (Direction.OUT, "Files out")):
        of_direction = [f for f in files if f.direction is direction]
        if not of_direction:
            continue
        shown = ", ".join(_file_text(f) for f in of_direction[:MAX_LISTED_FILES])
        more = len(of_direction) - MAX_LISTED_FILES
        lines.append(f"{heading}: {shown}" + (f" and {more} more" if more > 0 else ""))
    return lines


class RunOutputReader:
    def __init__(
        self,
        runs: RunStore,
        logs: ContainerLogs,
        kept_log: Callable[[str], Path],
        files: RunFileStore | None = None,
        egress: EgressStore | None = None,
        questions: QuestionStore | None = None,
    ) -> None:
        self._runs = runs
        self._questions = questions  # what the run asked the chat and its approval; None: not shown
        self._logs = logs
        self._kept_log = kept_log  # where the host keeps a finished run's container log
        self._files = files  # the files runs were given and sent; None: not shown
        self._egress = egress  # the runs' connections through the door; None: not shown

    async def read(self, run_id: str, tail_chars: int, connections: int = CHAT_CONNECTIONS) -> RunOutput | None:
        """None when there is no such run. `connections`: how many of its latest connections to list."""
        record = await self._runs.get(run_id)
        if record is None:
            return None
        files = await self._files.of_run(record.id) if self._files is not None else []
        web = EgressTotals()
        latest: list[EgressRecord] = []
        if self._egress is not None:
            web = await self._egress.run_totals(record.id)
            latest = await self._egress.of_run(record.id, connections) if connections > 0 else []
        asked = await self._questions.for_run(record.id) if self._questions is not None else []
        result = await self._read_output(record, tail_chars, files, web, latest)
        return replace(result, questions=tuple(asked))

    async def _read_output(
        self,
        record: RunRecord,
        tail_chars: int,
        files: Sequence[RunFile],
        web: EgressTotals,
        latest: Sequence[EgressRecord],
    ) -> RunOutput:
        max_bytes = tail_chars * BYTES_PER_CHAR_MAX
        data: bytes | None = None
        if record.status in FINAL_STATUSES:
            data = await asyncio.to_thread(_read_tail, self._kept_log(record.id), max_bytes)
        if data is None and record.container_id is not None:
            try:
                data = await self._logs.logs(record.container_id)
            except Exception as exc:  # the engine is down or refuses: say so, do not fail the command
                problem = f"its container's output cannot be read ({_first_line(exc)})"
                return RunOutput(record, "", 0, problem, files, web, latest)
        if data is None:
            problem = "it has no container yet" if record.status not in FINAL_STATUSES else "no output was kept"
            return RunOutput(record, "", 0, problem, files, web, latest)
        text = clean(data)
        return RunOutput(record, text[-tail_chars:], len(text), None, files, web, latest)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def describe_state(record: RunRecord, now: float) -> str:
    if record.status in FINAL_STATUSES:
        ended = f", {age_text(now - record.finished_at)} ago" if record.finished_at is not None else ""
        return f"{record.status}{ended}"
    return f"{record.status} for {age_text(now - (record.started_at or record.created_at))}"


def describe(output: RunOutput, now: float | None = None) -> str:
    """The chat's view: the run's state, the files it was given and sent, its web connections, then its output's
    tail in a code block."""
    record = output.record
    heading = f"Run {record.id} ({record.label}): {describe_state(record, now or time.time())}."
    extra = output.extra_lines
    if output.problem is not None:
        said = f"No output to show: {output.problem}."
    elif not output.text.strip():
        said = "No output yet."
    else:
        shown = "" if output.total_chars <= len(output.text) else f" (the last {len(output.text):,} characters)"
        label = "Output so far" if record.status not in FINAL_STATUSES else "Its output"
        body = output.text.strip("\n").replace("```", "'''")  # keep the code block closed
        said = f"{label}{shown}:\n```\n{body}\n```"
    return "\n".join([heading, *extra, said]) if extra else f"{heading} {said}"


class RunsView:
    """The chat commands' RunControl: the manager's cancels, and the one listing of a chat's runs, from the store
    (with end times and output so far)."""

    def __init__(
        self,
        control: RunCancels,
        runs: RunStore,
        output: RunOutputReader,
        send: Callable[[int, str, str], FollowUp] | None = None,
    ) -> None:
        self._control = control
        self._runs = runs
        self._output = output
        self._send = send  # the subagent side's follow-up delivery (chat id, run id, text)

    async def describe_run(self, chat_id: int, run_id: str) -> str | None:
        """For the main agent's `subagents` tool: what the store knows of one of the chat's runs."""
        record = await self._runs.get(run_id)
        if record is None or record.chat_id != chat_id:
            return None
        now = time.time()
        tokens = record.input_tokens + record.output_tokens
        lines = [f"Run {record.id} ({record.label}): {record.status} {when_text(record, now)}, {tokens:,} tokens."]
        latest = await self._runs.latest_progress(run_id)
        if latest:
            lines.append(f"Its latest progress message: {latest[-LATEST_PROGRESS_CHARS:]}")
        if record.status in FINAL_STATUSES and (record.result or record.error):
            lines.append(f"Its outcome: {(record.result or record.error or '')[:LATEST_PROGRESS_CHARS]}")
        return "\n".join(lines)

    async def send_to_run(self, chat_id: int, run_id: str, text: str) -> FollowUp:
        return self._send(chat_id, run_id, text) if self._send is not None else FollowUp.NOT_RUNNING

    async def list_runs(self, chat_id: int, limit: int) -> list[RunSummary]:
        return [
            RunSummary(
                id=r.id,
                label=r.label,
                status=r.status,
                created_at=r.created_at,
                started_at=r.started_at,
                finished_at=r.finished_at,
            )
            for r in await self._runs.for_chat(chat_id, limit)
        ]

    async def cancel_run(self, chat_id: int, run_id: str) -> RunStatus | None:
        return await self._control.cancel_run(chat_id, run_id)

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        return await self._control.cancel_chat(chat_id, reason)

    async def cancel_turn(self, turn_id: str, reason: str) -> int:
        return await self._control.cancel_turn(turn_id, reason)

    async def run_output(self, chat_id: int, run_id: str) -> str | None:
        record = await self._runs.get(run_id)
        if record is None or record.chat_id != chat_id:  # another chat's run does not exist for this one
            return None
        output = await self._output.read(run_id, CHAT_OUTPUT_TAIL_CHARS)
        return describe(output) if output is not None else None
