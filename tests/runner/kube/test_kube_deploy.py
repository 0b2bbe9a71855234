"""deploy/kubernetes against a real API server: every manifest is accepted (a server-side dry run: the
NetworkPolicy is checked for its syntax, not its enforcement, which the kit does not do), and the bot's Role
is enough for the runtime and its bridge (a Job run and an exec with that account's own token) and no more."""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from core.setting_runtime import PullPolicy
from runner.kube.exec_stream import open_exec
from runner.kube.job_spec import JobOptions
from runner.kube.kube_calls import PERMISSIONS, KubeCalls
from runner.kube.kube_config import KubeTarget
from runner.kube.kube_runtime import KubeRuntime
from runner.runtimes.runtime import LABEL_APP, LABEL_RUN_ID, ContainerSpec, container_name
from tests.fakes.memory_kube import no_bridge
from tests.runner.kube.polling import until, until_async

pytestmark = pytest.mark.kubernetes

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
MANIFESTS = ("rbac.yaml", "networkpolicy.yaml", "bot.yaml")
BUSYBOX = "crewbot.local/busybox:1.35"
HTTP_CONFLICT = 409


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


@pytest.mark.parametrize("name", MANIFESTS)
def test_each_manifest_is_accepted_by_the_api_server(kube_target: KubeTarget, name: str) -> None:
    for doc in documents(name):
        utils.create_from_dict(kube_target.api, doc, namespace=kube_target.namespace, dry_run="All")


@pytest.fixture
async def bot_account(kube_target: KubeTarget) -> AsyncIterator[client.ApiClient]:
    """The ServiceAccount, Role and RoleBinding of rbac.yaml created for real; an ApiClient with its token."""
    for doc in documents("rbac.yaml"):
        try:
            await asyncio.to_thread(utils.create_from_dict, kube_target.api, doc, namespace=kube_target.namespace)
        except utils.FailToCreateError as exc:  # made by an earlier test of this session's namespace
            assert all(error.status == HTTP_CONFLICT for error in exc.api_exceptions)
    core = client.CoreV1Api(kube_target.api)

    def token() -> str | None:  # Kubernetes 1.20 puts a service account's token in a Secret it makes
        account: Any = core.read_namespaced_service_account("crewbot", kube_target.namespace)
        if not account.secrets:
            return None
        secret: Any = core.read_namespaced_secret(account.secrets[0].name, kube_target.namespace)
        return base64.b64decode(secret.data["token"]).decode() if secret.data else None

    configuration = client.Configuration()
    configuration.host = kube_target.api.configuration.host
    configuration.ssl_ca_cert = kube_target.api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": await until(token)}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    api = client.ApiClient(configuration)
    try:
        yield api
    finally:
        await asyncio.to_thread(api.close)


async def test_the_role_is_enough_for_a_run_and_its_bridge(
    kube_target: KubeTarget, bot_account: client.ApiClient
) -> None:
    options = JobOptions(kube_target.namespace, PullPolicy.NEVER, 600, 120, 16)
    runtime = KubeRuntime(
        KubeCalls(bot_account, kube_target.namespace),
        max_concurrency=2,
        options=lambda: options,
        bridges=no_bridge,
        channel_dir=lambda run_id: Path("/none"),
    )
    run_id = secrets.token_hex(6)
    spec = ContainerSpec(
        name=container_name(run_id),
        image=BUSYBOX,
        command=["-c", "echo up; sleep 600"],
        entrypoint=["sh"],
        labels={LABEL_APP: "1", LABEL_RUN_ID: run_id},
        mounts=[],
        user="1000:1000",
        memory="32m",
    )
    try:
        await runtime.ping()
        job = await runtime.start(spec)
        (info,) = await runtime.list({LABEL_RUN_ID: run_id})

        async def logged() -> bool:
            return b"up" in await runtime.logs(job)

        await until_async(logged)
        pods, _ = await asyncio.to_thread(KubeCalls(bot_account, kube_target.namespace).job_pods, job)
        stream = await open_exec(bot_account.configuration, kube_target.namespace, pods[0].name, ["echo", "exec-ok"])
        try:
            assert await stream.reader.readexactly(8) == b"exec-ok\n"
        finally:
            await stream.close()
        assert await runtime.usage(job) is not None
        await runtime.kill(job)
        assert await runtime.wait(job) == 137
        assert info.id == job
    finally:
        await runtime.close()


def test_the_role_grants_nothing_beyond_its_namespaces_runs(
    kube_target: KubeTarget, bot_account: client.ApiClient
) -> None:
    core = client.CoreV1Api(bot_account)
    for call in (
        lambda: core.list_namespaced_secret(kube_target.namespace),
        lambda: core.list_node(),
        lambda: core.list_namespaced_pod("default"),
        lambda: client.AppsV1Api(bot_account).list_namespaced_deployment(kube_target.namespace),
    ):
        with pytest.raises(client.ApiException) as refused:
            call()
        assert refused.value.status == 403


def test_the_role_grants_exactly_what_the_runtime_asks_for() -> None:
    (role,) = [doc for doc in documents("rbac.yaml") if doc["kind"] == "Role"]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {(group, resource, verb) for group, resource, verbs in PERMISSIONS for verb in verbs}
    assert granted == needed
