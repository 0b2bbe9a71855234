"""What a press of a question's button, or a reply to a question, does: decided again from the store, never from
the button or the message, so a forged, replayed, cross-chat or stale one changes nothing.

The question must be of the chat the press came from, open, and the option one it has (an approval's buttons
are on its run's status card, so the message pressed is not what decides). Who may answer: for a subagent's
question, who asked for the run, the chat's admins and ADMIN_USER_IDS; for a web host, an approval or a top-up,
the admins only (`decides`: in a private chat, ADMIN_USER_IDS only, never the chat's own user). Anyone else
gets an alert saying who may. The first answer counts (the store writes it only while the question is open); a
second presser is told whose answer counted. What an answer does is done by
whoever waits for it (the run's ask_chat, its door, its approval), after the store has it; a top-up's is done
here, after the store has it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from bot.channels.buttons import CardAnswer, CardPress
from bot.channels.inbound import InboundMessage
from core.logging import get_logger
from core.questions import Questions
from core.store.questions import Audience, Question, QuestionKind, QuestionStatus
from core.store.runs import FINAL_STATUSES, RunStore
from core.store.turns import TurnStore

log = get_logger(__name__)

AdminCheck = Callable[[int, int], Awaitable[bool]]
# (chat id, user id, user name): a day's top-up added, in the words the presser is told
TopUp = Callable[[int, int, str], Awaitable[str]]
NO_SUCH_QUESTION = "This button does nothing (any more)."
MAX_REPLY_ANSWER_CHARS = 2_000  # a reply that answers a question, as the run gets it (container.contract)
MAX_SHOWN_ANSWER_CHARS = 60
MAX_NAMES_SHOWN = 3


class QuestionPresses:
    def __init__(
        self,
        desk: Questions,
        runs: RunStore,
        turns: TurnStore,
        is_admin: AdminCheck,
        top_up: TopUp | None = None,
        decides: AdminCheck | None = None,
    ) -> None:
        self._desk = desk
        self._runs = runs
        self._turns = turns
        self._is_admin = is_admin  # a subagent's question: besides who asked for the run
        # An admins' question (an approval, a web host, a top-up): in a private chat only ADMIN_USER_IDS, not its user.
        self._decides = decides or is_admin
        self._top_up = top_up

    async def press(self, press: CardPress) -> CardAnswer:
        question = await self._desk.store.get(press.run_id)
        if question is None or question.chat_id != press.chat_id:
            # Another chat's question does not exist for this one: the answer says no more than for none at all.
            return self._refused(press, "no such question in this chat", CardAnswer(NO_SUCH_QUESTION))
        if press.option is None or not 0 <= press.option < len(question.options):
            return self._refused(press, "no such option", CardAnswer(NO_SUCH_QUESTION))
        question = await self._still_asked(question)
        if not question.is_open:
            return CardAnswer(closed_text(question), clear_buttons=question.message_id is not None)
        refusal = await self._may_answer(question, press.chat_id, press.user_id)
        if refusal is not None:
            return self._refused(press, "not one who may answer", CardAnswer(refusal, alert=True))
        outcome = await self._desk.answer(
            question.id, question.options[press.option], press.option, press.user_id, press.user_name
        )
        if not outcome.counted:
            return CardAnswer(closed_text(outcome.question), alert=True)
        if question.kind is QuestionKind.TOPUP and self._top_up is not None:
            return CardAnswer(await self._top_up(press.chat_id, press.user_id, press.user_name))
        return CardAnswer(f"Answered: {_short(question.options[press.option])}.")

    async def reply(self, message: InboundMessage) -> bool:
        """A reply to an open question without options answers it, if its writer may; True when it did."""
        if message.reply_to is None or message.sender_id is None or not message.text.strip():
            return False
        question = await self._desk.store.by_message(message.chat_id, message.reply_to)
        if question is None or question.options or not (await self._still_asked(question)).is_open:
            return False
        if await self._may_answer(question, message.chat_id, message.sender_id) is not None:
            log.info("question_reply_refused", question_id=question.id, user_id=message.sender_id)
            return False
        text = message.text.strip()[:MAX_REPLY_ANSWER_CHARS]
        outcome = await self._desk.answer(question.id, text, None, message.sender_id, message.sender_name)
        return outcome.counted

    async def _still_asked(self, question: Question) -> Question:
        """The question as it stands; one past its time, or whose run has ended (its container died, the bot
        stopped meanwhile), is closed now, since nobody is left to take its answer."""
        if not question.is_open:
            return question
        if question.expires_at < time.time():  # its waiter is gone (a restart): past its time all the same
            await self._desk.close(question.id, QuestionStatus.EXPIRED, "no answer in time")
            return await self._desk.store.get(question.id) or question
        if question.run_id is None:
            return question
        run = await self._runs.get(question.run_id)
        if run is not None and run.status in FINAL_STATUSES:
            await self._desk.close(question.id, QuestionStatus.ENDED, f"its run ended ({run.status.replace('_', ' ')})")
            return await self._desk.store.get(question.id) or question
        return question

    async def _may_answer(self, question: Question, chat_id: int, user_id: int) -> str | None:
        """None if this user may answer; else the alert that says who may."""
        askers: list[tuple[int, str]] = []
        if question.audience is Audience.ASKERS and question.run_id is not None:
            run = await self._runs.get(question.run_id)
            if run is not None and run.turn_id is not None:
                askers = await self._turns.askers(run.turn_id)
        admin = self._is_admin if question.audience is Audience.ASKERS else self._decides
        if user_id in dict(askers) or await admin(chat_id, user_id):
            return None
        if not askers:
            return "Only a chat admin can answer this."
        names = [name[:40] for _, name in askers[:MAX_NAMES_SHOWN]]
        who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        return f"Only {who} (who asked for it) or a chat admin can answer this."

    @staticmethod
    def _refused(press: CardPress, reason: str, answer: CardAnswer) -> CardAnswer:
        log.info(
            "question_press_refused",
            chat_id=press.chat_id,
            question_id=press.run_id,
            option=press.option,
            user_id=press.user_id,
            reason=reason,
        )
        return answer


def closed_text(question: Question) -> str:
    """How a closed question reads, to a presser and under the question itself."""
    if question.status is QuestionStatus.ANSWERED:
        return f"Already answered by {(question.answered_by_name or 'someone')[:40]}: {_short(question.answer or '')}."
    if question.status is QuestionStatus.EXPIRED:
        return "Nobody answered in time: this question is closed."
    return f"This question is closed ({(question.detail or 'ended')[:80]})."


def _short(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_ANSWER_CHARS else text[: MAX_SHOWN_ANSWER_CHARS - 1] + "…"
