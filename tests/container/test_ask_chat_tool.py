"""The ask_chat tool in the container: bounds checked before anything is sent, the answer as the model reads it,
and a refusal for questions used up remembered (the agent's loop stops asking once told)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from container.channel import ChannelRefused
from container.tools import Toolbox, ToolFailed


class Chat:
    def __init__(self, answers: list[dict[str, Any] | ChannelRefused]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str, list[str]]] = []

    async def ask(self, ask_id: str, question: str, options: list[str]) -> dict[str, Any]:
        self.asked.append((ask_id, question, options))
        answer = self.answers.pop(0)
        if isinstance(answer, ChannelRefused):
            raise answer
        return answer

    async def send_message(self, message_id: str, text: str) -> str:
        raise AssertionError("no messages here")

    async def send_file(self, upload_id: str, name: str, caption: str | None, fd: int, size: int) -> str:
        raise AssertionError("no files here")


def toolbox(tmp_path: Path, chat: Chat) -> Toolbox:
    return Toolbox(workspace_dir=tmp_path, channel=chat, bash_timeout_seconds=5.0, output_cap_chars=1_000)


@pytest.mark.parametrize(
    ("question", "options", "says"),
    [
        ("  ", None, "the question is empty"),
        ("x" * 100_000, None, "the question has 100000 characters; the limit is 1000"),
        ("which?", [str(i) for i in range(1_000)], "1000 options; at most 8"),
        ("which?", ["y" * 61], "each option needs 1 to 60 characters"),
        ("which?", ["a", " "], "each option needs 1 to 60 characters"),
    ],
)
async def test_questions_out_of_bounds_are_not_sent(
    tmp_path: Path, question: str, options: list[str] | None, says: str
) -> None:
    chat = Chat([])
    with pytest.raises(ToolFailed, match=says):
        await toolbox(tmp_path, chat).ask_chat(question, options)
    assert chat.asked == []


async def test_the_answer_as_the_model_reads_it_and_a_used_up_limit_remembered(tmp_path: Path) -> None:
    chat = Chat(
        [
            {"outcome": "answered", "answer": "b.txt", "by": "Alice", "detail": ""},
            {"outcome": "no_answer", "answer": None, "by": None, "detail": "nobody answered in time"},
            {"outcome": "ended", "answer": None, "by": None, "detail": "its run ended"},
            ChannelRefused("this run has asked its 3 questions (SUBAGENT_MAX_QUESTIONS)", 429),
        ]
    )
    tools = toolbox(tmp_path, chat)
    assert await tools.ask_chat(" Which file? ", [" a.txt", "b.txt "]) == "Alice answered: b.txt"
    assert chat.asked[0][1:] == ("Which file?", ["a.txt", "b.txt"])
    assert (await tools.ask_chat("Anyone?")).startswith("Nobody answered in time")
    assert await tools.ask_chat("Still there?") == "The question was closed without an answer (its run ended)."
    with pytest.raises(ToolFailed, match="SUBAGENT_MAX_QUESTIONS"):
        await tools.ask_chat("One more?")
    with pytest.raises(ToolFailed, match="SUBAGENT_MAX_QUESTIONS"):
        await tools.ask_chat("And another?")  # not sent: the host said so once
    assert len(chat.asked) == 4
    assert len({ask_id for ask_id, _, _ in chat.asked}) == 4  # each question its own id
