"""How a run's outcome reads in the chat: the `[Subagent]` message's wording and its size limits."""

from __future__ import annotations

from container.protocol import SpawnRequest
from core.store.chat_files import size_text
from core.store.runs import RunRecord, RunStatus

SUBAGENT_SENDER = "[Subagent]"
MAX_RESULT_CHARS = 20_000  # a result longer than this is cut before it is stored and sent
MAX_ERROR_CHARS = 1_000  # a failure's reason is a line or a few, never a flood
MAX_LABEL_CHARS = 80


def label_for(request: SpawnRequest, continues: RunRecord | None = None) -> str:
    """The model's label, else the task's first line; a run continuing an earlier one says so."""
    if continues is not None:
        return f"follow-up: {continues.label}"[:MAX_LABEL_CHARS]
    if request.label and request.label.strip():
        return " ".join(request.label.split())[:MAX_LABEL_CHARS]
    first = request.task.strip().splitlines()[0] if request.task.strip() else "task"
    return first[:60]


def subagent_content(label: str, body: str) -> str:
    """The stored and sent form of a subagent's outcome, as the design's contract fixes it."""
    return f"[Task: {label}]\n{body}"


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [{len(text) - limit} more characters cut]"


def outcome_body(status: str, *, result: str | None, error: str | None) -> str:
    """The message body for a final status; results and errors cut to their limits."""
    if status == RunStatus.COMPLETED:
        return cut(result or "", MAX_RESULT_CHARS)
    reason = cut(error or "", MAX_ERROR_CHARS)
    if status == RunStatus.TIMED_OUT:
        return f"Timed out: {reason}"
    if status == RunStatus.INTERRUPTED:
        return f"Interrupted: {reason}"
    return f"Failed: {reason}"


def files_sent_line(files: list[tuple[str, int]]) -> str:
    """`Files sent: chart.png (34 KB), data.csv (2 KB)`: what the run sent the chat, as the host received it."""
    return "Files sent: " + ", ".join(f"{name} ({size_text(size)})" for name, size in files)
