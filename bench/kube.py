"""The Kubernetes backend (SUBAGENT_RUNTIME=kubernetes) against the bare cluster and against Docker.

Needs KUBECONFIG (the kit in ../shared/kube, or any cluster whose node is this machine, for the cgroup figures);
without it, or when the cluster does not answer, the benchmark notes why and reports no rows. Everything runs in
a namespace made for the run and deleted at its end with all that is in it. One thing at a time, interleaved:
- engine: a minimal busybox Job through the official client (the baseline) against crewbot's `KubeRuntime` with
  the same image (its hardened spec, no bridge): create → the pod Running (seen by a watch of the namespace's
  pods, stamped on arrival), and delete → the pod gone from the API and its container's cgroup gone here;
- a real subagent (the full app, `$ true`): the request file renamed into tasks/ → the run's first LLM request
  at its proxy, on Kubernetes against the same on Docker (bench/spawn.py's definition); under RuntimeClass
  gvisor against runc when the cluster has it;
- cancel (bench/cancel.py's merge): the merging message → the pod gone and its cgroup gone, against Docker's
  `destroy` and `die` events for the same run.
The engine helpers are in bench/kube_cluster.py, the app harness in bench/kube_apps.py.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from pydantic_ai.models.function import FunctionModel

from bench.cancel import HoldingModel
from bench.common import BenchContext, ms
from bench.engine import EngineEvents
from bench.kube_apps import DOCKER, GVISOR, KUBE, KUBE_GVISOR, RUN_TIMEOUT_SECONDS, Subagents, subagents
from bench.kube_cluster import (
    EngineSample,
    bare_sample,
    bench_cluster,
    bench_runtime,
    cgroup_gone,
    container_cgroup,
    has_runtime_class,
    leftover_cgroups,
    runtime_sample,
)
from bench.kube_watch import PodEvents
from bench.report import Measure, Row
from bot.agent.offline import BACKGROUND_PHRASE
from container.protocol import SpawnRequest
from runner.ipc.requests import write_spawn_request
from runner.runtimes.runtime import POOL_NAME_PREFIX, container_name

if TYPE_CHECKING:
    from kubernetes import client

NAME = "kube"
WARMUP = 1
SETTLE_SECONDS = 0.5  # after the first LLM request, until the bash tool is inside `sleep 300`
POOLED = "kubernetes, pooled"  # the cancel of a warm pool hit
POOL_SIZE = 2  # as bench/kube_pool.py
TAGS = {KUBE: "k8s", DOCKER: "dkr", KUBE_GVISOR: "gvr"}  # in run ids (and so in Job names: lowercase, short)


async def _engine(
    ctx: BenchContext, api: client.ApiClient, namespace: str, events: PodEvents, count: int
) -> dict[str, list[EngineSample]]:
    """A bare Job, then crewbot's KubeRuntime with the same image, one pod at a time."""
    samples: dict[str, list[EngineSample]] = {"bare": [], "crewbot": []}
    runtime = bench_runtime(api, namespace)
    try:
        for i in range(WARMUP + count):
            bare = await bare_sample(api, namespace, events)
            crewbot = await runtime_sample(runtime, events, ctx.chat_id(20))
            if i >= WARMUP:
                samples["bare"].append(bare)
                samples["crewbot"].append(crewbot)
    finally:
        await runtime.close()
    return samples


# Where a Kubernetes run's start goes: each stage from the stamp before it (ms after the request file's rename).
STAGES = (
    ("called", "", "request file → KubeRuntime.start called (run recorded, its channel ready)"),
    ("returned", "called", "→ start returned (the Job created)"),
    ("running", "returned", "→ the pod Running (the pods' watch)"),
    ("first", "running", "→ the first LLM request at the proxy (the bridge, Python, imports)"),
)
Stamps = dict[str, float]


