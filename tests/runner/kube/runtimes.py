"""A `KubeRuntime` on the tests' namespace (conftest.py's `kube_target`), as the runtime-level tests use it: its
own client on the target's configuration, short Job limits, and at the end every run of this app killed and
the runtime closed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from kubernetes import client

from core.setting_runtime import PullPolicy
from runner.kube.job_bridges import BridgeFactory
from runner.kube.job_spec import JobOptions
from runner.kube.kube_calls import KubeCalls
from runner.kube.kube_config import KubeTarget
from runner.kube.kube_runtime import KubeRuntime
from runner.runtimes.runtime import LABEL_APP

TTL_SECONDS = 600
DEADLINE_SECONDS = 120
WORKSPACE_QUOTA_MB = 16


@asynccontextmanager
async def runtime_on(
    target: KubeTarget, *, bridges: BridgeFactory, channel_dir: Callable[[str], Path]
) -> AsyncIterator[KubeRuntime]:
    options = JobOptions(
        namespace=target.namespace,
        pull_policy=PullPolicy.NEVER,
        ttl_seconds=TTL_SECONDS,
        deadline_seconds=DEADLINE_SECONDS,
        workspace_quota_mb=WORKSPACE_QUOTA_MB,
    )
    calls = KubeCalls(client.ApiClient(target.api.configuration), target.namespace)
    kube = KubeRuntime(calls, max_concurrency=4, options=lambda: options, bridges=bridges, channel_dir=channel_dir)
    try:
        yield kube
    finally:
        for info in await kube.list({LABEL_APP: "1"}):
            await kube.kill(info.id)
        await kube.close()
