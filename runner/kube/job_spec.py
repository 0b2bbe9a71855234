"""A run's `ContainerSpec` as a `batch/v1` Job: one pod, never retried, hardened as the Docker flags are.

The Docker flags and their Kubernetes twins: a non-root uid (`runAsUser`, `runAsNonRoot`), read-only root
(`readOnlyRootFilesystem`), no capabilities (`drop: [ALL]`), no privilege escalation, seccomp RuntimeDefault,
memory and CPU limits (requests equal to them: the Guaranteed class, never evicted first), no service-account
token, no service links in the environment. `/tmp` is a memory-backed emptyDir of the tmpfs's size.
Per-pod pids limits are a kubelet setting (`podPidsLimit`), not a pod field: SUBAGENT_PIDS is not applied here.

The spec's two mounts become emptyDirs: the channel folder (the bridge's sockets, container/bridge.py) and the
workspace (filled over the channel from the chat's archive, runner/storage/workspace_archive.py). Nothing of
the host reaches the pod through its spec, and nothing secret is in it: the bridge's exec stream is the run's
identity, as the socket is on Docker.

A warm pool member (LABEL_POOL, runner/lifecycle/container_spec.py) is the same body from the same spec builder:
only its name, labels, a longer deadline (it may wait idle first) and a small CPU request (it holds no node's
cores while idle; its limit is a run's) differ.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from container.contract import CHANNEL_BRIDGED_ENV, CHANNEL_DIR, WORKSPACE_DIR, WORKSPACE_SYNC_ENV
from core.setting_runtime import PullPolicy
from runner.kube.kube_calls import CONTAINER_NAME
from runner.runtimes.runtime import LABEL_POOL, ContainerSpec, ContainerStartError

RUN_UID = 1000  # the image's non-root `agent` user (runner/runtimes/subagent.Dockerfile)
RUN_GID = 1000
LABELS_ANNOTATION = "crewbot/labels"  # every run label as given (label values cannot start with `-`: chat ids)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
MAX_LABEL_VALUE_CHARS = 63
TMP_DIR = "/tmp"
TMP_SIZE = "64Mi"  # as Docker's tmpfs (runner/runtimes/docker_runtime.py)
CHANNEL_SIZE = "1Mi"  # two sockets
# The run's own time limit (the supervisor's) ends it first, with its reason; the Job's deadline is the backstop
# for a bot that is away.
DEADLINE_SLACK_SECONDS = 60
# A warm pool member's Job waits idle for a run before its run's time: the runtime retires a member idle this long
# (runner/kube/kube_runtime.py), so its deadline is this, plus a run's.
POOL_IDLE_LIMIT_SECONDS = 3_600
# An idle member's CPU request: a request is the node's room held for the pod, and an idle agent uses none, so a
# pool of SUBAGENT_CPUS-sized requests would keep runs' pods from being scheduled (2 members at 1 CPU fill a
# 2-core node). Its limit stays the run's, and its memory request the run's (it is never evicted before a run's).
POOL_CPU_REQUEST_MILLICPUS = 100
BYTES_PER_MIB = 1024 * 1024
MEMORY_UNITS = {"b": 1, "k": 1024, "m": BYTES_PER_MIB, "g": 1024 * BYTES_PER_MIB}
MILLICPUS_PER_CPU = 1000
WORKSPACE_HEADROOM_MIB = 64  # the emptyDir's limit over the quota: the archive being unpacked, a file's last write


@dataclass(frozen=True, slots=True)
class JobOptions:
    namespace: str
    pull_policy: PullPolicy
    ttl_seconds: int
    deadline_seconds: float  # SUBAGENT_TIMEOUT_SECONDS at the run's start
    workspace_quota_mb: int


def kube_labels(labels: dict[str, str]) -> dict[str, str]:
    """The labels Kubernetes accepts as they are (recovery selects by app, instance and run id, all hex)."""
    return {
        key: value
        for key, value in labels.items()
        if len(value) <= MAX_LABEL_VALUE_CHARS and LABEL_VALUE.fullmatch(value)
    }


def run_labels(annotations: dict[str, str], labels: dict[str, str]) -> dict[str, str]:
    """A Job's run labels as they were given: from its annotation, else from its labels."""
    try:
        stored = json.loads(annotations.get(LABELS_ANNOTATION, "null"))
    except ValueError:
        stored = None
    if isinstance(stored, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in stored.items()):
        return {**labels, **stored}
    return dict(labels)


