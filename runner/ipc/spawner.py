"""The main agent's side of spawning: write a request into the chat's IPC folder and return its run id."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from pathlib import Path

from container.protocol import SpawnRequest
from core.store.chats import ChatStore
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request

RUN_ID_BYTES = 6  # 12 hex characters: short enough to type in /cancel, unique enough per deployment


def new_run_id() -> str:
    return secrets.token_hex(RUN_ID_BYTES)


class IpcSpawner:
    """Never waits for a container: the watcher and task manager take it from the folder."""

    def __init__(self, ipc_root: Path, chats: ChatStore) -> None:
        self._ipc_root = ipc_root
        self._chats = chats

    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        chat = await self._chats.get(chat_id)
        if chat is None:
            raise LookupError(f"chat {chat_id} is unknown")
        request = SpawnRequest(
            request_id=new_run_id(),
            task=task,
            label=label,
            include_context=include_context,
            turn_id=turn_id,
            chat_id=chat_id,
            files=list(files),
        )
        # The file is renamed into place whole; a cancel of this turn while it is written is handled by
        # the manager, which checks the turn's status when it picks the request up.
        await asyncio.to_thread(self._write, chat.folder, request)
        return request.request_id

    def _write(self, folder: str, request: SpawnRequest) -> None:
        # The first spawn of a chat creates its folder; no container can reach it, so it stays the host's.
        ensure_chat_dirs(self._ipc_root, folder)
        write_spawn_request(self._ipc_root, folder, request)
