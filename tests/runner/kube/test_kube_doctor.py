"""`crewbot doctor` on the Kubernetes backend against a real cluster: the cluster, the account's permissions and
a test Job of the subagent image (under gVisor when SUBAGENT_RUNTIME_CLASS says so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import Settings, load_settings
from crewbot.doctor import run_doctor
from runner.kube.kube_config import KubeTarget
from tests.runner.kube.conftest import KUBECONFIG_FOR_TESTS

pytestmark = pytest.mark.kubernetes


def doctor_settings(tmp_path: Path, target: KubeTarget, runtime_class: str) -> Settings:
    return load_settings(
        DATA_DIR=str(tmp_path / "data"),
        SUBAGENT_RUNTIME="kubernetes",
        KUBECONFIG=KUBECONFIG_FOR_TESTS,
        KUBE_NAMESPACE=target.namespace,
        KUBE_IMAGE_PULL_POLICY="Never",  # the kit pulls nothing: `make test-kubernetes` loads the image
        SUBAGENT_RUNTIME_CLASS=runtime_class,
    )


@pytest.mark.parametrize("runtime_class", [None, "gvisor"])
async def test_doctor_checks_the_cluster_the_role_and_a_job(
    tmp_path: Path, kube_target: KubeTarget, runtime_class: str | None
) -> None:
    lines: list[str] = []
    await run_doctor(doctor_settings(tmp_path, kube_target, runtime_class or ""), out=lines.append)
    by_name = {line.split()[1]: line for line in lines}
    assert by_name["kube"].startswith("ok") and kube_target.namespace in by_name["kube"]
    assert by_name["rbac"].startswith("ok")
    assert by_name["container"].startswith("ok")
    assert ("under runtimeClassName gvisor" in by_name["container"]) == (runtime_class is not None)
    assert by_name["network"].startswith("ok")  # the kit's pods have no network at all


async def test_doctor_names_a_runtime_class_the_cluster_does_not_have(tmp_path: Path, kube_target: KubeTarget) -> None:
    lines: list[str] = []
    assert await run_doctor(doctor_settings(tmp_path, kube_target, "no-such-class"), out=lines.append) == 1
    (container,) = [line for line in lines if line.split()[1] == "container"]
    assert container.startswith("FAIL") and "no-such-class" in container