def memory_quantity(value: str) -> str:
    """Docker's `512m` as Kubernetes' `512Mi` (both binary units); bytes otherwise."""
    match = re.fullmatch(r"(\d+)([bkmg]?)", value.strip().lower())
    if match is None:
        raise ContainerStartError(f"SUBAGENT_MEMORY {value!r} is not a memory size")
    size = int(match.group(1)) * MEMORY_UNITS[match.group(2) or "b"]
    return f"{size // BYTES_PER_MIB}Mi" if size % BYTES_PER_MIB == 0 else str(size)


def _volumes(spec: ContainerSpec, options: JobOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": TMP_SIZE}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": TMP_DIR}]
    for mount in spec.mounts:
        if mount.target == CHANNEL_DIR:
            volumes.append({"name": "channel", "emptyDir": {"medium": "Memory", "sizeLimit": CHANNEL_SIZE}})
            mounts.append({"name": "channel", "mountPath": CHANNEL_DIR})
        elif mount.target == WORKSPACE_DIR:
            limit = f"{options.workspace_quota_mb + WORKSPACE_HEADROOM_MIB}Mi"
            volumes.append({"name": "workspace", "emptyDir": {"sizeLimit": limit}})
            mounts.append({"name": "workspace", "mountPath": WORKSPACE_DIR})
        else:
            raise ContainerStartError(
                f"a pod shares no folder with the bot: the mount at {mount.target} has no Kubernetes form"
            )
    return volumes, mounts


def job_body(spec: ContainerSpec, options: JobOptions) -> dict[str, Any]:
    if spec.network != "none":
        raise ContainerStartError(
            f"SUBAGENT_NETWORK={spec.network} is Docker's; a pod has no network of its own on Kubernetes "
            "(the web goes through the door: SUBAGENT_EGRESS)"
        )
    # The image's own user, whatever uid the bot runs as: a pod shares no folder with the bot, so nothing asks for
    # the host's uid, and a run never shares one (nor its process limits) with the bot on a node.
    uid, gid = RUN_UID, RUN_GID
    volumes, mounts = _volumes(spec, options)
    labels = kube_labels(spec.labels)
    memory = memory_quantity(spec.memory)
    millicpus = max(round(spec.cpus * MILLICPUS_PER_CPU), 1)
    cpu = f"{millicpus}m"
    cpu_request = f"{min(millicpus, POOL_CPU_REQUEST_MILLICPUS)}m" if LABEL_POOL in spec.labels else cpu
    environment = {"HOME": TMP_DIR, CHANNEL_BRIDGED_ENV: "1", WORKSPACE_SYNC_ENV: "1", **spec.environment}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": options.pull_policy.value,
        "env": [{"name": name, "value": value} for name, value in environment.items()],
        "workingDir": spec.workdir,
        "volumeMounts": mounts,
        "resources": {"limits": {"memory": memory, "cpu": cpu}, "requests": {"memory": memory, "cpu": cpu_request}},
        "securityContext": {
            "runAsUser": uid,
            "runAsGroup": gid,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        },
        # The bridge is started by exec once the pod runs; stdin is not needed by the agent itself.
        "stdin": False,
        "tty": False,
    }
    if spec.entrypoint is not None:
        container["command"] = spec.entrypoint
    if spec.command:
        container["args"] = spec.command
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsUser": uid,
            "runAsGroup": gid,
            "runAsNonRoot": True,
            "fsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
        "volumes": volumes,
    }
    if spec.runtime_class is not None:
        pod_spec["runtimeClassName"] = spec.runtime_class
    deadline_seconds = int(options.deadline_seconds) + DEADLINE_SLACK_SECONDS
    if LABEL_POOL in spec.labels:
        deadline_seconds += POOL_IDLE_LIMIT_SECONDS
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": spec.name,
            "namespace": options.namespace,
            "labels": labels,
            "annotations": {LABELS_ANNOTATION: json.dumps(spec.labels, sort_keys=True)},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": options.ttl_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
