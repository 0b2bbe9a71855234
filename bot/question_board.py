"""Questions as the chat sees them: a message with one button per option (a reply answers one without), and,
once decided, the same message saying how, without its buttons. A button names the question and the option,
nothing else (bot/question_presses.py decides a press)."""

from __future__ import annotations

from bot.channels.base import CardChannel
from bot.channels.buttons import CardAction, CardButton
from bot.question_presses import closed_text
from core.store.questions import Question, QuestionKind, QuestionStatus

REPLY_HINT = "(Reply to this message to answer.)"


class QuestionBoard:
    """The chat's board for core.questions.Questions, on a channel that shows buttons."""

    def __init__(self, channel: CardChannel) -> None:
        self._channel = channel

    async def show(self, question: Question, reply_to: int | None) -> int | None:
        return await self._channel.post_card(question.chat_id, text(question), reply_to, buttons(question))

    async def settle(self, question: Question) -> None:
        if question.message_id is None:
            return
        await self._channel.edit_card(question.chat_id, question.message_id, text(question), ())


def text(question: Question) -> str:
    """The question's message: who asks and what, and once closed, how it was decided."""
    if question.kind is QuestionKind.ASK:
        body = f"❓ A subagent asks: {question.text}"
        if not question.options and question.is_open:
            body += f"\n{REPLY_HINT}"
    else:
        body = question.text
    if question.is_open:
        return body
    if question.status is QuestionStatus.ANSWERED:
        return f"{body}\n\n✅ {(question.answered_by_name or 'someone')[:40]}: {question.answer or ''}"
    return f"{body}\n\n— {closed_text(question)}"


def buttons(question: Question) -> list[CardButton]:
    if not question.is_open:
        return []
    return [
        CardButton(CardAction.ANSWER, question.id, label, option=index) for index, label in enumerate(question.options)
    ]
