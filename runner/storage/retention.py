"""Retention: what runs leave behind on disk and in the database goes once it is older than the limit.

Run dirs and quarantined IPC entries were written by containers, so they are removed through
descriptors without following anything (`runner.storage.prune_entries`); file work runs in a
thread and database work in small batches, so neither holds up the event loop or other writers.
Run rows stay (statistics count them); only their bulky text is dropped. Streamed answers' figures
(`crewbot stats`, core/store/streamed_answers.py) are one row per answer, so they go by the same age. The
chat files runs were given and the files they sent go by runner/storage/file_retention.py's rules. A chat's
notes are its memory and stay while it keeps them, except once `/memory off` is older than the limit; messages
stay (the history index follows them: core/store/history.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from core.logging import get_logger
from core.store.db import Database
from core.store.notes import NoteStore
from core.store.runs import FINAL_STATUSES, RunStatus
from runner.ipc.requests import REASON_SUFFIX, errors_dir
from runner.storage.file_retention import FileRetention
from runner.storage.paths import DataPaths
from runner.storage.prune_entries import Entry, Removed, list_entries, remove_names

SECONDS_PER_DAY = 86_400.0
PRUNE_INTERVAL_SECONDS = 3_600.0  # a suggested pace for `run_forever`; pruning is cheap when little is due
PRUNE_BATCH_ROWS = 500  # rows changed per statement, so other writers get the database in between
LOOKUP_BATCH_IDS = 500  # ids per `IN (...)` lookup, well under SQLite's variable limit
PRUNED_TASK = "[pruned]"
PRUNED_TRANSCRIPT = "its words were pruned (DATA_RETENTION_DAYS)"
SESSION_SUFFIX = ".json"

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What one pass removed; `failures` counts entries that could not be removed (each logged)."""

    run_dirs: int = 0
    ipc_error_files: int = 0  # quarantined entries and their reason files
    session_files: int = 0
    run_texts: int = 0
    ipc_messages: int = 0
    outbox_rows: int = 0
    streamed_answers: int = 0  # rows of answers settled before the cutoff
    notes: int = 0  # of chats whose notes were turned off before the cutoff
    mcp_calls: int = 0  # rows of MCP tool calls made before the cutoff
    files_in: int = 0  # copies of chat files no run used for the period (DATA_DIR/files/in)
    files_out: int = 0  # copies of files runs sent, their sending over (DATA_DIR/files/out)
    out_folders: int = 0  # finished runs' emptied folders under DATA_DIR/files/out
    images_seen: int = 0  # posted images prepared for the model, unused for the period (DATA_DIR/files/seen)
    transcripts: int = 0  # voice notes' words older than the period (the row stays, saying they were pruned)
    failures: int = 0


