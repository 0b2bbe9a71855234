"""The card's words and buttons for runs in the loop with the chat: a queued run held for approval reads
"awaiting approval" and has Approve and Deny (its question's buttons) besides Cancel; a running run waiting for
the chat's answer says so; once decided, the buttons go."""

from __future__ import annotations

import dataclasses
import time

from bot.channels.buttons import CardAction
from bot.status_card import buttons, render
from core.store.questions import Audience, Question, QuestionKind, QuestionStatus
from core.store.runs import RunRecord, RunStatus


def run(run_id: str, label: str, status: RunStatus) -> RunRecord:
    now = time.time()
    return RunRecord(
        id=run_id, chat_id=-1, turn_id="turn-1", task="t", label=label, include_context=False, status=status,
        container_id=None, created_at=now, started_at=None, finished_at=None, result=None, error=None,
        input_tokens=0, output_tokens=0, llm_requests=0, session_in=None, session_out=None,
    )  # fmt: skip


def approval(run_id: str) -> Question:
    return Question(
        id="q-approve-1", chat_id=-1, run_id=run_id, kind=QuestionKind.APPROVAL, ask_id=None, text="ok?",
        options=("Approve", "Deny"), audience=Audience.ADMINS, status=QuestionStatus.OPEN, created_at=0.0,
        expires_at=1e12, message_id=None, answer=None, option=None, answered_by=None, answered_by_name=None,
        answered_at=None, detail=None,
    )  # fmt: skip


def test_a_run_awaiting_approval_and_one_waiting_for_an_answer() -> None:
    held, asking = run("run-held", "deploy", RunStatus.QUEUED), run("run-ask", "pick", RunStatus.RUNNING)
    held_ids = frozenset({"run-held"})
    text = render([held, asking], time.time(), frozenset({"run-ask"}), held_ids)
    assert "• deploy: awaiting approval," in text
    assert "• pick: running, waiting for an answer," in text
    assert "\n  task: t\n" in text  # what the admin approves; a running run's task is not repeated
    long = render([dataclasses.replace(held, task="drop\nthe  tables " + "x" * 1_000)], time.time(), approving=held_ids)
    [line] = [line for line in long.splitlines() if line.startswith("  task: ")]
    assert line.startswith("  task: drop the tables xx") and line.endswith("…") and len(line) <= 8 + 120
    shown = buttons([held, asking], {"run-held": approval("run-held")})
    assert [(b.action, b.run_id, b.option, b.label) for b in shown[:2]] == [
        (CardAction.ANSWER, "q-approve-1", 0, "Approve deploy"),
        (CardAction.ANSWER, "q-approve-1", 1, "Deny deploy"),
    ]
    assert [b.label for b in shown[2:]] == ["Cancel deploy", "Cancel pick", "Cancel all"]
    # Decided (no open question any more): Cancel only, and the line reads queued.
    assert [b.action for b in buttons([held], {})] == [CardAction.CANCEL]
    assert "• deploy: queued," in render([held], time.time())
