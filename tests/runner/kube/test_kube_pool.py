"""Warm pool members on a real cluster, at the runtime's level: a member is a run's Job in all but its name and
labels, its bridge is up while it idles (the pod's agent has asked for its task on the member's socket, where
the pool listens), a claim points that bridge at the run's channel folder (the member's, renamed), and a member
deleted or never started says so. The whole pool with the bot is in test_kube_pool_runs.py."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes import client

from container.contract import CHANNEL_DIR, CHANNEL_SOCKET_FILE, WORKSPACE_DIR
from core.setting_runtime import PullPolicy
from core.settings import Settings, load_settings
from runner.kube.job_spec import JobOptions, job_body
from runner.kube.kube_calls import KubeCalls
from runner.kube.kube_config import KubeTarget
from runner.kube.kube_runtime import START_FAILED_EXIT_CODE, KubeRuntime
from runner.kube.kube_setup import bridge_factory
from runner.lifecycle.container_spec import pool_container_spec, run_container_spec
from runner.runtimes.runtime import LABEL_POOL, LABEL_POOL_CONFIG, ContainerGone, ContainerSpec
from tests.runner.kube.polling import until_async
from tests.runner.kube.runtimes import runtime_on

AGENT_IMAGE = "crewbot-agent:latest"  # loaded into the kit's node by `make test-kubernetes`
PYTHON = "/opt/venv/bin/python"
RUN_SECONDS = 120.0  # a guard only: a pod starts in about a second here
# The pod's side of an idle member, in small: it connects to its channel as the agent does (the bridge's socket
# appears once the host's exec is up), asks for its task and prints the answer once a run has claimed it, then
# asks again on a new connection (as the agent's model requests do).
ASKING_AGENT = """
import os, socket, time
path = "/crewbot/channel/run.sock"
while not os.path.exists(path):
    time.sleep(0.05)
def ask(what):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"GET /" + what + b" HTTP/1.0\\r\\nHost: run\\r\\n\\r\\n")
    print("asked", what.decode(), flush=True)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    print("answer:", data.decode().splitlines()[-1], flush=True)
