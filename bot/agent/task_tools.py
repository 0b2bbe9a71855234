"""The main agent's scheduled-task tools. Each answers in words the model can pass on: what was done, or
why it was refused (a bad schedule, a limit, someone else's task)."""

from __future__ import annotations

from typing import Literal

from pydantic_ai import RunContext

from bot.agent.deps import TurnDeps
from bot.schedules.book import TaskAction, TaskBook, TaskRequestError
from core.logging import get_logger

log = get_logger(__name__)

NOT_AVAILABLE = "Scheduled tasks are not available here."


def _book(ctx: RunContext[TurnDeps]) -> TaskBook | None:
    return ctx.deps.tasks


async def schedule_task(
    ctx: RunContext[TurnDeps],
    prompt: str,
    schedule: str,
    label: str | None = None,
    mode: Literal["subagent", "message"] = "subagent",
    files: list[str] | None = None,
) -> str:
    """Schedule recurring or one-off work for this chat.

    Returns the task id and its next due time in the chat's time zone, or why it was refused.

    Args:
        prompt: What to do each time it is due: complete instructions (a subagent cannot ask back).
        schedule: A five-field cron expression in the chat's time zone (`0 9 * * mon`), `every <N><s|m|h|d>`
            (`every 2h`), or an ISO 8601 date-time for once (`2026-12-01T09:00`).
        label: A short name shown in /tasks and with each result.
        mode: `subagent` runs the prompt in a sandboxed subagent; `message` has you answer it in the chat.
        files: Ids of the chat's files each run is given (`f3`, as the transcript shows them); subagent mode only.
    """
    book = _book(ctx)
    if book is None:
        return NOT_AVAILABLE
    try:
        task = await book.schedule(ctx.deps.chat_id, ctx.deps.requester_id, prompt, schedule, label, mode, files or ())
    except TaskRequestError as exc:
        return f"Not scheduled: {exc}."
    log.info("task_scheduled", task_id=task.id, chat_id=task.chat_id, schedule=task.schedule, mode=task.mode.value)
    return book.describe_new(task) + " /tasks lists the chat's tasks."


async def list_tasks(ctx: RunContext[TurnDeps]) -> str:
    """List this chat's scheduled tasks: id, label, schedule, next due time, last outcome, paused or not."""
    book = _book(ctx)
    return NOT_AVAILABLE if book is None else await book.list_text(ctx.deps.chat_id)


async def _change(ctx: RunContext[TurnDeps], task_id: str, action: TaskAction) -> str:
    book = _book(ctx)
    if book is None:
        return NOT_AVAILABLE
    try:
        # Everyone whose message this turn answers must have the right, not only the latest of them.
        deps = ctx.deps
        return await book.change(
            deps.chat_id, deps.requester_id, task_id, action, admin=False, also_asked_by=deps.askers
        )
    except TaskRequestError as exc:
        return f"Refused: {exc}."


async def pause_task(ctx: RunContext[TurnDeps], id: str) -> str:
    """Pause a scheduled task of this chat (its creator or a chat admin may).

    Args:
        id: The task id, as schedule_task or list_tasks gave it.
    """
    return await _change(ctx, id, TaskAction.PAUSE)


async def resume_task(ctx: RunContext[TurnDeps], id: str) -> str:
    """Resume a paused scheduled task of this chat (its creator or a chat admin may).

    Args:
        id: The task id.
    """
    return await _change(ctx, id, TaskAction.RESUME)


async def cancel_task(ctx: RunContext[TurnDeps], id: str) -> str:
    """Cancel a scheduled task of this chat for good (its creator or a chat admin may).

    Args:
        id: The task id.
    """
    return await _change(ctx, id, TaskAction.CANCEL)


TASK_TOOLS = (schedule_task, list_tasks, pause_task, resume_task, cancel_task)
