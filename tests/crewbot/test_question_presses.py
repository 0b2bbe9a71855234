"""Questions' buttons, pressed, through the whole app (real PTB against the fake Bot API, the in-memory runtime):
with SUBAGENT_APPROVAL=admins a run waits on its card as awaiting approval; only a chat admin or an operator
approves it (its asker is told who may), two admins at once count once, and forged, replayed, cross-chat and
out-of-range presses change nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.store.questions import QuestionKind, QuestionStatus
from core.store.runs import RunStatus
from tests.crewbot.test_card_presses import ADMIN, ASKER, OPERATOR, OTHER_GROUP, OUTSIDER, Rig, rig

pytestmark = pytest.mark.timeout(60)

NOTHING = "This button does nothing (any more)."


async def approval_buttons(r: Rig, label: str) -> tuple[int, str, str]:
    """The card showing the run awaiting approval, and its Approve and Deny data."""

    def ready() -> tuple[int, str, str] | None:
        cards = [m.message_id for m in r.tg.sent_messages() if m.plain_text.startswith("Subagents of this request")]
        if not cards:
            return None
        shown = r.buttons(cards[-1])
        approve, deny = shown.get(f"Approve {label}"), shown.get(f"Deny {label}")
        return (cards[-1], approve, deny) if approve and deny else None

    return await r.tg.wait_until(ready, 10.0)


async def test_only_an_admin_approves_and_the_first_tap_counts(tmp_path: Path) -> None:
    async with rig(tmp_path, SUBAGENT_APPROVAL="admins") as r:
        r.ask(ASKER, "Alice", "work on alpha")
        card, approve, deny = await approval_buttons(r, "alpha")
        text = r.tg.message(r.app.settings.allowed_chat_ids[0], card)
        assert text is not None and "alpha: awaiting approval" in text["text"]
        assert approve.startswith("q:") and approve.endswith(":0") and deny.endswith(":1")

        refused = await r.press(ASKER, approve, card, name="Alice")
        assert refused.show_alert and refused.text == "Only a chat admin can answer this."
        stranger = await r.press(OUTSIDER, approve, card, name="Mallory")  # an admin of another chat only
        assert stranger.show_alert
        question_id = approve.split(":")[1]
        forged = [
            f"q:{'A' * len(question_id)}:0",  # no such question
            f"q:{question_id}:7",  # no such option
            f"q:{question_id}",  # no option at all
            f"q:{question_id}:0:0",
        ]
        for data in forged:
            assert (await r.press(ADMIN, data, card)).text == NOTHING
        cross_chat = await r.press(OUTSIDER, approve, card, chat_id=OTHER_GROUP, name="Mallory")
        assert cross_chat.text == NOTHING
        record = await r.run("alpha")
        assert record.status == RunStatus.QUEUED and record.container_id is None
        assert not r.runtime.started_specs

        first, second = await asyncio.gather(
            r.press(ADMIN, approve, card, name="Ada"), r.press(OPERATOR, deny, card, name="Otto")
        )
        answers = sorted([first.text or "", second.text or ""])
        counted = [a for a in answers if a.startswith("Answered: ")]
        told = [a for a in answers if a.startswith("Already answered by ")]
        assert len(counted) == 1 and len(told) == 1
        [question] = await r.app.questions.store.for_run(record.id, QuestionKind.APPROVAL)
        assert question.status is QuestionStatus.ANSWERED and question.answered_by in (ADMIN, OPERATOR)
        if question.option == 0:
            await r.until_running("alpha")
        else:
            await r.tg.wait_until(
                lambda: next((m for m in r.tg.sent_messages() if "did not start" in m.plain_text), None)
            )
        replayed = await r.press(ADMIN, approve, card, name="Ada")
        assert replayed.text is not None and replayed.text.startswith("Already answered by")


async def test_in_a_private_chat_its_user_does_not_approve_their_own_run(tmp_path: Path) -> None:
    # Telegram names no admins of a private chat; its user is no admin of the operator's bot.
    async with rig(tmp_path, SUBAGENT_APPROVAL="admins") as r:
        r.tg.push_message(ASKER, "work on alpha", user_id=ASKER, first_name="Alice")

        def shown() -> tuple[int, str] | None:
            for sent in reversed(r.tg.sent_messages(ASKER)):
                found = {b["text"]: b["callback_data"] for b in r.tg.buttons(ASKER, sent.message_id)}
                if "Approve alpha" in found:
                    return sent.message_id, found["Approve alpha"]
            return None

        card, approve = await r.tg.wait_until(shown, 10.0)
        refused = await r.press(ASKER, approve, card, chat_id=ASKER, name="Alice")

        assert refused.show_alert and refused.text == "Only a chat admin can answer this."
        [record] = [run for run in await r.service.runs.for_chat(ASKER, 10) if run.label == "alpha"]
        [question] = await r.app.questions.store.for_run(record.id, QuestionKind.APPROVAL)
        assert question.is_open and record.status == RunStatus.QUEUED
        await asyncio.sleep(0.3)
        assert not r.runtime.started_specs
