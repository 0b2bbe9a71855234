"""The container a run gets: its image, labels, limits and exactly two mounts.

The chat's workspace (read-write; the host never reads it) and the run's channel folder (read-only:
the socket the host listens on). Nothing else of the host: no IPC folder (so no spawning from inside),
no run dir, no other chat.
"""

from __future__ import annotations

from pathlib import Path

from container.protocol import CHANNEL_DIR, WORKSPACE_DIR
from core.settings import Settings
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_CHAT_ID,
    LABEL_INSTANCE,
    LABEL_RUN_ID,
    ContainerSpec,
    Mount,
    container_name,
)
from runner.storage.paths import container_user


def run_container_spec(
    settings: Settings, *, run_id: str, chat_id: int, instance_id: str, workspace: Path, channel_dir: Path
) -> ContainerSpec:
    return ContainerSpec(
        name=container_name(run_id),
        image=settings.subagent_image,
        command=[],
        labels={
            LABEL_APP: "1",
            LABEL_INSTANCE: instance_id,
            LABEL_RUN_ID: run_id,
            LABEL_CHAT_ID: str(chat_id),
        },
        mounts=[
            Mount(workspace.resolve(), WORKSPACE_DIR),
            Mount(channel_dir.resolve(), CHANNEL_DIR, read_only=True),
        ],
        user=container_user(),
        network=settings.subagent_network,
        memory=settings.subagent_memory,
        cpus=settings.subagent_cpus,
        pids=settings.subagent_pids,
        workdir=WORKSPACE_DIR,
        runtime_class=settings.subagent_runtime_class,
    )
