"""ask_chat end to end: a subagent in a real container asks "which file?", the question appears in the chat as a
reply to Alice's request with a button per option, a stranger's tap is refused with an alert and changes
nothing, Alice's tap is the answer the container gets; a question without options is answered by replying to
it. Fake Telegram at the edge, real PTB, real SQLite, the real engine and image."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store.questions import QuestionKind, QuestionStatus, QuestionStore
from core.store.runs import RunStatus, RunStore
from tests.fakes.telegram_server import DEFAULT_USER_ID, FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

STRANGER = 7002
WHICH = "❓ A subagent asks: Which file?"
NAME = "❓ A subagent asks: What name?"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def test_a_subagent_asks_which_file_and_gets_alices_tap(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    settings = make_settings(tmp_path, tg, STATUS_CARD="false")
    async with telegram_app(settings, with_subagents=True) as app:
        request = tg.push_message(
            GROUP_ID,
            f"@{tg.bot_username} background: ask_chat Which file? | a.txt | b.txt ;; ask_chat What name?",
        )  # from Alice

        def question(prefix: str) -> tuple[int, list[dict[str, str]]] | None:
            found = [m for m in tg.sent_messages(GROUP_ID) if m.plain_text.startswith(prefix)]
            return (found[-1].message_id, tg.buttons(GROUP_ID, found[-1].message_id)) if found else None

        asked, buttons = await tg.wait_until(lambda: question(WHICH), RUN_WAIT_SECONDS)
        sent = next(m for m in tg.sent_messages(GROUP_ID) if m.message_id == asked)
        assert sent.reply_to_message_id == request["message"]["message_id"]
        assert [b["text"] for b in buttons] == ["a.txt", "b.txt"]

        refused = await tg.wait_for_answer(
            tg.push_callback_query(GROUP_ID, asked, buttons[1]["callback_data"], user_id=STRANGER)
        )
        assert refused.show_alert and refused.text is not None and refused.text.startswith("Only Alice")
        store = QuestionStore(app.stores.db)
        [pending] = await store.open_of(QuestionKind.ASK)
        assert pending.message_id == asked  # the stranger changed nothing

        tapped = await tg.wait_for_answer(
            tg.push_callback_query(GROUP_ID, asked, buttons[1]["callback_data"], user_id=DEFAULT_USER_ID)
        )
        assert tapped.text == "Answered: b.txt." and not tapped.show_alert
        again = await tg.wait_for_answer(
            tg.push_callback_query(GROUP_ID, asked, buttons[0]["callback_data"], user_id=DEFAULT_USER_ID)
        )
        assert again.text is not None and again.text.startswith("Already answered by Alice: b.txt")

        # The second question has no options: a reply to it answers it.
        named, no_buttons = await tg.wait_until(lambda: question(NAME), RUN_WAIT_SECONDS)
        assert no_buttons == []
        tg.push_message(GROUP_ID, "Bob", reply_to_message_id=named)

        def result() -> str | None:
            done = [
                m.plain_text for m in tg.sent_messages(GROUP_ID) if "Ran 0 command(s), 2 question(s)" in m.plain_text
            ]
            return done[-1] if done else None

        text = await tg.wait_until(result, RUN_WAIT_SECONDS)
        assert "Alice answered: b.txt" in text and "Alice answered: Bob" in text
        run_id = pending.run_id
        assert run_id is not None
        record = await RunStore(app.stores.db).get(run_id)
        assert record is not None and record.status == RunStatus.COMPLETED
        first, second = await store.for_run(run_id)
        assert (first.status, first.answer, first.option, first.answered_by) == (
            QuestionStatus.ANSWERED,
            "b.txt",
            1,
            DEFAULT_USER_ID,
        )
        assert (second.status, second.answer, second.option) == (QuestionStatus.ANSWERED, "Bob", None)
        # The answered question shows its answer, without buttons.
        shown = await tg.wait_until(lambda: tg.message(GROUP_ID, asked) if tg.buttons(GROUP_ID, asked) == [] else None)
        assert "Alice: b.txt" in shown["text"]
