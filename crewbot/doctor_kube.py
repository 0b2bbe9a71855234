"""`crewbot doctor` with SUBAGENT_RUNTIME=kubernetes: the cluster answers, the bot's account may do what runs
need there (deploy/kubernetes/rbac.yaml), and a test Job of the subagent image runs to its end (under
SUBAGENT_RUNTIME_CLASS when set), which also proves the node can get the image."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from core.settings import Settings
from crewbot.doctor_result import CheckResult, fail
from runner.runtimes.runtime import ContainerRuntime

CLUSTER_CHECK_SECONDS = 20.0
JOB_CHECK_SECONDS = 120.0  # a first pull of the image on a node takes a while
RBAC_FIX = "apply deploy/kubernetes/rbac.yaml in KUBE_NAMESPACE and run the bot as its ServiceAccount"
CLUSTER_FIX = "check KUBECONFIG (or the pod's service account) and that the API server is reachable from here"

# (the runtime, the runtime class or None) → the test container's line, from doctor's own container check.
Probe = Callable[[ContainerRuntime, str | None], Awaitable[CheckResult]]


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


async def check_kubernetes(
    settings: Settings, runtime: ContainerRuntime | None, probe: Probe
) -> list[tuple[str, CheckResult]]:
    from runner.kube.kube_config import KubeConfigError
    from runner.service import build_runtime

    names = ["rbac", "container"]
    try:
        owned: ContainerRuntime = runtime if runtime is not None else await asyncio.to_thread(build_runtime, settings)
    except KubeConfigError as exc:
        return [
            ("kube", fail(exc.cause, exc.fix)),
            *((n, CheckResult("skip", "not checked: no cluster")) for n in names),
        ]
    try:
        return await _checks(settings, owned, probe)
    finally:
        if runtime is None:
            await owned.close()


async def _checks(settings: Settings, runtime: ContainerRuntime, probe: Probe) -> list[tuple[str, CheckResult]]:
    endpoint = getattr(runtime, "endpoint", "the cluster")
    try:
        async with asyncio.timeout(CLUSTER_CHECK_SECONDS):
            await runtime.ping()
    except Exception as exc:
        skipped = CheckResult("skip", "not checked: the cluster did not answer")
        return [("kube", fail(f"{endpoint}: {_reason(exc)}", CLUSTER_FIX)), ("rbac", skipped), ("container", skipped)]
    results = [("kube", CheckResult("ok", f"{endpoint} answers"))]
    missing_of: Callable[[], Awaitable[list[str]]] | None = getattr(runtime, "missing_permissions", None)
    if missing_of is not None:
        try:
            async with asyncio.timeout(CLUSTER_CHECK_SECONDS):
                missing = await missing_of()
        except Exception as exc:
            results.append(("rbac", fail(f"could not review the account's permissions: {_reason(exc)}", RBAC_FIX)))
        else:
            if missing:
                results.append(("rbac", fail(f"the bot's account may not: {', '.join(missing)}", RBAC_FIX)))
            else:
                results.append(
                    ("rbac", CheckResult("ok", "the bot's account may do all that runs need, in its namespace"))
                )
    runtime_class = settings.subagent_runtime_class
    try:
        async with asyncio.timeout(JOB_CHECK_SECONDS):
            line = await probe(runtime, runtime_class)
    except Exception as exc:
        line = fail(
            f"a test Job did not run: {_reason(exc)}",
            f"look at `kubectl -n {getattr(runtime, 'namespace', '?')} get pods`",
        )
    if line.status == "ok" and runtime_class is not None:
        line = CheckResult("ok", f"{line.detail}, in a Job under runtimeClassName {runtime_class}")
    elif line.status == "ok":
        line = CheckResult("ok", f"{line.detail}, in a Job")
    results.append(("container", line))
    return results
