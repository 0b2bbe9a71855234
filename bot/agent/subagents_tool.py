"""The main agent's `subagents` tool: list this chat's runs, a run's status with its latest progress
message, send a running subagent a follow-up, cancel one. The main agent answers "how is the report
going?" with what the store says, and acts on "stop the scraper"."""

from __future__ import annotations

import time
from enum import StrEnum

from pydantic_ai import RunContext

from bot.agent.deps import TurnDeps
from bot.ports.runs import when_text
from core.logging import get_logger
from core.store.runs import FollowUp, RunStatus

log = get_logger(__name__)

MAX_TOOL_LISTED_RUNS = 10
CANCEL_REFUSED = (
    "Refused: only a chat admin can cancel a run, and not everyone whose message this answers is one. "
    "Nothing was cancelled; an admin can ask, or use /cancel."
)


class SubagentAction(StrEnum):
    LIST = "list"
    STATUS = "status"
    SEND = "send"
    CANCEL = "cancel"


async def subagents(
    ctx: RunContext[TurnDeps], action: SubagentAction, run_id: str | None = None, text: str | None = None
) -> str:
    """See and steer this chat's subagents.

    Args:
        action: `list` this chat's runs (state, age, label); `status` of one run, with its latest
            progress message; `send` a running one a follow-up (it sees it before its next step);
            `cancel` one (only when the people asking are chat admins).
        run_id: The run, for status, send and cancel (from `list`, or from when it was started).
        text: For send: the follow-up, as complete instructions.
    """
    deps = ctx.deps
    desk = deps.desk
    if desk is None:
        return "Subagents are not available here."
    if action is SubagentAction.LIST:
        runs = await desk.list_runs(deps.chat_id, MAX_TOOL_LISTED_RUNS)
        if not runs:
            return "This chat has no subagent runs."
        now = time.time()
        return "\n".join(f"{r.id}: {r.status} {when_text(r, now)}, {r.label}" for r in runs)
    if not run_id:
        return f"`{action}` needs a run_id; `list` shows them."
    if action is SubagentAction.STATUS:
        described = await desk.describe_run(deps.chat_id, run_id)
        return described or f"This chat has no run {run_id}."
    if action is SubagentAction.SEND:
        if not text or not text.strip():
            return "`send` needs the text to send."
        outcome = await desk.send_to_run(deps.chat_id, run_id, text.strip())
        log.info("subagent_followup", run_id=run_id, outcome=outcome)
        return {
            FollowUp.SENT: f"Sent to run {run_id}: it sees it before its next step.",
            FollowUp.NOT_RUNNING: f"Run {run_id} is not running in this chat (ended, not started yet, or unknown).",
            FollowUp.FULL: f"Run {run_id} has had as many follow-ups as it may; cancel it and start a new one.",
        }[outcome]
    # As /cancel: admins only. The authority is who asked in the chat; the model's reasons do not count.
    if not await deps.asked_by_admins():
        log.info("subagent_cancel_refused", run_id=run_id, askers=list(deps.askers))
        return CANCEL_REFUSED
    status = await desk.cancel_run(deps.chat_id, run_id)
    if status is None:
        return f"This chat has no run {run_id}."
    if status == RunStatus.CANCELLED:
        return f"Run {run_id} is cancelled."
    return f"Run {run_id} had already ended: {status}."
