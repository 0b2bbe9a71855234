"""What pressing a status card's button does: every press is decided again from the store, never from the
button, so a forged, replayed or stale one does nothing.

A button names an action and a run. The run must be one of the chat the card is in; the presser must be
one who asked for the run's turn, an admin of the chat, or in ADMIN_USER_IDS (the check /cancel and the main
agent use: `is_admin`); anyone else gets an alert saying who may, and nothing changes. Cancel ends one run,
Cancel all every live run of the card's turn. A run that has already ended is said to have; a card whose
runs have all ended (one from before a restart, say) loses its buttons.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum

from bot.channels.buttons import CardAction, CardAnswer, CardPress
from bot.ports.runs import RunCancels
from bot.question_presses import QuestionPresses
from core.logging import get_logger
from core.store.runs import FINAL_STATUSES, LIVE_STATUSES, RunRecord, RunStatus, RunStore
from core.store.turns import TurnStore

log = get_logger(__name__)

AdminCheck = Callable[[int, int], Awaitable[bool]]  # (chat id, user id): an admin of that chat, or an operator


class StopOutcome(StrEnum):
    """What a Stop press did to the turn it named."""

    STOPPED = "stopped"
    ANSWERED = "answered"  # its answer is complete and on its way: nothing left to stop
    NOT_WRITING = "not_writing"  # not the chat's turn in flight (finished, stopped, from before a restart)


# (chat id, turn id, who): stop that turn if it is the chat's turn in flight and still answering
TurnStop = Callable[[int, str, str], StopOutcome]
NO_SUCH_RUN = "No such run in this chat. /subagents lists them."
NOT_WRITING = "This answer is not being written any more."
ANSWERED = "This answer is already complete: it is being sent."
MAX_NAMES_SHOWN = 3  # of the people who asked, in a refusal


class CardPresses:
    def __init__(
        self,
        runs: RunStore,
        turns: TurnStore,
        control: RunCancels | None,
        is_admin: AdminCheck,
        stop: TurnStop | None = None,
        writing: Callable[[int, int], str | None] | None = None,
        questions: QuestionPresses | None = None,
    ) -> None:
        self._runs = runs
        self._turns = turns
        self._control = control  # None: no subagents in this process
        self._is_admin = is_admin
        self._stop = stop
        self._writing = writing  # (chat id, message id): the turn writing into that message now (LiveReplies)
        self.questions = questions  # a question's buttons (ask_chat, the door's hosts, approvals, top-ups)

    async def press(self, press: CardPress) -> CardAnswer:
        if press.action is CardAction.STOP:
            return await self._stop_turn(press)
        if press.action is CardAction.ANSWER:
            if self.questions is None:
                return CardAnswer(NO_SUCH_RUN)
            return await self.questions.press(press)
        run = await self._runs.get(press.run_id)
        if run is None or run.chat_id != press.chat_id or self._control is None:
            # Another chat's run does not exist for this one: the answer says no more than for none at all.
            self._refused(press, "no such run in this chat")
            return CardAnswer(NO_SUCH_RUN)
        askers = await self._turns.askers(run.turn_id) if run.turn_id is not None else []
        if press.user_id not in dict(askers) and not await self._is_admin(press.chat_id, press.user_id):
            self._refused(press, "neither the asker nor an admin")
            return CardAnswer(_who_may(askers, "cancel this run"), alert=True)
        if press.action is CardAction.CANCEL_ALL and run.turn_id is not None:
            return await self._cancel_turn(press, run.turn_id)
        return await self._cancel_run(press, run)

    async def _stop_turn(self, press: CardPress) -> CardAnswer:
        """A growing answer's Stop: its turn (the button names it) must be of this chat, the presser one who
        asked or an admin; a turn no longer in flight (finished, stopped, from before a restart) loses it."""
        turn_id = press.run_id
        if await self._turns.chat_of(turn_id) != press.chat_id:
            # Forged or another chat's: the message pressed may be anything of the bot's (a card with live
            # buttons), so it is left as it is.
            self._refused(press, "no such answer in this chat")
            return CardAnswer(NOT_WRITING)
        if self._writing is not None and press.message_id is not None:
            # A merged or restarted turn's message shows the old turn's button until the new turn writes it.
            turn_id = self._writing(press.chat_id, press.message_id) or turn_id
        askers = await self._turns.askers(turn_id)
        if press.user_id not in dict(askers) and not await self._is_admin(press.chat_id, press.user_id):
            self._refused(press, "neither the asker nor an admin")
            return CardAnswer(_who_may(askers, "stop this answer"), alert=True)
        outcome = self._stop(press.chat_id, turn_id, press.user_name) if self._stop else StopOutcome.NOT_WRITING
        if outcome is StopOutcome.ANSWERED:  # its final text, without the button, is on its way
            return CardAnswer(ANSWERED)
        if outcome is StopOutcome.NOT_WRITING:
            # An alert, not a passing toast: the presser expected the answer to stop (one from before a restart
            # is finished or answered into by the start: bot/agent/live_restart.py).
            return CardAnswer(NOT_WRITING, alert=True, clear_buttons=True)
        log.info("answer_stopped", chat_id=press.chat_id, turn_id=turn_id, user_id=press.user_id)
        return CardAnswer("Stopped.")

    async def _cancel_run(self, press: CardPress, run: RunRecord) -> CardAnswer:
        if run.status in FINAL_STATUSES:
            return CardAnswer(
                f"{run.label} had already ended ({_status(run.status)}).", clear_buttons=await self._all_ended(run)
            )
        assert self._control is not None  # checked in press()
        outcome = await self._control.cancel_run(press.chat_id, run.id)
        log.info("card_cancelled_run", chat_id=press.chat_id, run_id=run.id, user_id=press.user_id, outcome=outcome)
        if outcome is RunStatus.CANCELLED:
            return CardAnswer(f"Cancelled {run.label}.")
        return CardAnswer(
            f"{run.label} had already ended ({_status(outcome)}).", clear_buttons=await self._all_ended(run)
        )

    async def _cancel_turn(self, press: CardPress, turn_id: str) -> CardAnswer:
        live = [r for r in await self._runs.for_turn(turn_id) if r.status in LIVE_STATUSES]
        if not live:
            return CardAnswer("Every run of this card had already ended.", clear_buttons=True)
        assert self._control is not None  # checked in press()
        count = await self._control.cancel_turn(turn_id, f"cancelled from the status card by {press.user_name}")
        log.info("card_cancelled_turn", chat_id=press.chat_id, turn_id=turn_id, user_id=press.user_id, count=count)
        return CardAnswer(f"Cancelled {count} run(s)." if count else "Every run of this card had already ended.")

    async def _all_ended(self, run: RunRecord) -> bool:
        """Whether the card of the run's turn has nothing live left to press for."""
        if run.turn_id is None:
            return True
        return all(r.status in FINAL_STATUSES for r in await self._runs.for_turn(run.turn_id))

    @staticmethod
    def _refused(press: CardPress, reason: str) -> None:
        log.info(
            "card_press_refused",
            chat_id=press.chat_id,
            run_id=press.run_id,
            action=str(press.action),
            user_id=press.user_id,
            reason=reason,
        )


def _status(status: str | None) -> str:
    return str(status or "unknown").replace("_", " ")


def _who_may(askers: list[tuple[int, str]], what: str) -> str:
    """The alert for anyone else: who may do `what` (at most 200 characters, Telegram's limit)."""
    if not askers:
        return f"Only a chat admin can {what}."
    names = [name[:40] for _, name in askers[:MAX_NAMES_SHOWN]]
    if len(askers) > MAX_NAMES_SHOWN:
        names.append("others")
    who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"Only {who} (who asked for it) or a chat admin can {what}."
