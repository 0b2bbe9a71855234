"""The spawner port: how the chat side (the main agent and scheduled tasks) starts a subagent run, and the
one refusal it can get back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Spawner(Protocol):
    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        """Write a spawn request; return its run id at once (never wait for the container). `files` names
        chat files (`f3`) the run is given; the run checks they are the chat's when it starts."""


class SpawnRefused(Exception):
    """The caps are full: the message says so and what to do, for the model to pass on."""


class AllowanceRefused(SpawnRefused):
    """The chat's or the bot's daily LLM allowance is used up: the message says whose and when it resets.
    Unlike a full cap it does not pass in seconds, so a scheduled due time is skipped, not kept waiting."""
