"""One subagent run: history in, agent loop against the proxy, history out, and the RunResult to report."""

from __future__ import annotations

from collections.abc import Callable

from pydantic_ai import UsageLimits
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.usage import RunUsage

from container.agent import build_agent, build_prompt
from container.llm import open_model
from container.paths import ContainerPaths
from container.protocol import RunResult, TaskSpec
from container.session import SessionError, load_history, save_history
from container.tools import Toolbox

MAX_ERROR_CHARS = 2_000
MAX_ERROR_CAUSES = 3


async def run_task(task: TaskSpec, paths: ContainerPaths, log: Callable[[str], None]) -> RunResult:
    """Run the agent on `task`; any failure becomes a `failed` result with a short reason."""
    usage = RunUsage()
    try:
        output = await _run(task, paths, usage, log)
    except SessionError as exc:
        return _failed(task, f"unusable session: {exc}", usage)
    except UsageLimitExceeded:
        return _failed(task, f"step limit reached: {task.max_steps} model requests", usage)
    except Exception as exc:  # the run's outcome is the report: every error ends up in result.json
        return _failed(task, describe_error(exc), usage)
    return RunResult(
        run_id=task.run_id,
        status="completed",
        result=output,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
    )


async def _run(task: TaskSpec, paths: ContainerPaths, usage: RunUsage, log: Callable[[str], None]) -> str:
    history = load_history(paths.session_in_file)
    if not paths.llm_socket.exists():
        raise ConnectionError(f"the LLM proxy socket {paths.llm_socket} does not exist")
    toolbox = Toolbox(
        workspace_dir=paths.workspace_dir,
        ipc_dir=paths.ipc_dir,
        run_id=task.run_id,
        bash_timeout_seconds=task.bash_timeout_seconds,
        output_cap_chars=task.output_cap_chars,
    )
    log(
        f"run {task.run_id}: model {task.model} ({task.provider_kind}), "
        f"{len(history)} prior messages, at most {task.max_steps} steps"
    )
    async with open_model(task, paths.llm_socket) as model:
        agent = build_agent(model, toolbox, log)
        result = await agent.run(
            build_prompt(task),
            message_history=history or None,
            usage_limits=UsageLimits(request_limit=task.max_steps),
            usage=usage,
        )
    save_history(paths.session_out_file, result.all_messages())
    return result.output


def describe_error(exc: BaseException) -> str:
    """`Type: message`, following the chain to the root cause (an SDK error wraps the socket's)."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < MAX_ERROR_CAUSES:
        text = str(current).strip()
        parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__ or current.__context__
    message = " <- ".join(parts)
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 3] + "..."


def _failed(task: TaskSpec, error: str, usage: RunUsage) -> RunResult:
    return RunResult(
        run_id=task.run_id,
        status="failed",
        error=error,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
    )
