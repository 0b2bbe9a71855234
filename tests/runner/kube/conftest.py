"""A real cluster for the Kubernetes tests: KUBECONFIG as `make test-kubernetes` gives it (the kit in
../shared/kube, or any cluster), a namespace of their own, deleted with everything in it at the end.

Without KUBECONFIG they skip, saying why; with CREWBOT_KUBE_TESTS=required (`.ci/run` when it started the kit)
a missing or broken cluster fails them instead.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runner.test_egress_e2e import site as web_site  # noqa: F401 (a fixture: two web servers on 127.0.0.1)

# Read at import, before the suite-wide fixture that clears every setting's variable (KUBECONFIG is one).
KUBECONFIG_FOR_TESTS = os.environ.get("KUBECONFIG", "")
REQUIRED = os.environ.get("CREWBOT_KUBE_TESTS", "") == "required"
NAMESPACE_READY_SECONDS = 60.0
POLL_SECONDS = 0.2


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (CREWBOT_KUBE_TESTS=required: the Kubernetes tests must not skip)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kube_target() -> Iterator[object]:
    """A `runner.kube.kube_config.KubeTarget` on a fresh namespace of its own."""
    if not KUBECONFIG_FOR_TESTS:
        _unavailable("no KUBECONFIG: `make test-kubernetes` runs these against a cluster (../shared/kube)")
    from kubernetes import client

    from core.settings import load_settings
    from runner.kube.kube_config import load_target

    namespace = f"crewbot-test-{secrets.token_hex(4)}"
    settings = load_settings(
        KUBECONFIG=KUBECONFIG_FOR_TESTS, KUBE_NAMESPACE=namespace, DATA_DIR=str(Path("/nonexistent"))
    )
    target = load_target(settings)
    core = client.CoreV1Api(target.api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except Exception as exc:
        target.close()
        _unavailable(f"the cluster at KUBECONFIG={KUBECONFIG_FOR_TESTS} did not create a namespace: {exc}")
    deadline = time.monotonic() + NAMESPACE_READY_SECONDS
    while True:  # pods are refused until the namespace's default service account exists
        try:
            core.read_namespaced_service_account("default", namespace)
            break
        except client.ApiException:
            if time.monotonic() > deadline:
                pytest.fail(f"namespace {namespace} got no default service account in {NAMESPACE_READY_SECONDS} s")
            time.sleep(POLL_SECONDS)
    try:
        yield target
    finally:
        core.delete_namespace(namespace, grace_period_seconds=0, propagation_policy="Background")
        target.close()
