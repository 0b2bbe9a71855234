"""One line of `crewbot doctor`: a check's status, what it found, and the fix when it failed; and a probe's end
(the test container or Job), which the engine's checks and the cluster's share."""

from __future__ import annotations

from dataclasses import dataclass

from runner.runtimes.runtime import ContainerRuntime


@dataclass(frozen=True, slots=True)
class CheckResult:
    status: str  # ok, FAIL, skip
    detail: str
    fix: str | None = None  # every FAIL has one


def fail(detail: str, fix: str) -> CheckResult:
    return CheckResult("FAIL", detail, fix)


def render(name: str, result: CheckResult) -> str:
    fix = f"; fix: {result.fix}" if result.fix else ""
    return f"{result.status:<4} {name:<9} {result.detail}{fix}"


async def probe_outcome(runtime: ContainerRuntime, container_id: str, timeout_seconds: float) -> tuple[int | None, str]:
    """Wait for the probe: its exit code (None: not finished in time) and its output, stripped; it is killed
    and removed after, whatever happened."""
    try:
        code = await runtime.wait(container_id, timeout_seconds)
        output = (await runtime.logs(container_id)).decode(errors="replace").strip()
    finally:
        await runtime.kill(container_id)
        await runtime.remove(container_id)
    return code, output
