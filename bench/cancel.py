"""Cancel latency: a merging message until the aborted turn's subagent container is gone.

The full app (fake Telegram, real PTB, task manager, Docker) with MERGE_WINDOW_SECONDS long enough that
the second message always lands inside it. The main model spawns `$ sleep 300` and then holds its turn
open (its call after the spawn tool returned waits on an event that is never set), so the turn has not
begun delivering when the second message arrives, and the merge aborts it and cancels its run.

Start: the second (triggering) message pushed into the fake Telegram server, once the subagent made its
first LLM request and is inside its `sleep`. Stop: the engine's `die` event for the container (not
running), and its `destroy` event (removed). Events are read from the engine's event stream and stamped
on arrival. Baseline: a running container of the same image (`sleep 300`), `docker kill` (then `rm`), the
same events observed the same way, one after each product run (interleaved, so load changes hit both).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import secrets
import time
from collections.abc import AsyncIterator

import docker
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bench.apps import FirstCallProbe, bench_app
from bench.common import BenchContext, bench_settings, ms
from bench.engine import EngineEvents, bare_start, engine_client, kill_container, remove_container
from bench.report import Measure, Row
from bot.agent.offline import BACKGROUND_PHRASE, SPAWN_TOOL
from bot.agent.prompt import LATEST_MARKER
from runner.runtimes.runtime import container_name
from runner.storage.paths import container_user
from tests.fakes.telegram_server import FakeTelegram

NAME = "cancel"
WARMUP = 1
MERGE_WINDOW_SECONDS = 120.0
SETTLE_SECONDS = 0.5  # after the first LLM request, until the bash tool is inside `sleep 300`
WAIT_SECONDS = 90.0
RUN_ID = re.compile(r"run ([A-Za-z0-9_-]{6,64})")


class HoldingModel:
    """Spawns on `background:`, then holds the turn open forever; answers anything else at once. The main
    agent streams its answers, so this is the FunctionModel's stream function."""

    def __init__(self) -> None:
        self.held: asyncio.Queue[str] = asyncio.Queue()
        self._never = asyncio.Event()

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        last = messages[-1]
        if isinstance(last, ModelRequest):
            for part in last.parts:
                if isinstance(part, ToolReturnPart) and part.tool_name == SPAWN_TOOL:
                    match = RUN_ID.search(str(part.content))
                    self.held.put_nowait(match.group(1) if match else "")
                    await self._never.wait()  # cancelled when the turn is aborted
        latest = _latest_text(messages)
        if BACKGROUND_PHRASE in latest:
            task = latest.split(BACKGROUND_PHRASE, 1)[1].strip()
            args = json.dumps({"task": task, "label": "hold", "include_context": False})
            yield {0: DeltaToolCall(name=SPAWN_TOOL, json_args=args, tool_call_id=f"hold-{secrets.token_hex(4)}")}
            return
        yield "ok"


