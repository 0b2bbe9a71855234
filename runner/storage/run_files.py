"""A run's files on the host, all in folders no container can reach: its record (task, container log),
its channel folder (the socket, mounted read-only) and the chat's saved sessions."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from container.protocol import MAX_NOTES_CHARS, MAX_TASK_CHARS, TaskSpec, write_bytes_atomic, write_json_atomic
from core.settings import LLMProvider, Settings
from core.store.chats import Chat
from runner.channel.sessions import SessionFiles
from runner.runs.live_runs import LiveRun
from runner.storage.paths import CONTAINER_GID, DataPaths, host_is_root
from runner.storage.run_inputs import BYTES_PER_MB, RunInputs

TASK_RECORD_FILE = "task.json"
LOG_FILE = "container.log"
MAX_LOG_BYTES = 1024 * 1024  # the tail of a container's output kept for post-mortems
RUN_DIR_MODE = 0o700
# Only the container's user (by its group when the host is root) may reach the socket, and never write
# beside it; other local users cannot reach it at all.
CHANNEL_DIR_MODE = 0o750

# (chat id, room in characters) -> the chat's notes as a run is handed them ("" for none): the chat side's memory.
ChatNotes = Callable[[int, int], Awaitable[str]]


class RunFiles:
    def __init__(self, settings: Settings, paths: DataPaths, notes: ChatNotes | None = None) -> None:
        self._settings = settings
        self._paths = paths
        self._sessions = SessionFiles(paths.sessions_dir)
        self._notes = notes

    async def prepare(
        self, live: LiveRun, chat: Chat, task: str, context: list[str], session_in: str | None, inputs: RunInputs
    ) -> TaskSpec:
        """The run's task (with the chat's prior session, if usable, the files it is given and the chat's notes as
        they are now), its record and its folders. The notes are read at each hand-off, never stored with the run:
        its record on disk leaves them out, and its session drops them (runner/channel/session_history.py)."""
        history: list[Any] = []
        if session_in is not None:
            loaded = await asyncio.to_thread(
                self._sessions.load, chat.folder, session_in, self._settings.subagent_session_max_messages
            )
            history = loaded or []
        s = self._settings
        spec = TaskSpec(
            run_id=live.id,
            task=inputs.task_with_transcripts(task, MAX_TASK_CHARS),
            label=live.label,
            context=context,
            notes=await self._notes(chat.id, MAX_NOTES_CHARS) if self._notes is not None else "",
            history=history,
            provider_kind="anthropic" if s.llm_provider is LLMProvider.ANTHROPIC else "openai",
            model=s.effective_subagent_model or "offline-subagent",
            max_messages=s.subagent_max_messages,
            files=inputs.offered,
            file_notes=inputs.notes,
            max_file_bytes=s.subagent_max_file_mb * BYTES_PER_MB,
            max_files_out=s.subagent_max_files,
        )
        await asyncio.to_thread(self._make_folders, live.id, chat, spec)
        return spec

    def _make_folders(self, run_id: str, chat: Chat, spec: TaskSpec) -> None:
        run_dir = self._paths.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True, mode=RUN_DIR_MODE)
        write_json_atomic(run_dir / TASK_RECORD_FILE, spec.model_copy(update={"history": [], "notes": ""}))
        channel = self._paths.channel_dir(run_id)
        channel.mkdir(parents=True, exist_ok=True)
        if host_is_root():
            os.chown(channel, 0, CONTAINER_GID, follow_symlinks=False)
        channel.chmod(CHANNEL_DIR_MODE)  # the run's /workspace is made by its placement (workspace_placement.py)

    async def save_session(self, chat: Chat, run_id: str, cleaned: bytes) -> None:
        await asyncio.to_thread(self._sessions.save, chat.folder, run_id, cleaned)

    async def keep_logs(self, run_id: str, logs: bytes) -> None:
        tail = logs[-MAX_LOG_BYTES:]
        path = self._paths.run_dir(run_id) / LOG_FILE
        await asyncio.to_thread(_write_in_place, path, tail)


def _write_in_place(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
