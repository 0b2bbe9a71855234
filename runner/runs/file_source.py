"""The file source port: how the subagent side gets a posted file's bytes (the chat channel downloads it)."""

from __future__ import annotations

from typing import Protocol


class FileSource(Protocol):
    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        """The file's bytes, at most `max_bytes`; raises core.store.chat_files.FileUnavailable saying why not."""
