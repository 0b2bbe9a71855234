"""deploy/kubernetes run for real: the manifests applied with `kubectl apply -k` (through kit-overlay, which changes
only what the test kit lacks), the bot's own image in a pod, the Kubernetes calls made with its ServiceAccount's
token under rbac.yaml's Role. A message through the fake Bot API reaches it, its (fake) LLM spawns a subagent, the
run is a Job in the bot's namespace, and its result is in the chat once.

The bot's image (crewbot-host:latest, `make host-image`) and the subagent's (crewbot-agent:latest) must be on the
node: `make test-kubernetes` loads both into the kit.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client

from runner.kube.kube_config import KubeTarget
from tests.fakes.llm_server import FakeLLM, openai_text, openai_tool_call
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID
from tests.runner.kube.conftest import KUBECONFIG_FOR_TESTS, REQUIRED
from tests.runner.kube.polling import until

pytestmark = pytest.mark.kubernetes

T = TypeVar("T")

OVERLAY = Path(__file__).resolve().parent / "kit-overlay"
# Where the test kit builds its kubectl; KUBECTL or one on PATH comes first.
KIT_KUBECTL = Path("/var/cache/crewbot-kube/bin-v1.20.2/kubectl")
APPLY_TIMEOUT_SECONDS = 60.0
READY_WAIT_SECONDS = 180.0  # a guard: the bot's Python imports for a few seconds, the probe runs every 10 s
RESULT_WAIT_SECONDS = 180.0
GONE_WAIT_SECONDS = 120.0  # the bot's stop: within the Deployment's grace of 30 s
LOG_TAIL_LINES = 40
LLM_KEY = "sk-test-in-cluster"
MODEL = "fake-model"
COMMAND = "echo crunched $((6 * 7)) in $(hostname)"
BOT_LABELS = "app.kubernetes.io/name=crewbot"


def kubectl() -> str:
    found = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if found:
        return found
    if KIT_KUBECTL.is_file():
        return str(KIT_KUBECTL)
    reason = "no kubectl (set KUBECTL, or start the test kit, which builds one)"
    if REQUIRED:
        pytest.fail(f"{reason} (CREWBOT_KUBE_TESTS=required: the Kubernetes tests must not skip)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ScriptedLlm:
    """The main agent spawns one subagent for the first message; the subagent runs COMMAND and reports its output.
    Told apart by their tools: only the main agent has spawn_subagent."""

    spawned: int = 0
    calls: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = {tool["function"]["name"] for tool in body.get("tools", [])}
        messages = body["messages"]
        if "spawn_subagent" in tools:
            self.calls.append("main")
            if self.spawned or messages[-1]["role"] == "tool":
                return openai_text("A subagent is on it.")
            self.spawned += 1
            return openai_tool_call("spawn_subagent", {"task": f"run `{COMMAND}`", "label": "crunch"})
        self.calls.append("subagent")
        if messages[-1]["role"] == "tool":
            return openai_text(f"It printed: {messages[-1]['content']}")
        return openai_tool_call("bash", {"command": COMMAND})


@dataclass
class Deployed:
    tg: FakeTelegram
    llm: FakeLLM
    script: ScriptedLlm
    namespace: str
    api: client.ApiClient

    def bot_pods(self) -> list[Any]:
        pods = client.CoreV1Api(self.api).list_namespaced_pod(self.namespace, label_selector=BOT_LABELS)
        return list(pods.items)

    def jobs(self) -> list[Any]:
        return list(client.BatchV1Api(self.api).list_namespaced_job(self.namespace, label_selector="crewbot=1").items)

    def bot_log(self) -> str:
        core = client.CoreV1Api(self.api)
        texts = []
        for pod in self.bot_pods():
            try:
                texts.append(core.read_namespaced_pod_log(pod.metadata.name, self.namespace, tail_lines=LOG_TAIL_LINES))
            except client.ApiException as exc:
                texts.append(f"(no log of {pod.metadata.name}: {exc.reason})")
        return "\n".join(texts)


def bot_settings(tg: FakeTelegram, llm: FakeLLM) -> dict[str, str]:
    """The Secret crewbot-env, as an operator makes it from their .env (bot.yaml's header)."""
    return {
        "TELEGRAM_BOT_TOKEN": tg.token,
        "TELEGRAM_API_BASE_URL": tg.base_url,
        "ALLOWED_CHAT_IDS": str(GROUP_ID),
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": llm.base_url,
        "LLM_API_KEY": LLM_KEY,
        "LLM_MODEL": MODEL,
        "MERGE_WINDOW_SECONDS": "0",
        "STATUS_CARD": "false",  # the chat holds the answer and the result only: counted below
    }


def write_kustomization(folder: Path, namespace: str, metrics_port: int) -> None:
    """The test's own layer over kit-overlay: its namespace, and a metrics port free on the node's network (the
    pod shares it, so a fixed port could be another process's)."""
    base = os.path.relpath(OVERLAY, folder)  # this kustomize takes no absolute base
    (folder / "kustomization.yaml").write_text(
        f"namespace: {namespace}\n"
        f"bases: [{base}]\n"
        "patchesStrategicMerge: [metrics-addr.yaml]\n"
        "patchesJson6902:\n"  # a port is merged by its number: replacing one takes a JSON patch
        "  - target: {group: apps, version: v1, kind: Deployment, name: crewbot}\n"
        "    path: metrics-port.yaml\n"
    )
    (folder / "metrics-addr.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: crewbot}\n"
        "spec: {template: {spec: {containers: [{name: crewbot, env: ["
        f"{{name: METRICS_ADDR, value: '127.0.0.1:{metrics_port}'}}]}}]}}}}}}\n"
    )
    (folder / "metrics-port.yaml").write_text(
        f"- {{op: replace, path: /spec/template/spec/containers/0/ports/0/containerPort, value: {metrics_port}}}\n"
    )


def apply(folder: Path) -> None:
    done = subprocess.run(
        [kubectl(), "--kubeconfig", KUBECONFIG_FOR_TESTS, "apply", "-k", str(folder)],
        capture_output=True,
        text=True,
        timeout=APPLY_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, f"kubectl apply -k failed: {done.stderr}"


async def waited(deployed: Deployed, what: str, check: Callable[[], T | None], timeout_seconds: float) -> T:
    """`until`, failing with what did not happen, the chat and the bot's log."""
    try:
        return await until(check, timeout_seconds=timeout_seconds)
    except TimeoutError:
        chat = [m.plain_text for m in deployed.tg.sent_messages(GROUP_ID)]
        pytest.fail(f"{what} not within {timeout_seconds} s; the chat: {chat}\nthe bot's log:\n{deployed.bot_log()}")


def ready(deployed: Deployed) -> Any:
    for pod in deployed.bot_pods():
        conditions = pod.status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            return pod
    return None


@pytest.fixture
async def deployed(tmp_path: Path, kube_target: KubeTarget) -> AsyncIterator[Deployed]:
    namespace = f"crewbot-deploy-{secrets.token_hex(4)}"
    core = client.CoreV1Api(kube_target.api)
    script = ScriptedLlm()
    async with FakeTelegram() as tg, FakeLLM(api_key=LLM_KEY) as llm:
        llm.openai.handle_with(script)
        deployed = Deployed(tg, llm, script, namespace, kube_target.api)
        await asyncio.to_thread(core.create_namespace, client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        try:
            secret = client.V1Secret(
                metadata=client.V1ObjectMeta(name="crewbot-env"), string_data=bot_settings(tg, llm)
            )
            await asyncio.to_thread(core.create_namespaced_secret, namespace, secret)
            folder = tmp_path / "kustomization"
            folder.mkdir()
            write_kustomization(folder, namespace, free_port())
            started = time.monotonic()
            await asyncio.to_thread(apply, folder)
            await waited(deployed, "the bot's pod Ready", lambda: ready(deployed), READY_WAIT_SECONDS)
            print(f"\napply -k to Ready: {time.monotonic() - started:.1f} s")
            yield deployed
        finally:
            await asyncio.to_thread(core.delete_namespace, namespace, propagation_policy="Foreground")
            # The bot's pod shares the node's network: it is gone (stopped, its port closed) before the fakes go.
            await until(lambda: not deployed.bot_pods() and not deployed.jobs(), timeout_seconds=GONE_WAIT_SECONDS)


async def test_the_deployed_bot_runs_a_subagent_job_and_reports_once(deployed: Deployed) -> None:
    tg, llm = deployed.tg, deployed.llm
    (pod,) = await asyncio.to_thread(deployed.bot_pods)
    # Its Kubernetes credentials are its ServiceAccount's token, and nothing else is there to use.
    assert pod.spec.service_account_name == "crewbot"
    container = pod.spec.containers[0]
    assert not [env.name for env in container.env or [] if env.name == "KUBECONFIG"]
    assert {mount.mount_path for mount in container.volume_mounts} == {
        "/var/lib/crewbot",
        "/tmp",
        "/var/run/secrets/kubernetes.io/serviceaccount",
    }

    sent_at = time.monotonic()
    tg.push_message(GROUP_ID, f"@{tg.bot_username} please crunch the numbers in the background")
    job = await waited(deployed, "a Job", lambda: next(iter(deployed.jobs()), None), RESULT_WAIT_SECONDS)
    job_seen_at = time.monotonic()
    assert job.metadata.namespace == deployed.namespace

    def result() -> Any:
        return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

    message = await waited(deployed, "the result in the chat", result, RESULT_WAIT_SECONDS)
    # The Job's pod's hostname: it ran there (a warm pool member's when SUBAGENT_WARM_POOL is set, else a run's own).
    ran_in = re.search(r"crunched 42 in (crewbot-(?:run|pool)-[0-9a-z-]+)-[0-9a-z]{5}\b", message.plain_text)
    assert ran_in, message.plain_text
    # Its outcome recorded, the bot deletes the Job with its own account (rbac.yaml's `delete`); the pool's idle
    # members stay.
    ran_job = ran_in.group(1)

    def ran_job_deleted() -> bool:
        return all(job.metadata.name != ran_job for job in deployed.jobs())

    await waited(deployed, f"the Job {ran_job} deleted", ran_job_deleted, RESULT_WAIT_SECONDS)
    results = [m for m in tg.sent_messages(GROUP_ID) if "crunched 42" in m.plain_text]
    assert len(results) == 1, [m.plain_text for m in tg.sent_messages(GROUP_ID)]
    assert deployed.script.spawned == 1 and "subagent" in deployed.script.calls
    # Every call reached the provider with its key: the subagent's through the bot's proxy, which adds it.
    assert all(r.headers.get("authorization") == f"Bearer {LLM_KEY}" for r in llm.requests("/v1/chat/completions"))
    print(
        f"message to Job created: {job_seen_at - sent_at:.1f} s; "
        f"message to result in the chat: {message.at - sent_at:.1f} s"
    )
