"""What the bot remembers (MEMORY_*, HISTORY_SEARCH_RESULTS): chat notes, member notes and the history search
(docs/using.md "Memory"). `Settings` takes these fields from `MemorySettings`, and the senses' from
`SenseSettings` below it."""

from __future__ import annotations

from pydantic import Field

from core.setting_senses import SenseSettings


class MemorySettings(SenseSettings):
    memory_max_notes: int = Field(default=50, ge=1, le=500, alias="MEMORY_MAX_NOTES")
    memory_max_member_notes: int = Field(default=20, ge=1, le=200, alias="MEMORY_MAX_MEMBER_NOTES")
    memory_note_chars: int = Field(default=500, ge=20, le=4000, alias="MEMORY_NOTE_CHARS")
    memory_prompt_chars: int = Field(default=6000, ge=500, le=100_000, alias="MEMORY_PROMPT_CHARS")
    history_search_results: int = Field(default=10, ge=1, le=50, alias="HISTORY_SEARCH_RESULTS")