def _latest_text(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if hasattr(part, "content") and isinstance(part.content, str) and LATEST_MARKER in part.content:
                    return part.content.rpartition(LATEST_MARKER)[2]
    return ""


async def _bare_sample(
    events: EngineEvents, client: docker.DockerClient, image: str, name: str, chat_id: int
) -> tuple[float, float]:
    """One running container of the image: `docker kill` → `die`, then `docker rm` → `destroy` (ms)."""
    container_id = await asyncio.to_thread(
        functools.partial(
            bare_start,
            client,
            image,
            name=name,
            entrypoint=["sleep"],
            command=["300"],
            chat_id=chat_id,
            user=container_user(),
        )
    )
    try:
        await events.wait(container_id, "start", WAIT_SECONDS)
        await asyncio.sleep(SETTLE_SECONDS)
        t0 = time.perf_counter()
        await asyncio.to_thread(kill_container, client, container_id)
        die = await events.wait(container_id, "die", WAIT_SECONDS)
        await asyncio.to_thread(remove_container, client, container_id)
        destroy = await events.wait(container_id, "destroy", WAIT_SECONDS)
    finally:
        await asyncio.to_thread(remove_container, client, container_id)
    return ms(die - t0), ms(destroy - t0)


async def _samples(ctx: BenchContext, events: EngineEvents, count: int) -> dict[str, list[float]]:
    """Product runs and bare kills, interleaved so a change in the machine's load hits both alike."""
    samples: dict[str, list[float]] = {key: [] for key in ("kill_asked", "die", "destroy", "bare_die", "bare_destroy")}
    statuses: list[str] = []
    chat_id = ctx.chat_id(0)
    model = HoldingModel()
    client = await asyncio.to_thread(engine_client)
    batch = secrets.token_hex(3)
    try:
        async with FakeTelegram() as tg:
            settings = bench_settings(
                ctx.work_dir / "data",
                token=tg.token,
                base_url=tg.base_url,
                ALLOWED_CHAT_IDS=str(chat_id),
                MERGE_WINDOW_SECONDS=MERGE_WINDOW_SECONDS,
                SUBAGENT_TIMEOUT_SECONDS=600,
            )
            async with bench_app(settings, model=FunctionModel(stream_function=model), with_subagents=True) as bench:
                service, runtime = bench.subagents()
                probe = FirstCallProbe(service.live)
                mention = f"@{tg.bot_username}"
                for i in range(WARMUP + count):
                    tg.push_message(chat_id, f"{mention} {BACKGROUND_PHRASE} $ sleep 300")
                    run_id = await asyncio.wait_for(model.held.get(), WAIT_SECONDS)
                    await probe.wait(run_id, WAIT_SECONDS)
                    await asyncio.sleep(SETTLE_SECONDS)
                    container_id, _ = runtime.started[container_name(run_id)]
                    t0 = time.perf_counter()
                    tg.push_message(chat_id, f"{mention} never mind, stop that")
                    die = await events.wait(container_id, "die", WAIT_SECONDS)
                    destroy = await events.wait(container_id, "destroy", WAIT_SECONDS)
                    statuses.append(await bench.wait_run_done(run_id, WAIT_SECONDS))
                    await asyncio.wait_for(bench.app.wait_quiet(chat_id), WAIT_SECONDS)
                    name = f"crewbot-bench-kill-{batch}-{i:03d}"
                    bare_die, bare_destroy = await _bare_sample(
                        events, client, settings.subagent_image, name, ctx.chat_id(1)
                    )
                    if i < WARMUP:
                        continue
                    samples["kill_asked"].append(ms(runtime.kill_asked[container_id] - t0))
                    samples["die"].append(ms(die - t0))
                    samples["destroy"].append(ms(destroy - t0))
                    samples["bare_die"].append(bare_die)
                    samples["bare_destroy"].append(bare_destroy)
    finally:
        client.close()
    if any(status != "cancelled" for status in statuses):
        ctx.note(f"not every run was recorded cancelled: {statuses}")
    return samples


async def run(ctx: BenchContext) -> list[Row]:
    count = ctx.scaled(20, 4)
    async with EngineEvents() as events:
        samples = await _samples(ctx, events, count)
    ctx.note(f"{count} runs each (after {WARMUP} warm-up), interleaved; MERGE_WINDOW_SECONDS={MERGE_WINDOW_SECONDS:g}")
    return [
        Row(
            bench=NAME,
            metric="merging message → container stopped (engine `die`)",
            unit="ms",
            result=Measure.of(samples["die"]),
            baseline_label="bare `docker kill` → `die`",
            baseline=Measure.of(samples["bare_die"]),
        ),
        Row(
            bench=NAME,
            metric="merging message → container removed (engine `destroy`)",
            unit="ms",
            result=Measure.of(samples["destroy"]),
            baseline_label="bare `docker kill` + `docker rm` → `destroy`",
            baseline=Measure.of(samples["bare_destroy"]),
        ),
        Row(
            bench=NAME,
            metric="merging message → kill asked of the engine (where the time goes)",
            unit="ms",
            result=Measure.of(samples["kill_asked"]),
        ),
    ]