class Retention:
    def __init__(
        self,
        db: Database,
        paths: DataPaths,
        retention_days: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not retention_days > 0:
            raise ValueError(f"retention_days must be positive, not {retention_days}")
        self._db = db
        self._paths = paths
        self._retention_seconds = retention_days * SECONDS_PER_DAY
        self._clock = clock
        self._files = FileRetention(db, paths, self._run_rows)
        self._lock = asyncio.Lock()  # one pass at a time, whoever asks

    async def run_forever(self, interval_seconds: float) -> None:
        """Prune now and then every `interval_seconds`; a failed pass is logged and the next one still runs."""
        while True:
            try:
                await self.prune()
            except Exception:
                log.exception("retention_failed")
            await asyncio.sleep(interval_seconds)

    async def prune(self) -> PruneReport:
        async with self._lock:
            cutoff = self._clock() - self._retention_seconds
            run_dirs = await self._prune_run_dirs(cutoff)
            ipc_errors = await asyncio.to_thread(_prune_ipc_errors, errors_dir(self._paths.ipc_root), cutoff)
            sessions = await self._prune_sessions(cutoff)
            files = await self._files.prune(cutoff)
            seen = await asyncio.to_thread(_prune_seen, self._paths.files_seen_dir, cutoff)
            report = PruneReport(
                run_dirs=run_dirs.removed,
                ipc_error_files=ipc_errors.removed,
                session_files=sessions.removed,
                run_texts=await self._prune_run_texts(cutoff),
                ipc_messages=await self._delete_rows("ipc_messages", "received_at < ?", (cutoff,)),
                # A failed row records no time of failure: it failed at or after its last scheduled attempt.
                outbox_rows=await self._delete_rows(
                    "outbox",
                    "(status = 'sent' AND sent_at < ?) OR (status = 'failed' AND next_attempt_at < ?)",
                    (cutoff, cutoff),
                ),
                streamed_answers=await self._delete_rows("streamed_answers", "settled_at < ?", (cutoff,)),
                notes=await NoteStore(self._db).prune_off(cutoff),
                mcp_calls=await self._delete_rows("mcp_calls", "at < ?", (cutoff,)),
                files_in=files.files_in,
                files_out=files.files_out,
                out_folders=files.out_folders,
                images_seen=seen.removed,
                transcripts=await self._prune_transcripts(cutoff),
                failures=run_dirs.failures + ipc_errors.failures + sessions.failures + files.failures + seen.failures,
            )
        log.info("retention_pruned", **asdict(report))
        return report

    # --- files ---------------------------------------------------------------------------------------

    async def _prune_run_dirs(self, cutoff: float) -> Removed:
        """A run's dir goes once the run finished before the cutoff; one without a run row by its age."""
        runs_dir = self._paths.runs_dir
        entries = await asyncio.to_thread(list_entries, runs_dir)
        rows = await self._run_rows(entry.name for entry in entries)
        expired = [entry.name for entry in entries if _run_dir_expired(entry, rows.get(entry.name), cutoff)]
        return await asyncio.to_thread(remove_names, runs_dir, expired)

    async def _run_rows(self, run_ids: Iterable[str]) -> dict[str, tuple[str, float | None]]:
        ids = list(run_ids)
        found: dict[str, tuple[str, float | None]] = {}
        for start in range(0, len(ids), LOOKUP_BATCH_IDS):
            chunk = ids[start : start + LOOKUP_BATCH_IDS]
            marks = ", ".join("?" for _ in chunk)
            async with self._db.conn.execute(
                f"SELECT id, status, finished_at FROM subagent_runs WHERE id IN ({marks})", chunk
            ) as cursor:
                for row in await cursor.fetchall():
                    found[str(row[0])] = (str(row[1]), row[2])
        return found

    async def _prune_sessions(self, cutoff: float) -> Removed:
        keep = await self._sessions_in_use()
        return await asyncio.to_thread(_prune_session_files, self._paths.sessions_dir, keep, cutoff)

    async def _sessions_in_use(self) -> set[tuple[str, str]]:
        """(folder, session id) of every chat's current session and of the sessions live runs started from."""
        async with self._db.conn.execute(
            "SELECT c.folder, s.session_id FROM chat_sessions s JOIN chats c ON c.id = s.chat_id "
            "UNION SELECT c.folder, r.session_in FROM subagent_runs r JOIN chats c ON c.id = r.chat_id "
            "WHERE r.status IN (?, ?) AND r.session_in IS NOT NULL",
            (RunStatus.QUEUED, RunStatus.RUNNING),
        ) as cursor:
            return {(str(row[0]), str(row[1])) for row in await cursor.fetchall()}

    # --- database ------------------------------------------------------------------------------------

    async def _prune_run_texts(self, cutoff: float) -> int:
        """Drop task, result and error of runs finished before the cutoff; the rows and their counts stay."""
        finals = sorted(FINAL_STATUSES)
        marks = ", ".join("?" for _ in finals)
        due = (
            f"SELECT rowid FROM subagent_runs WHERE status IN ({marks}) AND finished_at < ? "
            "AND NOT (task = ? AND result IS NULL AND error IS NULL) LIMIT ?"
        )
        total = 0
        while True:
            async with self._db.write() as conn:
                cursor = await conn.execute(
                    f"UPDATE subagent_runs SET task = ?, result = NULL, error = NULL WHERE rowid IN ({due})",
                    (PRUNED_TASK, *finals, cutoff, PRUNED_TASK, PRUNE_BATCH_ROWS),
                )
            total += cursor.rowcount
            if cursor.rowcount < PRUNE_BATCH_ROWS:
                return total

    async def _prune_transcripts(self, cutoff: float) -> int:
        """Transcripts' words go after the period; the row stays (failed, saying so), so they are never redone."""
        total = 0
        while True:
            async with self._db.write() as conn:
                cursor = await conn.execute(
                    "UPDATE transcripts SET state = 'failed', text = '', reason = ?, updated_at = ? WHERE rowid IN "
                    "(SELECT rowid FROM transcripts WHERE updated_at < ? AND (state != 'failed' OR reason != ?) "
                    "LIMIT ?)",
                    (PRUNED_TRANSCRIPT, cutoff, cutoff, PRUNED_TRANSCRIPT, PRUNE_BATCH_ROWS),
                )
            total += cursor.rowcount
            if cursor.rowcount < PRUNE_BATCH_ROWS:
                return total

    async def _delete_rows(self, table: str, where: str, params: tuple[float, ...]) -> int:
        """Delete matching rows in batches. `table` and `where` are this module's constants, never input."""
        total = 0
        while True:
            async with self._db.write() as conn:
                cursor = await conn.execute(
                    f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {where} LIMIT ?)",
                    (*params, PRUNE_BATCH_ROWS),
                )
            total += cursor.rowcount
            if cursor.rowcount < PRUNE_BATCH_ROWS:
                return total


