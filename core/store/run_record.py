"""A subagent run's record as the store keeps it, and the statuses it moves through."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import aiosqlite

from core.store.chat_files import stored_refs


class RunStatus(StrEnum):
    """A run's state: queued and running are live; the others are final, and a run reaches one once."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    REJECTED = "rejected"
    INTERRUPTED = "interrupted"


LIVE_STATUSES = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})
FINAL_STATUSES = frozenset(set(RunStatus) - LIVE_STATUSES)


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    chat_id: int
    turn_id: str | None
    task: str
    label: str
    include_context: bool
    status: RunStatus
    container_id: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    result: str | None
    error: str | None
    input_tokens: int
    output_tokens: int
    llm_requests: int
    session_in: str | None
    session_out: str | None
    messages_sent: int = 0
    container_started_at: float | None = None
    memory_peak_bytes: int | None = None  # None: unknown
    cpu_seconds: float | None = None  # None: unknown
    resource_samples: int = 0
    files: tuple[str, ...] = ()  # the chat files its request named (`f3`)
    egress_bytes: int = 0  # through the door, both ways
    egress_connections: int = 0
    needs_approval: bool = False  # SUBAGENT_APPROVAL=admins: it starts only once an admin approved it


def run_from_row(row: aiosqlite.Row) -> RunRecord:
    return RunRecord(
        id=row["id"],
        chat_id=row["chat_id"],
        turn_id=row["turn_id"],
        task=row["task"],
        label=row["label"],
        include_context=bool(row["include_context"]),
        status=RunStatus(row["status"]),
        container_id=row["container_id"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        error=row["error"],
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        llm_requests=row["llm_requests"],
        session_in=row["session_in"],
        session_out=row["session_out"],
        messages_sent=row["messages_sent"],
        container_started_at=row["container_started_at"],
        memory_peak_bytes=row["memory_peak_bytes"],
        cpu_seconds=row["cpu_seconds"],
        resource_samples=row["resource_samples"],
        files=stored_refs(row["files"]),
        egress_bytes=row["egress_bytes_up"] + row["egress_bytes_down"],
        egress_connections=row["egress_connections"],
        needs_approval=bool(row["needs_approval"]),
    )
