"""The warm pool (SUBAGENT_WARM_POOL): containers started ahead with a run's hardening, each for one run.

A member is made by `pool_container_spec` (the builder of a run's container) in folders of its own: the host
binds and listens on the member's run socket before it starts the container, and the agent, everything imported,
connects at once and sends its task request, which waits in the socket's backlog while the agent is blocked in a
read (no CPU while idle). That waiting connection makes the socket readable: the member is ready. A claim renames
the member's channel and scratch folders to the run's (one parent each: atomic, and the bind mounts follow) and
hands the listening socket to the run's channel server, which accepts the waiting request and answers the task:
the run meets a running agent in milliseconds instead of a container start.

A member made with another image id or other settings than a claim's (`pool_config`) is drained, never claimed;
one whose agent does not come up in MEMBER_READY_SECONDS, or that exits while idle (killed from outside, the
engine restarted), is removed and replaced. Refilling is one member at a time in the background, outside the
cap's slots; it pauses while memory is short or after engine errors (with a back-off), and says why in `stats`.
A member is never given back: after its run it is removed like any run's container. Recovery, at a start,
removes the members an earlier process left unclaimed (runner/lifecycle/recovery.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from core.backoff import backoff_seconds
from core.logging import get_logger
from core.settings import Settings
from runner.lifecycle.container_spec import pool_config, pool_container_spec
from runner.lifecycle.pool_folders import make_member_folders, move_member_folders, remove_folders, until_connected
from runner.lifecycle.pool_memory import MemoryCheck
from runner.lifecycle.pool_status import PoolStats
from runner.runtimes.runtime import (
    LABEL_POOL_CONFIG,
    ContainerGone,
    ContainerRuntime,
    ContainerStartError,
    RuntimeUnavailable,
)
from runner.storage.paths import DataPaths

log = get_logger(__name__)

MEMBER_READY_SECONDS = 30.0  # an agent that has not connected by then never will: the member is replaced
RECHECK_SECONDS = 10.0
# Refilling waits until no run has claimed a member for this long: a burst's runs get the engine and the CPU
# first, and the containers started for the pool come after them, not between them.
QUIET_SECONDS = 1.0  # how often an idle pool looks at its image, its settings and the host's memory again
ENGINE_RETRY_FIRST_SECONDS = 2.0
ENGINE_RETRY_MAX_SECONDS = 60.0
MEMBER_ID_BYTES = 6

ImageId = Callable[[str], Awaitable[str | None]]


class MemberFailed(Exception):
    """A member that did not become ready: its agent never connected, or its container exited first."""


@dataclass(eq=False, slots=True)
class Member:
    id: str
    config: str
    listening: socket.socket
    channel_dir: Path
    scratch: Path
    container_id: str | None = None
    ready: bool = False
    dead: bool = False
    watcher: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A member a run took: its container, and the listening socket its agent waits on (the run's now)."""

    member_id: str
    container_id: str
    listening: socket.socket


@dataclass(slots=True)
class _Counts:
    hits: int = 0
    misses: int = 0
    failures: int = 0  # engine errors in a row, for the back-off
    paused: str | None = None


@dataclass(slots=True)
class _Members:
    all: list[Member] = field(default_factory=list)

    def ready(self) -> list[Member]:
        return [m for m in self.all if m.ready and not m.dead]


