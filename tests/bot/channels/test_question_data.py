"""A question's button data: "q:<question id>:<option>", nothing else; data the bot never made is read as
nothing (the press is answered "does nothing"), whatever its shape."""

from __future__ import annotations

import pytest

from bot.channels.buttons import CardAction, CardButton
from bot.channels.telegram_cards import callback_data, parse_data


def test_a_questions_button_names_its_question_and_option() -> None:
    data = callback_data(CardButton(CardAction.ANSWER, "Ab3_-xYz9QwE", "b.txt", option=1))
    assert data == "q:Ab3_-xYz9QwE:1"
    assert parse_data(data) == (CardAction.ANSWER, "Ab3_-xYz9QwE", 1)
    assert parse_data("c:run-123456") == (CardAction.CANCEL, "run-123456", None)


@pytest.mark.parametrize(
    "data",
    [
        "q:Ab3_-xYz9QwE",  # no option
        "q:Ab3_-xYz9QwE:",
        "q:Ab3_-xYz9QwE:-1",
        "q:Ab3_-xYz9QwE:100",  # more digits than any question has options
        "q:Ab3_-xYz9QwE:１",  # a digit, but not an ASCII one
        "q:Ab3_-xYz9QwE:1:2",
        "q::1",
        "q:a b:1",
        "q:" + "A" * 70 + ":1",  # over 64 bytes
        "x:Ab3_-xYz9QwE:1",
    ],
)
def test_data_the_bot_never_made_names_nothing(data: str) -> None:
    assert parse_data(data) is None
