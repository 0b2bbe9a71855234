"""A run's two releases: its hold on the chat's typing indicator, and its outcome closing its channel."""

from __future__ import annotations

from runner.lifecycle.manager_ports import TypingHolder
from runner.runs.live_runs import LiveRun


class Releases:
    def __init__(self, typing: TypingHolder) -> None:
        self._typing = typing

    def release(self, live: LiveRun) -> None:
        """The run has its outcome: its channel closes to it, and its hold on the chat's typing goes, once."""
        if live.released:
            return
        live.released = True
        self.release_typing(live)

    def release_typing(self, live: LiveRun) -> None:
        """Only its hold on the chat's typing indicator, once: the chat has its result, its container may
        still be exiting."""
        if live.typing_released:
            return
        live.typing_released = True
        if not live.recovering:  # a run on hold from an earlier process never acquired it
            self._typing.release(live.chat_id)
