"""Every subagent's task carries the chat's notes (never members' notes, which are for the main agent only while
their member takes part) and how to propose a new one: `[remember] …` lines in its result, which the main agent
reads in its next prompt and keeps or not. A subagent has no way to write a note itself."""

from __future__ import annotations

from collections.abc import Sequence

from bot.agent.memory import Memory
from bot.ports.spawner import Spawner
from container.contract import MAX_TASK_CHARS


class NotesInTaskSpawner:
    """A `Spawner` that adds the chat's notes after the task (the main agent's and scheduled tasks' spawns)."""

    def __init__(self, inner: Spawner, memory: Memory) -> None:
        self._inner = inner
        self._memory = memory

    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        room = MAX_TASK_CHARS - len(task) - 2  # the task itself is never cut for the notes
        notes = await self._memory.subagent_notes(chat_id, room) if room > 0 else ""
        full = f"{task}\n\n{notes}" if notes else task
        return await self._inner.spawn(chat_id, turn_id, full, label, include_context, files)
