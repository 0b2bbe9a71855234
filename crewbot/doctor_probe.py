"""A doctor probe's end: wait for the test container (or Job), take its output, and remove it whatever happened."""

from __future__ import annotations

from runner.runtimes.runtime import ContainerRuntime


async def probe_outcome(runtime: ContainerRuntime, container_id: str, timeout_seconds: float) -> tuple[int | None, str]:
    """Its exit code (None: not finished in time) and its output, stripped; it is killed and removed after."""
    try:
        code = await runtime.wait(container_id, timeout_seconds)
        output = (await runtime.logs(container_id)).decode(errors="replace").strip()
    finally:
        await runtime.kill(container_id)
        await runtime.remove(container_id)
    return code, output
