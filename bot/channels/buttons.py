"""Buttons on the status card and presses of them, as every channel knows them.

A button names an action and the run it acts on, nothing else: whoever presses it, in whichever chat, the
bot looks the run up again and decides then (bot/card_presses.py). Telegram shows them as an inline keyboard
and delivers a press as a callback query; the console has no buttons and shows the same actions as commands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable


class CardAction(StrEnum):
    CANCEL = "cancel"  # one run
    CANCEL_ALL = "cancel_all"  # every live run of the card's turn
    STOP = "stop"  # a growing answer's turn (its `run_id` names the turn): the model call and its runs
    ANSWER = "answer"  # a question to the chat (its `run_id` names the question, `option` the choice)


@dataclass(frozen=True, slots=True)
class CardButton:
    action: CardAction
    run_id: str  # the run it acts on; for CANCEL_ALL any run of the card, whose turn is meant
    label: str  # what the button says
    option: int | None = None  # ANSWER: which of the question's options


@dataclass(frozen=True, slots=True)
class CardPress:
    """Someone pressed a card's button: who, where, and what the button named (the run is looked up anew)."""

    chat_id: int  # the conversation the card is in (a whole chat, or one forum topic)
    chat_kind: str
    user_id: int
    user_name: str
    action: CardAction
    run_id: str
    press_id: str  # the platform's id of the press (Telegram's callback query id), for the log
    message_id: int | None = None  # the card's platform message id
    platform_chat_id: int | None = None  # the platform's chat id when it is not `chat_id` (topics, upgrades)
    option: int | None = None  # ANSWER: the option the button named (checked against the stored question)

    @property
    def platform_id(self) -> int:
        return self.chat_id if self.platform_chat_id is None else self.platform_chat_id


@dataclass(frozen=True, slots=True)
class CardAnswer:
    """What the presser is told: a short note, or an alert they must dismiss (a refusal)."""

    text: str = ""
    alert: bool = False
    clear_buttons: bool = False  # the card's buttons act on nothing live any more: take them off it


# Decides and acts on a press; its answer is shown to the presser alone.
PressHandler = Callable[[CardPress], Awaitable[CardAnswer]]


@runtime_checkable
class PressChannel(Protocol):
    """A channel whose cards have buttons people press (Telegram)."""

    def on_press(self, handler: PressHandler) -> None:
        """Hand every press to `handler` from now on; until then a press is answered as doing nothing."""