ask(b"task")
ask(b"step")
"""


def pool_settings(tmp_path: Path, namespace: str) -> Settings:
    return load_settings(
        KUBE_NAMESPACE=namespace, DATA_DIR=str(tmp_path / "data"), SUBAGENT_IMAGE=AGENT_IMAGE, SUBAGENT_MEMORY="128m"
    )


def member_spec(settings: Settings, channel_dir: Path, *, script: str | None = ASKING_AGENT) -> ContainerSpec:
    spec = pool_container_spec(
        settings,
        member_id=secrets.token_hex(6),
        instance_id="test",
        channel_dir=channel_dir,
        workspace=channel_dir.parent / "scratch",
        image_id="sha256:0123456789abcdef",
    )
    return spec if script is None else replace(spec, entrypoint=[PYTHON, "-c", script])


@pytest.fixture
async def runtime(kube_target: KubeTarget, tmp_path: Path) -> AsyncIterator[KubeRuntime]:
    bridges = bridge_factory(kube_target, pool_settings(tmp_path, kube_target.namespace))
    async with runtime_on(
        kube_target, bridges=bridges, channel_dir=lambda run_id: tmp_path / "channels" / run_id
    ) as kube:
        yield kube


async def has_logged(runtime: KubeRuntime, job: str, text: bytes) -> bool:
    return text in await runtime.logs(job)


def test_a_members_job_is_a_runs_job_but_for_its_name_labels_and_idle_deadline(tmp_path: Path) -> None:
    settings = load_settings(KUBE_NAMESPACE="pool", DATA_DIR=str(tmp_path), SUBAGENT_RUNTIME_CLASS="gvisor")
    options = JobOptions("pool", PullPolicy.NEVER, 600, 300, 16)
    run = job_body(
        run_container_spec(
            settings,
            run_id="abcdef123456",
            chat_id=-100123,
            instance_id="test",
            workspace=tmp_path / "ws",
            channel_dir=tmp_path / "run",
        ),
        options,
    )
    member = job_body(member_spec(settings, tmp_path / ".pool.x", script=None), options)
    run_pod, member_pod = run["spec"]["template"]["spec"], member["spec"]["template"]["spec"]
    (run_agent,), (member_agent,) = run_pod.pop("containers"), member_pod.pop("containers")
    assert run_pod == member_pod  # user, seccomp, runtime class, no token, volumes (emptyDirs): all the same
    assert member_pod["runtimeClassName"] == "gvisor" and member_pod["automountServiceAccountToken"] is False
    run_env, member_env = run_agent.pop("env"), member_agent.pop("env")
    run_resources, member_resources = run_agent.pop("resources"), member_agent.pop("resources")
    assert run_agent == member_agent  # image, securityContext, mounts
    assert member_resources["limits"] == run_resources["limits"] == {"memory": "512Mi", "cpu": "1000m"}
    assert member_resources["requests"] == {"memory": "512Mi", "cpu": "100m"}  # an idle member holds no cores
    assert {"name": "CREWBOT_POOLED", "value": "1"} in member_env and {e["name"] for e in run_env} < {
        e["name"] for e in member_env
    }
    assert member["metadata"]["name"].startswith("crewbot-pool-")
    labels = member["metadata"]["labels"]
    assert LABEL_POOL in labels and LABEL_POOL_CONFIG in labels and "crewbot.run_id" not in labels
    assert member["spec"]["activeDeadlineSeconds"] > run["spec"]["activeDeadlineSeconds"]  # it may idle first
    assert [m["mountPath"] for m in member_agent["volumeMounts"]] == ["/tmp", WORKSPACE_DIR, CHANNEL_DIR]


@pytest.mark.kubernetes
async def test_a_members_bridge_is_up_while_it_idles_and_its_claim_points_it_at_the_runs_folder(
    runtime: KubeRuntime, kube_target: KubeTarget, tmp_path: Path
) -> None:
    channels = tmp_path / "channels"
    member_dir, run_dir = channels / ".pool.member", channels / "run-abcdef"
    member_dir.mkdir(parents=True)
    claimed = asyncio.Event()
    asked: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        asked.append(request.path)
        await claimed.wait()  # as the pool: the member's socket answers nothing until a run has claimed it
        return web.Response(text=f"{request.path} of run-abcdef")

    app = web.Application()
    app.router.add_get("/{what}", answer)
    host = web.AppRunner(app)
    await host.setup()
    await web.UnixSite(host, os.fspath(member_dir / CHANNEL_SOCKET_FILE)).start()  # before the member starts
    try:
        job = await runtime.start(member_spec(pool_settings(tmp_path, runtime.namespace), member_dir))
        async with asyncio.timeout(RUN_SECONDS):
            await until_async(lambda: asyncio.sleep(0, asked == ["/task"]))  # up and asking before any claim
        os.rename(member_dir, run_dir)  # as the pool does at a claim
        await runtime.claim(job, run_dir)
        claimed.set()
        async with asyncio.timeout(RUN_SECONDS):
            assert await runtime.wait(job) == 0
        logs = await runtime.logs(job)
        assert b"answer: /task of run-abcdef" in logs  # the request made while idle, answered once claimed
        assert b"answer: /step of run-abcdef" in logs  # a new connection, to the renamed folder's socket
        assert asked == ["/task", "/step"]
        calls = KubeCalls(client.ApiClient(kube_target.api.configuration), runtime.namespace)
        (pod,), _ = await asyncio.to_thread(calls.job_pods, job)
        assert pod.image == AGENT_IMAGE and pod.image_id and "sha256:" in pod.image_id  # what image_id() learns
        await runtime.remove(job)
    finally:
        await host.cleanup()


@pytest.mark.kubernetes
async def test_a_member_deleted_while_idle_is_gone_and_cannot_be_claimed_from_the_runtime(
    runtime: KubeRuntime, kube_target: KubeTarget, tmp_path: Path
) -> None:
    member_dir = tmp_path / "channels" / ".pool.member"
    member_dir.mkdir(parents=True)
    listening = socket.socket(socket.AF_UNIX)  # as the pool's: the idle agent's request waits in its backlog
    listening.bind(os.fspath(member_dir / CHANNEL_SOCKET_FILE))
    listening.listen()
    job = await runtime.start(member_spec(pool_settings(tmp_path, runtime.namespace), member_dir))
    async with asyncio.timeout(RUN_SECONDS):
        await until_async(lambda: has_logged(runtime, job, b"asked task"))
        batch = client.BatchV1Api(kube_target.api)
        await asyncio.to_thread(
            batch.delete_namespaced_job, job, kube_target.namespace, propagation_policy="Background"
        )
        with pytest.raises(ContainerGone):
            await runtime.wait(job)  # the pool's waiter learns it is dead
    listening.close()


@pytest.mark.kubernetes
async def test_a_member_whose_pod_never_runs_ends_with_the_kubelets_reason(
    runtime: KubeRuntime, tmp_path: Path
) -> None:
    member_dir = tmp_path / "channels" / ".pool.member"
    member_dir.mkdir(parents=True)
    spec = replace(member_spec(pool_settings(tmp_path, runtime.namespace), member_dir), image="crewbot.local/gone:1")
    job = await runtime.start(spec)
    async with asyncio.timeout(RUN_SECONDS):
        assert await runtime.wait(job) == START_FAILED_EXIT_CODE
    assert b"ErrImageNeverPull" in await runtime.logs(job)
