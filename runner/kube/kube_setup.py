"""The Kubernetes backend assembled from settings: the cluster (kube_config), its calls, the Job options read
live at each start, and each run's bridge (an exec of `python -m container.bridge` in its pod)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from container.contract import BRIDGE_MODULE, BRIDGE_TARGET_EGRESS
from core.egress_rules import EgressMode
from core.settings import Settings
from runner.kube.exec_stream import ExecStream, open_exec
from runner.kube.job_bridges import BridgeFactory, StillRunning
from runner.kube.job_spec import JobOptions
from runner.kube.kube_calls import CONTAINER_NAME, KubeCalls
from runner.kube.kube_config import KubeTarget, load_target
from runner.kube.kube_runtime import KubeRuntime
from runner.kube.pod_bridge import PodBridge

# The image's interpreter, as its ENTRYPOINT runs the agent (runner/runtimes/subagent.Dockerfile): -P keeps the
# workspace off sys.path.
BRIDGE_PYTHON = ("/opt/venv/bin/python", "-P", "-m", BRIDGE_MODULE)


def job_options(settings: Settings, namespace: str) -> Callable[[], JobOptions]:
    def options() -> JobOptions:
        return JobOptions(
            namespace=namespace,
            pull_policy=settings.kube_image_pull_policy,
            ttl_seconds=settings.kube_job_ttl_seconds,
            deadline_seconds=settings.subagent_timeout_seconds,
            workspace_quota_mb=settings.workspace_quota_mb,
        )

    return options


def bridge_factory(target: KubeTarget, settings: Settings) -> BridgeFactory:
    configuration = target.api.configuration

    def bridge(
        job: str, pod: str, sockets: dict[str, Path | None], still_running: StillRunning, pooled: bool
    ) -> PodBridge:
        # A pool member's runs will have the door when egress is on (a member made before a change of
        # SUBAGENT_EGRESS is drained, never claimed); its run's host socket is asked at the claim.
        door = sockets.get(BRIDGE_TARGET_EGRESS) is not None or (
            pooled and settings.subagent_egress is not EgressMode.NONE
        )
        command = [*BRIDGE_PYTHON, *(["--egress"] if door else [])]

        async def opener() -> ExecStream:
            return await open_exec(configuration, target.namespace, pod, command, container=CONTAINER_NAME)

        return PodBridge(job, opener, sockets, still_running=still_running)

    return bridge


def kube_runtime(
    settings: Settings, channel_dir: Callable[[str], Path], *, max_concurrency: int, target: KubeTarget | None = None
) -> KubeRuntime:
    """Blocking when `target` is None (loads the configuration): at start-up, before the loop serves chats.
    Raises runner.kube.kube_errors.KubeConfigError with the line to show."""
    target = target or load_target(settings)
    return KubeRuntime(
        KubeCalls(target.api, target.namespace, on_close=target.close),
        max_concurrency=max_concurrency,
        options=job_options(settings, target.namespace),
        bridges=bridge_factory(target, settings),
        channel_dir=channel_dir,
        server=target.server,
    )
