"""A run pod's peak memory and CPU time from its cgroup, when its node is this machine.

The kubelet puts a pod's containers under `kubepods[/<qos>]/pod<uid>/<container id>` (cgroupfs driver) or
`kubepods.slice/.../cri-containerd-<id>.scope` (systemd driver). A pod's uid is a random UUID, so a cgroup of
that name here is that pod: found, the figures are real; not found (another node), they are unknown, never
guessed. The API's metrics (metrics-server) give no peak, so they are not used.
"""

from __future__ import annotations

from runner.runtimes.resource_use import ResourceSample, cgroup_v1_sample, cgroup_v2_sample

QOS_CLASSES = ("", "burstable", "besteffort")  # Guaranteed pods sit right under kubepods
CGROUP_V2_ROOT = "/sys/fs/cgroup"


def _parents(pod_uid: str, container_id: str) -> tuple[str, ...]:
    uid_underscored = pod_uid.replace("-", "_")
    cgroupfs = tuple(f"kubepods/{qos + '/' if qos else ''}pod{pod_uid}/{container_id}" for qos in QOS_CLASSES)
    systemd = tuple(
        "kubepods.slice/"
        + (
            f"kubepods-{qos}.slice/kubepods-{qos}-pod{uid_underscored}.slice"
            if qos
            else f"kubepods-pod{uid_underscored}.slice"
        )
        + f"/cri-containerd-{container_id}.scope"
        for qos in QOS_CLASSES
    )
    return cgroupfs + systemd


def pod_sample(pod_uid: str, runtime_container_id: str, root: str = "") -> ResourceSample | None:
    """`runtime_container_id` as the pod's status gives it (`containerd://<id>`); None when not on this node."""
    _, _, container_id = runtime_container_id.rpartition("://")
    if not container_id.isalnum() or not all(c.isalnum() or c == "-" for c in pod_uid):
        return None  # not a shape the kubelet makes: never a path from it
    parents = _parents(pod_uid, container_id)
    v2_dirs = tuple(f"{CGROUP_V2_ROOT}/{parent}" for parent in parents)
    return cgroup_v2_sample(container_id, root, v2_dirs) or cgroup_v1_sample(container_id, root, parents)