async def _first_calls(
    ctx: BenchContext, namespace: str, events: PodEvents, backends: tuple[str, ...], count: int
) -> dict[str, list[Stamps]]:
    """Request file renamed → the run's first LLM request (`first`), a real subagent (`$ true`) on each backend in
    turn; on Kubernetes also the stamps of STAGES."""
    samples: dict[str, list[Stamps]] = {backend: [] for backend in backends}
    async with AsyncExitStack() as stack:
        apps = {backend: await subagents(stack, ctx, i, backend, namespace) for i, backend in enumerate(backends)}
        await asyncio.sleep(0.5)  # the watchers restart for the new folders; let them settle
        batch = secrets.token_hex(3)
        for i in range(WARMUP + count):
            for backend, sub in apps.items():
                run_id = f"{TAGS[backend]}-{batch}-{i:03d}"
                request = SpawnRequest(request_id=run_id, task="$ true", label="kube")
                write_spawn_request(sub.service.paths.ipc_root, sub.folder, request)
                t0 = time.perf_counter()  # the rename is write_spawn_request's last step
                stamps = {"first": await sub.probe.wait(run_id, RUN_TIMEOUT_SECONDS)}
                if sub.starts is not None:
                    job = container_name(run_id)
                    stamps |= {"called": sub.starts.called[job], "returned": sub.starts.returned[job]}
                    stamps["running"] = (await events.running(job)).at
                status = await sub.wait_done(run_id)
                if status != "completed":
                    ctx.note(f"run {run_id} ({backend}) ended {status}")
                if i >= WARMUP:
                    samples[backend].append({key: ms(at - t0) for key, at in stamps.items()})
    return samples


async def _held_run(sub: Subagents, model: HoldingModel) -> tuple[str, str]:
    """A subagent spawned by the holding turn, inside its `sleep 300`; returns its run id and its Job's name (a
    pool member's when the run was a pool hit)."""
    sub.tg.push_message(sub.chat_id, f"@{sub.tg.bot_username} {BACKGROUND_PHRASE} $ sleep 300")
    run_id = await asyncio.wait_for(model.held.get(), RUN_TIMEOUT_SECONDS)
    await sub.probe.wait(run_id, RUN_TIMEOUT_SECONDS)
    record = await sub.service.runs.get(run_id)
    return run_id, (record.container_id if record is not None and record.container_id else container_name(run_id))


async def _merge(sub: Subagents) -> float:
    sub.tg.push_message(sub.chat_id, f"@{sub.tg.bot_username} never mind, stop that")
    return time.perf_counter()


async def _settled(ctx: BenchContext, sub: Subagents, run_id: str) -> None:
    status = await sub.wait_done(run_id)
    if status != "cancelled":
        ctx.note(f"run {run_id} was recorded {status}, not cancelled")
    await asyncio.wait_for(sub.app.wait_quiet(sub.chat_id), RUN_TIMEOUT_SECONDS)


async def _kube_cancel(ctx: BenchContext, sub: Subagents, model: HoldingModel, events: PodEvents) -> dict[str, float]:
    """One merge on Kubernetes: ms from the merging message to the kill asked, the pod gone and its cgroup gone."""
    run_id, job = await _held_run(sub, model)
    running = await events.running(job)
    cgroup = container_cgroup(running)
    if sub.service.pool is not None and not job.startswith(POOL_NAME_PREFIX):
        ctx.note(f"run {run_id} was not a pool hit (Job {job})")
    await asyncio.sleep(SETTLE_SECONDS)
    t0 = await _merge(sub)
    stamps = {"gone": ms((await events.gone(running.name)).at - t0)}
    if cgroup is not None:
        stamps["cgroup"] = ms(await cgroup_gone(cgroup) - t0)
    await _settled(ctx, sub, run_id)
    if sub.kills is not None and job in sub.kills.called:
        stamps["kill_asked"] = ms(sub.kills.called[job] - t0)
    replaced = [e.name for e in events.seen() if e.job == job and e.kind == "ADDED" and e.name != running.name]
    if replaced:
        ctx.note(f"Job {job}'s controller made another pod after the cancel: {', '.join(sorted(set(replaced)))}")
    return stamps


