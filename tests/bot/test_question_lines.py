"""`/subagents <run id>` and `crewbot logs` show a run's questions and decisions (who, when, what), from the store,
each on one line with the members' and containers' words made safe to show. Real store."""

from __future__ import annotations

import time
from pathlib import Path

from bot.run_output import RunOutputReader
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.questions import Audience, NewQuestion, QuestionKind, QuestionStatus, QuestionStore
from core.store.runs import RunStatus, RunStore
from tests.fakes.memory_runtime import MemoryRuntime

CHAT = -100


def asked(kind: QuestionKind, text: str, options: tuple[str, ...] = ()) -> NewQuestion:
    return NewQuestion(
        chat_id=CHAT, run_id="run-000001", kind=kind, text=text, options=options, audience=Audience.ASKERS,
        expires_at=time.time() + 60,
    )  # fmt: skip


async def test_a_runs_questions_and_decisions_are_listed(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "crewbot.db")
    try:
        await ChatStore(db).ensure(CHAT, "group", "g")
        runs, questions = RunStore(db), QuestionStore(db)
        await runs.create(
            "run-000001", chat_id=CHAT, turn_id=None, task="t", label="pick", include_context=False,
            status=RunStatus.QUEUED,
        )  # fmt: skip
        which = await questions.create("q1", asked(QuestionKind.ASK, "Which file?\n`rm -rf`", ("a.txt", "b.txt")))
        assert await questions.answer(which.id, "b.txt", 1, 1001, "Alice")
        web = await questions.create("q2", asked(QuestionKind.EGRESS, "Run run- wants to reach pypi.org:443."))
        assert await questions.close(web.id, QuestionStatus.EXPIRED, "no answer in time")
        await questions.create("q3", asked(QuestionKind.ASK, "Anything else?"))
        reader = RunOutputReader(runs, MemoryRuntime(), lambda run_id: tmp_path / run_id, questions=questions)
        output = await reader.read("run-000001", 1_000)
        assert output is not None
        lines = output.extra_lines
    finally:
        await db.close()
    assert lines[0] == "Questions: 3:"
    assert lines[1].startswith('asked "Which file? \'rm -rf\'" [a.txt | b.txt]: Alice (1001) answered "b.txt" at ')
    assert lines[2].startswith('web "Run run- wants to reach pypi.org:443.": closed (no answer in time) at ')
    assert lines[3].startswith('asked "Anything else?": waiting for an answer since ')
