"""`crewbot doctor` with SUBAGENT_RUNTIME=kubernetes: the cluster answers, the bot's account may do what runs
need there (deploy/kubernetes/rbac.yaml), a test Job of the subagent image runs to its end (under
SUBAGENT_RUNTIME_CLASS when set), which also proves the node can get the image, and a run's pod reaches
neither the API server nor the cloud's metadata address (a cluster that does not enforce
deploy/kubernetes/networkpolicy.yaml gives pods the network Docker's `--network none` never did)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from core.settings import Settings
from crewbot.doctor_result import CheckResult, fail, probe_outcome
from runner.runtimes.runtime import ContainerRuntime, ContainerSpec

CLUSTER_CHECK_SECONDS = 20.0
JOB_CHECK_SECONDS = 120.0  # a first pull of the image on a node takes a while
RBAC_FIX = "apply deploy/kubernetes/rbac.yaml in KUBE_NAMESPACE and run the bot as its ServiceAccount"
CLUSTER_FIX = "check KUBECONFIG (or the pod's service account) and that the API server is reachable from here"

# (the runtime, the runtime class or None) → the test container's line, from doctor's own container check.
Probe = Callable[[ContainerRuntime, str | None], Awaitable[CheckResult]]
# (Python code, the runtime class) → a tiny container of the subagent image running it, as doctor makes them.
ProbeSpec = Callable[[str, str | None], ContainerSpec]
NETWORK_PROBE = """
import os, socket
def reach(host, port):
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        return "open"
    except (OSError, ValueError):
        return "shut"
host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
print("api", reach(host, os.environ.get("KUBERNETES_SERVICE_PORT", "443")) if host else "shut")
print("metadata", reach("169.254.169.254", 80))
"""
NETWORK_TARGETS = {"api": "the API server", "metadata": "the metadata address 169.254.169.254"}
NETWORK_FIX = (
    "run pods must have no network: use a network plugin that enforces NetworkPolicy and apply "
    "deploy/kubernetes/networkpolicy.yaml in KUBE_NAMESPACE, or a RuntimeClass whose handler has none "
    "(gVisor with --network=none)"
)


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


async def check_kubernetes(
    settings: Settings, runtime: ContainerRuntime | None, probe: Probe, probe_spec: ProbeSpec
) -> list[tuple[str, CheckResult]]:
    from runner.kube.kube_errors import KubeConfigError
    from runner.service import build_runtime

    names = ["rbac", "container", "network"]
    try:
        owned: ContainerRuntime = runtime if runtime is not None else await asyncio.to_thread(build_runtime, settings)
    except KubeConfigError as exc:
        return [
            ("kube", fail(exc.cause, exc.fix)),
            *((n, CheckResult("skip", "not checked: no cluster")) for n in names),
        ]
    try:
        results = await _checks(settings, owned, probe)
        if results[-1][1].status != "ok":
            return [*results, ("network", CheckResult("skip", "not checked: no test Job ran"))]
        try:
            async with asyncio.timeout(JOB_CHECK_SECONDS):
                network = await _network_check(owned, probe_spec(NETWORK_PROBE, settings.subagent_runtime_class))
        except Exception as exc:
            network = fail(f"the network probe did not run: {_reason(exc)}", NETWORK_FIX)
        return [*results, ("network", network)]
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


async def _network_check(runtime: ContainerRuntime, spec: ContainerSpec) -> CheckResult:
    code, output = await probe_outcome(runtime, await runtime.start(spec), JOB_CHECK_SECONDS)
    reached = [line.split()[0] for line in output.splitlines() if line.endswith(" open")]
    if code != 0 or not any(line.startswith("api ") for line in output.splitlines()):
        return fail(f"the network probe ended with code {code}: {output[-200:]}", NETWORK_FIX)
    if reached:
        what = " and ".join(NETWORK_TARGETS[name] for name in reached if name in NETWORK_TARGETS)
        return fail(f"a run's pod reaches {what}", NETWORK_FIX)
    return CheckResult("ok", "a run's pod reaches neither the API server nor the metadata address")