def _run_dir_expired(entry: Entry, row: tuple[str, float | None] | None, cutoff: float) -> bool:
    if row is None:
        return entry.changed_at < cutoff  # no run of that id: left over, kept only while recent
    status, finished_at = row
    if status not in FINAL_STATUSES:
        return False  # queued or running: its container may be using it
    if finished_at is None:
        return entry.changed_at < cutoff
    return finished_at < cutoff


# --- blocking file work (run in a thread) -------------------------------------------------------------


def _prune_ipc_errors(errors: Path, cutoff: float) -> Removed:
    """A quarantined entry and its reason file go together, aged by the reason file: the host wrote it
    when it quarantined the entry, while the entry's own times are whatever the container made them."""
    entries = list_entries(errors)
    reasons = {e.name.removesuffix(REASON_SUFFIX): e for e in entries if e.name.endswith(REASON_SUFFIX)}
    expired: list[str] = []
    for entry in entries:
        if entry.name.endswith(REASON_SUFFIX):
            continue
        reason = reasons.pop(entry.name, None)
        if (reason or entry).changed_at < cutoff:
            expired.append(entry.name)
            if reason is not None:
                expired.append(reason.name)
    expired.extend(reason.name for reason in reasons.values() if reason.changed_at < cutoff)  # entry gone
    return remove_names(errors, expired)


def _prune_seen(seen_dir: Path, cutoff: float) -> Removed:
    """Prepared images (and refusals) no turn used since the cutoff: each use touches their time."""
    expired = [entry.name for entry in list_entries(seen_dir) if not entry.is_dir and entry.changed_at < cutoff]
    return remove_names(seen_dir, expired, older_than=cutoff)


def _prune_session_files(sessions_dir: Path, keep: set[tuple[str, str]], cutoff: float) -> Removed:
    """Old files in each chat's session folder, except the sessions in use; folders stay."""
    removed = failures = 0
    for folder in list_entries(sessions_dir):
        if not folder.is_dir:
            continue
        directory = sessions_dir / folder.name
        expired = [
            entry.name
            for entry in list_entries(directory)
            if not entry.is_dir
            and entry.changed_at < cutoff
            and (folder.name, entry.name.removesuffix(SESSION_SUFFIX)) not in keep
        ]
        done = remove_names(directory, expired)
        removed += done.removed
        failures += done.failures
    return Removed(removed, failures)