class WarmPool:
    def __init__(
        self,
        settings: Settings,
        runtime: ContainerRuntime,
        paths: DataPaths,
        *,
        image_id: ImageId | None = None,
        memory: MemoryCheck | None = None,
        ready_seconds: float = MEMBER_READY_SECONDS,
        publish: Callable[[PoolStats], None] | None = None,
    ) -> None:
        self._settings = settings
        self._runtime = runtime
        self._paths = paths
        self._image_id = image_id  # None: the image's name stands for its id (a runtime that cannot tell)
        self._memory = memory or MemoryCheck()
        self._ready_seconds = ready_seconds
        self._publish = publish  # told the pool's state after each look (blocking: called in a thread)
        self._members = _Members()
        self._counts = _Counts()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._last_claim = 0.0  # monotonic
        self._config_flight: asyncio.Task[str] | None = None

    @property
    def target(self) -> int:
        return self._settings.subagent_warm_pool

    def start(self) -> None:
        """Begin filling (after recovery removed what an earlier process left)."""
        if self._task is None:
            self._task = asyncio.create_task(self._refill_forever(), name="warm-pool")

    async def close(self) -> None:
        """Shutdown: stop refilling and remove the idle members (a member never outlives its process's pool)."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(self._discard(m) for m in list(self._members.all)), return_exceptions=True)

    # --- claiming -------------------------------------------------------------------------------

    def look_ahead(self) -> asyncio.Task[str]:
        """The fingerprint's engine lookup, started for a claim to come (its run's placement is decided meanwhile):
        hand it to claim(), which awaits it (its answer came after that run's request arrived)."""
        if self._config_flight is None or self._config_flight.done():
            self._config_flight = asyncio.create_task(self._config())
            self._config_flight.add_done_callback(lambda t: t.cancelled() or t.exception())  # a folder run's: unread
        return self._config_flight

    async def claim(self, run_id: str, ahead: asyncio.Task[str] | None = None) -> Claimed | None:
        """A ready member made as a run's container would be now, moved to `run_id`'s folders; None: a miss
        (the run starts cold, as without a pool). Members found stale on the way are drained; when nothing can
        be vouched for (the engine cannot name the image) or after close(), nothing is claimed."""
        if self._closing or (self.target == 0 and not self._members.all):
            return None
        try:
            config = await asyncio.shield(ahead or self.look_ahead())  # one engine call for a burst's claims
        except Exception as exc:  # the engine cannot say which image: a miss, and no member is drained for it
            log.warning("warm_pool_claim_unchecked", error=str(exc))
            self._miss()
            return None
        if self._closing:  # close() began while the image was looked up: its removals take every member
            return None
        for member in self._members.ready():  # oldest first: a member idles for as short a time as it can
            if member.config != config:
                self._drop(member, "stale")
                continue
            if member.watcher is None or member.watcher.done() or member.container_id is None:
                continue
            self._members.all.remove(member)  # taken: no other claim can have it while its folders move
            try:
                await asyncio.to_thread(move_member_folders, member.channel_dir, member.scratch, self._paths, run_id)
            except OSError as exc:  # its own folders are broken: that member goes, the run starts cold
                log.warning("warm_pool_claim_failed", member=member.id, error=str(exc))
                self._members.all.append(member)
                self._drop(member, "unmovable")
                self._miss()
                return None
            member.watcher.cancel()  # the run's supervisor watches its container from now on
            self._counts.hits += 1
            self._last_claim = time.monotonic()
            self._wake.set()
            log.info("warm_pool_hit", run_id=run_id, member=member.id)
            return Claimed(member.id, member.container_id, member.listening)
        self._miss()
        return None

    def _miss(self) -> None:
        self._counts.misses += 1 if self.target else 0
        self._wake.set()

    def missed(self) -> None:
        """A run started cold without asking (it needs its chat's folder mounted): a miss all the same."""
        self._counts.misses += 1

    def lost(self) -> None:
        """A claimed member could not serve its run (gone before it was told its run): a miss, not a hit."""
        self._counts.hits -= 1
        self._counts.misses += 1

    async def stats(self) -> PoolStats:
        ready = self._members.ready()
        samples = await asyncio.gather(
            *(self._runtime.usage(m.container_id) for m in ready if m.container_id), return_exceptions=True
        )
        used = [s.memory_peak_bytes for s in samples if not isinstance(s, BaseException) and s is not None]
        known = [b for b in used if b is not None]
        return PoolStats(
            target=self.target,
            ready=len(ready),
            starting=len(self._members.all) - len(ready),
            hits=self._counts.hits,
            misses=self._counts.misses,
            paused=self._counts.paused,
            idle_memory_bytes=sum(known) if known else None,
        )

    def counts(self) -> tuple[int, int, int, int]:
        """Ready, starting, hits, misses: what the metrics read on every scrape, without the engine."""
        ready = len(self._members.ready())
        return ready, len(self._members.all) - ready, self._counts.hits, self._counts.misses

    @property
    def paused(self) -> str | None:
        return self._counts.paused

    # --- refilling ------------------------------------------------------------------------------

    async def _refill_forever(self) -> None:
        while not self._closing:
            self._wake.clear()  # before the look, so that a change during it wakes the next one
            quiet = self._quiet_seconds()
            if quiet > 0:
                # A claim woke it: no look at the engine and no figures published while a burst's runs start
                # (each claim would cost an image lookup and a usage sample per member on the runs' cores).
                await asyncio.sleep(quiet)
                continue
            try:
                delay = await self._refill_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the pool's loop die: a cold start is always there
                log.exception("warm_pool_refill_failed")
                self._counts.paused = f"internal error: {exc}"
                delay = ENGINE_RETRY_MAX_SECONDS
            await self._published()
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow close()'s cancel
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _refill_once(self) -> float:
        """Drain stale members, then add members one at a time up to the target; the pause before the next look."""
        image_id = await self._image_or_pause()
        if image_id is None:
            return self._retry_seconds()
        config = pool_config(self._settings, image_id)
        for member in list(self._members.all):
            if member.config != config and member.ready:
                self._drop(member, "stale")
        for member in self._members.all[self.target :]:  # the operator lowered SUBAGENT_WARM_POOL
            if member.ready:
                self._drop(member, "over the target")
        while len(self._members.all) < self.target and not self._closing:
            quiet = self._quiet_seconds()
            if quiet > 0:
                return quiet
            short = self._memory.short_of(self.target - len(self._members.all))
            if short is not None:
                self._counts.paused = short
                return RECHECK_SECONDS
            try:
                await self._add(image_id)
            except (RuntimeUnavailable, ContainerStartError, MemberFailed, OSError) as exc:
                self._counts.failures += 1
                self._counts.paused = f"{type(exc).__name__}: {exc}"
                log.warning("warm_pool_member_failed", error=str(exc), failures=self._counts.failures)
                return self._retry_seconds()
            self._counts.failures = 0
        self._counts.paused = None  # full (or asked for less): nothing holds refilling back
        return RECHECK_SECONDS

    def _quiet_seconds(self) -> float:
        """How long refilling still waits after the last claim (0: not at all)."""
        return max(0.0, QUIET_SECONDS - (time.monotonic() - self._last_claim))

    async def _published(self) -> None:
        if self._publish is None:
            return
        try:
            await asyncio.to_thread(self._publish, await self.stats())
        except Exception as exc:  # the figures are for stats and doctor: never stop the pool for them
            log.warning("warm_pool_status_not_written", error=str(exc))

    async def _image_or_pause(self) -> str | None:
        try:
            return await self._image()
        except (RuntimeUnavailable, ContainerStartError) as exc:  # the engine away, or the image not on it
            self._counts.failures += 1
            away = isinstance(exc, RuntimeUnavailable)
            self._counts.paused = f"the engine is not answering: {exc}" if away else f"ContainerStartError: {exc}"
            return None

    def _retry_seconds(self) -> float:
        return backoff_seconds(
            self._counts.failures, first_seconds=ENGINE_RETRY_FIRST_SECONDS, max_seconds=ENGINE_RETRY_MAX_SECONDS
        )

    async def _config(self) -> str:
        return pool_config(self._settings, await self._image())

    async def _image(self) -> str:
        image = self._settings.subagent_image
        image_id = await self._image_id(image) if self._image_id is not None else image
        if image_id is None:
            raise ContainerStartError(f"image {image!r} not found on the engine")
        return image_id

    async def _add(self, image_id: str) -> None:
        member_id = secrets.token_hex(MEMBER_ID_BYTES)
        channel_dir, scratch = self._paths.pool_channel_dir(member_id), self._paths.pool_scratch(member_id)
        listening = await asyncio.to_thread(make_member_folders, channel_dir, scratch)
        member = Member(member_id, "", listening, channel_dir, scratch)
        self._members.all.append(member)
        try:
            spec = pool_container_spec(
                self._settings,
                member_id=member_id,
                instance_id=self._paths.instance_id,
                channel_dir=channel_dir,
                workspace=scratch,
                image_id=image_id,
            )
            member.config = spec.labels[LABEL_POOL_CONFIG]  # the spec's own: what a claim compares
            starting = asyncio.ensure_future(self._runtime.start(spec))
            try:
                member.container_id = await asyncio.shield(starting)
            except asyncio.CancelledError:  # close() during the start: its container, once made, is removed below
                with contextlib.suppress(Exception):
                    member.container_id = await starting
                raise
            member.watcher = asyncio.create_task(self._watch(member), name=f"pool-{member_id}")
            await self._until_ready(member)
        except BaseException:
            await self._discard(member)
            raise
        member.ready = True
        log.info("warm_pool_member_ready", member=member_id, container_id=member.container_id)

    async def _until_ready(self, member: Member) -> None:
        """Its agent's connection waits on the socket (it is readable), or MemberFailed."""
        assert member.watcher is not None
        outcome = await until_connected(member.listening, member.watcher, self._ready_seconds)
        if outcome is not None:
            raise MemberFailed(f"a pool member's agent did not come up ({outcome})")

    async def _watch(self, member: Member) -> None:
        """Until the member's container exits while idle (killed from outside, the engine restarted): then it
        is removed and replaced. Cancelled when a run claims it."""
        assert member.container_id is not None
        while True:
            try:
                code = await self._runtime.wait(member.container_id, None)
                break
            except ContainerGone:
                code = None
                break
            except RuntimeUnavailable:
                await asyncio.sleep(ENGINE_RETRY_FIRST_SECONDS)
        member.dead = True
        if member.ready:
            log.warning("warm_pool_member_exited", member=member.id, exit_code=code)
            self._drop(member, "exited while idle")

    def _drop(self, member: Member, why: str) -> None:
        """Out of the pool at once (no claim can take it), removed in the background; the pool refills."""
        if member in self._members.all:
            self._members.all.remove(member)
            log.info("warm_pool_member_drained", member=member.id, reason=why)
            asyncio.create_task(self._discard(member), name=f"pool-drain-{member.id}")  # noqa: RUF006
        self._wake.set()

    async def _discard(self, member: Member) -> None:
        with contextlib.suppress(ValueError):
            self._members.all.remove(member)
        if member.watcher is not None and member.watcher is not asyncio.current_task():
            member.watcher.cancel()
        member.listening.close()
        if member.container_id is not None:
            try:
                await self._runtime.remove(member.container_id)  # force: kills it first
            except Exception as exc:  # recovery removes it at the next start
                log.warning("warm_pool_member_not_removed", member=member.id, error=str(exc))
        await asyncio.to_thread(remove_folders, member.channel_dir, member.scratch)
