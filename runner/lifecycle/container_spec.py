"""The container a run gets: its image, labels, limits and exactly two mounts.

The chat's workspace (read-write; the host never reads it) and the run's channel folder (read-only:
the socket the host listens on). Nothing else of the host: no IPC folder (so no spawning from inside),
no run dir, no other chat. A warm pool member (runner/lifecycle/warm_pool.py) is built by the same code with
the same hardening; it belongs to no chat until a run claims it, so its workspace is a scratch folder filled
over the channel at the claim (WORKSPACE_SYNC_ENV), as is a cold run of a chat whose rule says synced
(runner/storage/workspace_placement.py).
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
    """`sync_workspace`: `workspace` is the run's scratch folder and the chat's stored workspace reaches it over
    the channel, as a pooled run's does; else `workspace` is the chat's folder, mounted."""
    labels = {LABEL_RUN_ID: run_id, LABEL_CHAT_ID: str(chat_id)}
    environment = {WORKSPACE_SYNC_ENV: "1"} if sync_workspace else {}
    return _hardened(settings, container_name(run_id), instance_id, labels, workspace, channel_dir, environment)


def pool_container_spec(
    settings: Settings, *, member_id: str, instance_id: str, channel_dir: Path, workspace: Path, image_id: str
) -> ContainerSpec:
    """A warm pool member: a run's container in all but its chat, which it has none of until a run claims it.
    Its LABEL_POOL_CONFIG is the fingerprint of this very spec (`image_id`: the engine's id of its image), so a
    setting changed while it was built can never hide behind a fingerprint taken before."""
    labels = {LABEL_POOL: member_id}
    environment = {WORKSPACE_SYNC_ENV: "1", POOLED_ENV: "1"}
    spec = _hardened(settings, pool_container_name(member_id), instance_id, labels, workspace, channel_dir, environment)
    spec.labels[LABEL_POOL_CONFIG] = _fingerprint(spec, image_id, str(settings.subagent_egress))
    return spec


def pool_config(settings: Settings, image_id: str) -> str:
    """What a member made now would be, as a short fingerprint: a member made otherwise is drained, never
    claimed. `image_id` is the engine's id of SUBAGENT_IMAGE (an image rebuilt under the same tag changes it).
    A member is created by the tag after its id was read: a rebuild in between gives it a newer image than its
    fingerprint names, which drains it at the next look; never an older one handed out."""
    template = _hardened(settings, "", "", {}, Path("/"), Path("/"), {})
    return _fingerprint(template, image_id, str(settings.subagent_egress))


def _fingerprint(spec: ContainerSpec, image_id: str, egress: str) -> str:
    """Every create option of the spec but what differs between members (name, labels, mount sources)."""
    parts = (
        image_id,
        spec.image,
        repr(spec.command),
        spec.user,
        spec.network,
        spec.memory,
        repr(spec.cpus),
        str(spec.pids),
        spec.workdir,
        repr(spec.entrypoint),
        spec.runtime_class or "",
        repr([(m.target, m.read_only) for m in spec.mounts]),
        egress,  # the door's mode reaches the agent in its task, not the spec: a member is made for one
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
