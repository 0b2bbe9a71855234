"""The console has nothing to press: a question's buttons are printed as `/answer <question id> <n>` lines, and
such a line is handed to the press handler as that button's press (decided there, as any press)."""

from __future__ import annotations

import io

from bot.channels.buttons import CardAction, CardAnswer, CardButton, CardPress
from bot.channels.console import ConsoleChannel, card_text
from bot.channels.inbound import InboundMessage


async def _ignore(message: InboundMessage) -> None:
    return None


def test_a_questions_buttons_print_as_answer_commands() -> None:
    buttons = [CardButton(CardAction.ANSWER, "q1w2e3r4t5y6", label, option=i) for i, label in enumerate("ab")]
    assert card_text("Which?", buttons).splitlines() == [
        "Which?",
        "  /answer q1w2e3r4t5y6 1 – a",
        "  /answer q1w2e3r4t5y6 2 – b",
    ]


def test_a_subagents_question_cannot_send_the_terminal_escapes() -> None:
    # A question, its options and a run's label are a subagent's words: no escape sequence reaches the terminal.
    evil = "\x1b]0;owned\x07\x1b[2J\x1b[1A"
    buttons = [
        CardButton(CardAction.ANSWER, "q1w2e3r4t5y6", f"yes{evil}", option=0),
        CardButton(CardAction.CANCEL, "run1", f"Cancel build{evil}"),
    ]
    shown = card_text(f"Which{evil}?\nline two", buttons)
    assert not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in shown)
    assert shown.splitlines() == [
        "Which]0;owned[2J[1A?",
        "line two",
        "  /answer q1w2e3r4t5y6 1 – yes]0;owned[2J[1A",
        "  /cancel run1 – Cancel build]0;owned[2J[1A",
    ]


async def test_an_answer_line_is_that_buttons_press() -> None:
    out = io.StringIO()
    channel = ConsoleChannel(
        "Crew", user_name="me", stdin=io.StringIO("/answer q1w2e3r4t5y6 2\n/answer x\n"), stdout=out
    )
    pressed: list[CardPress] = []

    async def handler(press: CardPress) -> CardAnswer:
        pressed.append(press)
        return CardAnswer("Answered: b.")

    channel.on_press(handler)
    await channel.start(_ignore)
    await channel.eof.wait()
    await channel.stop()
    [press] = pressed
    assert (press.action, press.run_id, press.option, press.chat_kind) == (
        CardAction.ANSWER,
        "q1w2e3r4t5y6",
        1,
        "console",
    )
    assert "(Answered: b.)" in out.getvalue()
    assert "(usage: /answer <question id> <option number>)" in out.getvalue()
