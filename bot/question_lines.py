"""A run's questions and decisions as operators read them in `/subagents <run id>` and `crewbot logs`: what was
asked, who decided what and when, or how it closed without an answer. Questions and answers are members' and
containers' words: shown on one line each, bounded, without anything that starts Markdown code or a link."""

from __future__ import annotations

import time
from collections.abc import Sequence

from bot.run_web import shown_reason
from core.store.questions import Question, QuestionKind, QuestionStatus

MAX_LISTED_QUESTIONS = 10  # the latest a run's listing shows
KIND_WORDS = {
    QuestionKind.ASK: "asked",
    QuestionKind.EGRESS: "web",
    QuestionKind.APPROVAL: "approval",
    QuestionKind.TOPUP: "top-up",
}


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at is not None else "?"


def question_text(question: Question) -> str:
    """`asked "Which file?" [a.txt | b.txt]: Alice (1001) answered "b.txt" at 2026-11-28 10:40:02 UTC`."""
    options = f" [{' | '.join(shown_reason(o) for o in question.options)}]" if question.options else ""
    head = f'{KIND_WORDS[question.kind]} "{shown_reason(question.text)}"{options}'
    if question.status is QuestionStatus.ANSWERED:
        who = f"{shown_reason(question.answered_by_name or '?')} ({question.answered_by})"
        return f'{head}: {who} answered "{shown_reason(question.answer or "")}" at {_when(question.answered_at)}'
    if question.status is QuestionStatus.OPEN:
        return f"{head}: waiting for an answer since {_when(question.created_at)}"
    closed = "no answer in time" if question.status is QuestionStatus.EXPIRED else shown_reason(question.detail or "")
    return f"{head}: closed ({closed}) at {_when(question.answered_at)}"


def question_lines(questions: Sequence[Question]) -> list[str]:
    """`Questions: N` then the latest ones, oldest first; nothing for a run that asked none."""
    if not questions:
        return []
    latest = list(questions)[-MAX_LISTED_QUESTIONS:]
    shown = f"; the last {len(latest)}:" if len(latest) < len(questions) else ":"
    return [f"Questions: {len(questions)}{shown}", *(question_text(q) for q in latest)]