async def _cancels(
    ctx: BenchContext, api: client.ApiClient, namespace: str, events: PodEvents, count: int
) -> dict[str, list[float]]:
    """bench/cancel.py's merge on Kubernetes (pod gone, cgroup gone), the same for a warm pool hit, and on Docker
    (`destroy`, `die`), in turn, each round with a bare pod delete (grace 0) of its own."""
    samples: dict[str, list[float]] = {}
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(EngineEvents())
        models = {KUBE: HoldingModel(), POOLED: HoldingModel(), DOCKER: HoldingModel()}
        kube = await subagents(stack, ctx, 10, KUBE, namespace, FunctionModel(stream_function=models[KUBE]))
        pooled = await subagents(
            stack, ctx, 12, KUBE, namespace, FunctionModel(stream_function=models[POOLED]), warm_pool=POOL_SIZE
        )
        docker = await subagents(stack, ctx, 11, DOCKER, namespace, FunctionModel(stream_function=models[DOCKER]))
        for i in range(WARMUP + count):
            round_samples = {"bare": (await bare_sample(api, namespace, events)).gone}
            round_samples |= {
                f"kube_{key}": value for key, value in (await _kube_cancel(ctx, kube, models[KUBE], events)).items()
            }
            await pooled.wait_pool(POOL_SIZE)
            round_samples |= {
                f"pooled_{key}": value
                for key, value in (await _kube_cancel(ctx, pooled, models[POOLED], events)).items()
            }
            run_id, _ = await _held_run(docker, models[DOCKER])
            container_id, _ = docker.docker_started[container_name(run_id)]
            await asyncio.sleep(SETTLE_SECONDS)
            d0 = await _merge(docker)
            round_samples["die"] = ms(await engine.wait(container_id, "die", RUN_TIMEOUT_SECONDS) - d0)
            round_samples["destroy"] = ms(await engine.wait(container_id, "destroy", RUN_TIMEOUT_SECONDS) - d0)
            await _settled(ctx, docker, run_id)
            if i >= WARMUP:
                for key, value in round_samples.items():
                    samples.setdefault(key, []).append(value)
    return samples


# --- the run and its rows ---------------------------------------------------------------------------------------


async def run(ctx: BenchContext) -> list[Row]:
    async with bench_cluster(ctx) as cluster:
        if cluster is None:
            return []
        gvisor = await asyncio.to_thread(has_runtime_class, cluster.api, GVISOR)
        backends = (KUBE, DOCKER, KUBE_GVISOR) if gvisor else (KUBE, DOCKER)
        counts = {"engine": ctx.scaled(10, 3), "first": ctx.scaled(6, 2), "cancel": ctx.scaled(6, 2)}
        async with PodEvents(cluster.kubeconfig, cluster.namespace) as events:
            engine = await _engine(ctx, cluster.api, cluster.namespace, events, counts["engine"])
            first_calls = await _first_calls(ctx, cluster.namespace, events, backends, counts["first"])
            cancels = await _cancels(ctx, cluster.api, cluster.namespace, events, counts["cancel"])
    # After the namespace is gone: every pod the watch saw should have left no cgroup behind.
    leaked = await asyncio.to_thread(leftover_cgroups, events.seen())
    if leaked:
        ctx.note(f"pod cgroups still on the node after the namespace was gone: {', '.join(leaked)}")
    gvisor_note = f"RuntimeClass {GVISOR}" if gvisor else f"no RuntimeClass {GVISOR} on the cluster, not measured"
    ctx.note(
        f"{counts['engine']} engine samples, {counts['first']} subagent runs per backend and {counts['cancel']} "
        f"cancels per backend (after {WARMUP} warm-up), one at a time, interleaved; namespace {cluster.namespace} "
        f"(deleted); gVisor: {gvisor_note}; pod events stamped on arrival by a watch in a process of its own "
        f"(bench/kube_watch.py)"
    )
    return _engine_rows(engine) + _app_rows(first_calls, cancels) + _cancel_rows(cancels)


