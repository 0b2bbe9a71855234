"""The run API's test endpoint with a workspace desk over a real chat archive, as RunInbox has one for a run
that syncs its workspace (tests/runner/channel/test_workspace_desk.py, tests/container/test_workspace_sync.py)."""

from __future__ import annotations

from dataclasses import dataclass

from runner.channel.run_api import ChannelRefused
from runner.channel.workspace_desk import IDLE_SECONDS, ArchiveStore, WorkspaceDesk
from tests.runner.channel.run_api_server import Recorder

FOLDER = "chat_m100123"
CHAT_ID = -100123  # FOLDER's chat
RUN_ID = "run-aaaaaa"


@dataclass
class SyncedRecorder(Recorder):
    """The recording endpoint, with the workspace endpoints of a synced run; `cancelled` closes them."""

    workspace: WorkspaceDesk | None = None
    cancelled: bool = False

    def check_live(self) -> None:
        if self.cancelled:
            raise ChannelRefused(403, "run run-aaaaaa is cancelled or finished")


def synced(store: ArchiveStore, idle_seconds: float = IDLE_SECONDS) -> SyncedRecorder:
    endpoint = SyncedRecorder()
    endpoint.workspace = WorkspaceDesk(
        store,
        check_live=endpoint.check_live,
        invalid=endpoint.invalid,
        idle_seconds=idle_seconds,
        run_id=RUN_ID,
        chat_id=CHAT_ID,
    )
    return endpoint
