"""The container a run gets: its image, labels, limits and exactly two mounts.

The chat's workspace (read-write; the host never reads it) and the run's channel folder (read-only:
the socket the host listens on). Nothing else of the host: no IPC folder (so no spawning from inside),
no run dir, no other chat. A warm pool member (runner/lifecycle/warm_pool.py) is built by the same code with
the same hardening; it belongs to no chat until a run claims it, so its workspace is a scratch folder filled
over the channel at the claim (WORKSPACE_SYNC_ENV), and a run started cold when the pool is on does the same.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from container.contract import POOLED_ENV, WORKSPACE_SYNC_ENV
from container.protocol import CHANNEL_DIR, WORKSPACE_DIR
from core.settings import Settings
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_CHAT_ID,
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_POOL_CONFIG,
    LABEL_RUN_ID,
    ContainerSpec,
    Mount,
    container_name,
    pool_container_name,
)
from runner.storage.paths import container_user

POOL_CONFIG_CHARS = 16  # of the fingerprint's sha256 hex: a label value, compared for equality only


def run_container_spec(
    settings: Settings,
    *,
    run_id: str,
    chat_id: int,
    instance_id: str,
    workspace: Path,
    channel_dir: Path,
    sync_workspace: bool = False,
) -> ContainerSpec:
    """`sync_workspace`: `workspace` is the run's scratch folder (or a chat folder whose files go into the
    chat's archive) and the chat's stored workspace reaches it over the channel, as a pooled run's does."""
    labels = {LABEL_RUN_ID: run_id, LABEL_CHAT_ID: str(chat_id)}
    environment = {WORKSPACE_SYNC_ENV: "1"} if sync_workspace else {}
    return _hardened(settings, container_name(run_id), instance_id, labels, workspace, channel_dir, environment)


def pool_container_spec(
    settings: Settings, *, member_id: str, instance_id: str, channel_dir: Path, workspace: Path, config: str
) -> ContainerSpec:
    """A warm pool member: a run's container in all but its chat, which it has none of until a run claims it.
    `config` is `pool_config(...)` for the settings and image it is made with."""
    labels = {LABEL_POOL: member_id, LABEL_POOL_CONFIG: config}
    environment = {WORKSPACE_SYNC_ENV: "1", POOLED_ENV: "1"}
    return _hardened(settings, pool_container_name(member_id), instance_id, labels, workspace, channel_dir, environment)


def pool_config(settings: Settings, image_id: str) -> str:
    """What a member was made with, as a short fingerprint: a member made otherwise is drained, never claimed.
    `image_id` is the engine's id of SUBAGENT_IMAGE (an image rebuilt under the same tag changes it)."""
    parts = (
        image_id,
        settings.subagent_memory,
        repr(settings.subagent_cpus),
        str(settings.subagent_pids),
        settings.subagent_runtime_class or "",
        settings.subagent_network,
        str(settings.subagent_egress),
        container_user(),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:POOL_CONFIG_CHARS]


def _hardened(
    settings: Settings,
    name: str,
    instance_id: str,
    labels: dict[str, str],
    workspace: Path,
    channel_dir: Path,
    environment: dict[str, str],
) -> ContainerSpec:
    """The one builder of both: a pooled container cannot drift from a run's hardening."""
    return ContainerSpec(
        name=name,
        image=settings.subagent_image,
        command=[],
        labels={LABEL_APP: "1", LABEL_INSTANCE: instance_id, **labels},
        mounts=[
            Mount(workspace.resolve(), WORKSPACE_DIR),
            Mount(channel_dir.resolve(), CHANNEL_DIR, read_only=True),
        ],
        user=container_user(),
        network=settings.subagent_network,
        memory=settings.subagent_memory,
        cpus=settings.subagent_cpus,
        pids=settings.subagent_pids,
        environment=environment,
        workdir=WORKSPACE_DIR,
        runtime_class=settings.subagent_runtime_class,
    )
