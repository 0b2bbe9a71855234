"""The warm pool on Kubernetes (SUBAGENT_WARM_POOL): a subagent's first LLM request with a pool hit, against a
bare Job → pod Running and against today's cold Kubernetes path.

Needs KUBECONFIG as bench/kube.py does (the kit, with the subagent image loaded); without it the benchmark notes
why and reports no rows. In a namespace made for the run and deleted at its end. One thing at a time, interleaved:
- baseline: a minimal busybox Job through the official client, create → its pod Running (bench/kube_cluster.py);
- cold: the full app with SUBAGENT_WARM_POOL=0, a real subagent (`$ true`): the request file renamed into
  tasks/ → the run's first LLM request at its proxy (bench/spawn.py's definition), as bench/kube.py measures it;
- hit: the same app with a pool of POOL_SIZE, each request made once the pool is full again (a hit is checked:
  the run's container is a pool member's Job).
Also each pool member's memory while idle (its pod's cgroup on this node).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from bench.common import BenchContext, ms
from bench.kube_apps import KUBE, RUN_TIMEOUT_SECONDS, Subagents, subagents
from bench.kube_cluster import BenchCluster, bare_sample, bench_cluster
from bench.kube_watch import PodEvents
from bench.report import Measure, Row
from container.protocol import SpawnRequest
from runner.ipc.requests import write_spawn_request
from runner.runtimes.runtime import POOL_NAME_PREFIX

if TYPE_CHECKING:
    pass

NAME = "kube_pool"
WARMUP = 1
POOL_SIZE = 2  # the default; idle members request 0.1 CPU each, so the cold app's run (1 CPU) fits beside them
BYTES_PER_MIB = 1024 * 1024


async def _first_request(ctx: BenchContext, sub: Subagents, run_id: str) -> float:
    """Request file renamed → the run's first LLM request (ms); the run is then waited for to its end."""
    write_spawn_request(sub.service.paths.ipc_root, sub.folder, SpawnRequest(request_id=run_id, task="$ true"))
    t0 = time.perf_counter()  # the rename is write_spawn_request's last step
    first = await sub.probe.wait(run_id, RUN_TIMEOUT_SECONDS)
    status = await sub.wait_done(run_id)
    if status != "completed":
        ctx.note(f"run {run_id} ended {status}")
    return ms(first - t0)


async def _samples(ctx: BenchContext, cluster: BenchCluster, count: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"bare": [], "cold": [], "hit": [], "idle_mib": []}
    api, namespace = cluster.api, cluster.namespace
    async with PodEvents(cluster.kubeconfig, namespace) as events, AsyncExitStack() as stack:
        cold = await subagents(stack, ctx, 0, KUBE, namespace)
        pooled = await subagents(stack, ctx, 1, KUBE, namespace, warm_pool=POOL_SIZE)
        await asyncio.sleep(0.5)  # the watchers restart for the new folders; let them settle (as bench/kube.py)
        batch = secrets.token_hex(3)
        for i in range(WARMUP + count):
            bare = await bare_sample(api, namespace, events)
            cold_ms = await _first_request(ctx, cold, f"kc-{batch}-{i:03d}")
            await pooled.wait_pool(POOL_SIZE)
            idle = await pooled.service.pool.stats() if pooled.service.pool is not None else None
            run_id = f"kp-{batch}-{i:03d}"
            hit_ms = await _first_request(ctx, pooled, run_id)
            record = await pooled.service.runs.get(run_id)
            if record is None or not (record.container_id or "").startswith(POOL_NAME_PREFIX):
                ctx.note(f"run {run_id} was not a pool hit (container {record.container_id if record else None})")
                continue
            if i < WARMUP:
                continue
            samples["bare"].append(bare.running)
            samples["cold"].append(cold_ms)
            samples["hit"].append(hit_ms)
            if idle is not None and idle.idle_memory_bytes is not None and idle.ready:
                samples["idle_mib"].append(idle.idle_memory_bytes / idle.ready / BYTES_PER_MIB)
    return samples


async def run(ctx: BenchContext) -> list[Row]:
    count = ctx.scaled(8, 3)
    async with bench_cluster(ctx) as cluster:
        if cluster is None:
            return []
        samples = await _samples(ctx, cluster, count)
    namespace = cluster.namespace
    ctx.note(
        f"{count} samples of each (after {WARMUP} warm-up), one at a time, interleaved; a pool of {POOL_SIZE}, "
        f"each hit made once the pool was full again; namespace {namespace} (deleted)"
    )
    if not samples["hit"]:
        return []
    hit = Measure.of(samples["hit"])
    rows = [
        Row(
            NAME,
            "request file → a real subagent's first LLM request on Kubernetes, a warm pool hit",
            "ms",
            hit,
            "bare: create minimal Job → pod Running",
            Measure.of(samples["bare"]),
        ),
        Row(
            NAME,
            "the same, a warm pool hit",
            "ms",
            hit,
            "today's cold path (SUBAGENT_WARM_POOL=0)",
            Measure.of(samples["cold"]),
        ),
    ]
    if samples["idle_mib"]:
        rows.append(
            Row(NAME, "an idle pool member's pod: memory (its cgroup's peak)", "MiB", Measure.of(samples["idle_mib"]))
        )
    return rows