def _engine_rows(engine: dict[str, list[EngineSample]]) -> list[Row]:
    def of(who: str, key: str) -> Measure | None:
        values = [getattr(sample, key) for sample in engine[who]]
        present = [value for value in values if value is not None]
        return Measure.of(present) if present else None

    rows: list[Row] = []
    for key, metric, baseline_label in (
        ("started", "KubeRuntime.start returned (Job created)", "bare: create Job returned"),
        ("running", "KubeRuntime.start → pod Running (watch)", "bare: create minimal Job → pod Running"),
        ("killed", "KubeRuntime.kill returned", "bare: delete pod (grace 0) returned"),
        ("gone", "KubeRuntime.kill → pod gone from the API", "bare: delete pod (grace 0) → gone from the API"),
        ("cgroup_gone", "KubeRuntime.kill → container's cgroup gone", "bare: delete pod (grace 0) → cgroup gone"),
    ):
        result, baseline = of("crewbot", key), of("bare", key)
        if result is not None and baseline is not None:
            rows.append(Row(NAME, metric, "ms", result, baseline_label, baseline))
    return rows


def _app_rows(stamps: dict[str, list[Stamps]], cancels: dict[str, list[float]]) -> list[Row]:
    first_calls = {backend: [sample["first"] for sample in samples] for backend, samples in stamps.items()}
    rows = [
        Row(
            NAME,
            "request file → a real subagent's first LLM request, on Kubernetes",
            "ms",
            Measure.of(first_calls[KUBE]),
            "the same on Docker",
            Measure.of(first_calls[DOCKER]),
        )
    ]
    if KUBE_GVISOR in first_calls:
        rows.append(
            Row(
                NAME,
                "the same on Kubernetes under RuntimeClass gvisor",
                "ms",
                Measure.of(first_calls[KUBE_GVISOR]),
                "the same on Kubernetes (runc)",
                Measure.of(first_calls[KUBE]),
            )
        )
    for backend in (KUBE, KUBE_GVISOR):
        for key, since, label in STAGES if backend in stamps else ():
            durations = [sample[key] - (sample[since] if since else 0.0) for sample in stamps[backend]]
            rows.append(Row(NAME, f"where the time goes ({backend}): {label}", "ms", Measure.of(durations)))
    rows.append(
        Row(
            NAME,
            "merging message → the run's pod gone from the API",
            "ms",
            Measure.of(cancels["kube_gone"]),
            "Docker: → container removed (`destroy`)",
            Measure.of(cancels["destroy"]),
        )
    )
    if cancels.get("kube_cgroup"):
        rows.append(
            Row(
                NAME,
                "merging message → the run's container's cgroup gone",
                "ms",
                Measure.of(cancels["kube_cgroup"]),
                "Docker: → container stopped (`die`)",
                Measure.of(cancels["die"]),
            )
        )
    return rows


def _cancel_rows(cancels: dict[str, list[float]]) -> list[Row]:
    """The merge's cancel against a bare `delete pod` (grace 0) → gone, one in each round of the merges: what a
    cancel costs beyond the cluster's own deletion. No cgroup row against it: the bare pod's `sleep` ignores the
    SIGTERM and lives the kubelet's 2 s, the agent does not."""
    bare = Measure.of(cancels["bare"])
    baseline = "bare: delete pod (grace 0) → gone from the API, same rounds"
    rows = [
        Row(
            NAME,
            "merging message → the run's pod gone from the API",
            "ms",
            Measure.of(cancels["kube_gone"]),
            baseline,
            bare,
        ),
        Row(
            NAME,
            "merging message → a warm pool hit's pod gone from the API",
            "ms",
            Measure.of(cancels["pooled_gone"]),
            baseline,
            bare,
        ),
    ]
    for key, label in (("kube", "a run's"), ("pooled", "a warm pool hit's")):
        if cancels.get(f"{key}_kill_asked"):
            rows.append(
                Row(
                    NAME,
                    f"where the time goes: merging message → KubeRuntime.kill called ({label} cancel)",
                    "ms",
                    Measure.of(cancels[f"{key}_kill_asked"]),
                )
            )
    return rows
