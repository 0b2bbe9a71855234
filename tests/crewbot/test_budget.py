"""Daily allowances as a chat sees them, with the real app, real PTB against the fake Bot API, real SQLite
and a scripted model that reports its usage: /budget for everyone, set and add for chat admins and
ADMIN_USER_IDS only; the 80 % notice once; a mention with nothing left answered by a one-line notice with
no model call, its message kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from bot.budget_command import WHO_MAY
from tests.fakes.telegram_server import FakeTelegram, SentMessage
from tests.harness import GROUP_ID, make_settings, telegram_app

pytestmark = pytest.mark.timeout(60)

ALICE = 1001  # the fake's default user: a member
ADMIN = 3003  # the chat's admin
OPERATOR = 4004  # in ADMIN_USER_IDS, not the chat's admin
WAIT_SECONDS = 10.0


@dataclass
class Provider:
    """Answers every request, reporting `usage` (None: none at all)."""

    usage: RequestUsage | None = None
    calls: int = 0

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        return ModelResponse(parts=[TextPart("Sure.")], usage=self.usage or RequestUsage(unmeasured_requests=1))


TOP_UP = "Admins: add a day's top-up"  # the question under the 80 % notice (test_top_up_button_for_admins)


def spoken(tg: FakeTelegram) -> list[SentMessage]:
    return [m for m in tg.sent_messages(GROUP_ID) if not m.plain_text.startswith(TOP_UP)]


async def said(tg: FakeTelegram, count: int) -> list[str]:
    """What the bot said in the group so far (its top-up question aside), without its name before each message."""
    found = await tg.wait_until(lambda: spoken(tg) if len(spoken(tg)) >= count else None, WAIT_SECONDS)
    return [m.plain_text.removeprefix("Crew: ") for m in found]


async def test_budget_is_shown_to_everyone_and_changed_by_admins_only(tmp_path: Path) -> None:
    provider = Provider(RequestUsage(input_tokens=1000, output_tokens=200))
    async with FakeTelegram() as tg:
        tg.set_chat_admins(GROUP_ID, [ADMIN])
        settings = make_settings(
            tmp_path,
            tg,
            CHAT_DAILY_TOKENS="10000",
            ADMIN_USER_IDS=str(OPERATOR),
            LLM_PRICE_INPUT_PER_MTOK="3",
            LLM_PRICE_OUTPUT_PER_MTOK="15",
        )
        async with telegram_app(settings, model=FunctionModel(provider)) as app:
            tg.push_message(GROUP_ID, f"@{tg.bot_username} hello")
            assert (await said(tg, 1))[-1] == "Sure."
            tg.push_message(GROUP_ID, "/budget")
            shown = (await said(tg, 2))[-1]
            day = app.allowances.today()
            assert shown == (
                f"Today ({day}) this chat used 1,200 LLM tokens of its daily allowance of 10,000 (12 %).\n"
                "At the prices set that is about 0.0060.\n"
                "The day resets at 00:00 (UTC)."
            )

            tg.push_message(GROUP_ID, "/budget set 50000", user_id=ALICE)
            assert (await said(tg, 3))[-1] == WHO_MAY
            tg.push_message(GROUP_ID, "/budget add 500", user_id=ALICE)
            assert (await said(tg, 4))[-1] == WHO_MAY

            tg.push_message(GROUP_ID, "/budget set 50,000", user_id=ADMIN, first_name="Ada")
            assert (await said(tg, 5))[
                -1
            ] == "This chat's daily allowance is now 50,000 tokens (today 50,000 with top-ups)."
            tg.push_message(GROUP_ID, "/budget set lots", user_id=ADMIN, first_name="Ada")
            assert (await said(tg, 6))[-1].startswith("Not a number of tokens from 0 to 1,000,000,000,000: lots.")
            tg.push_message(GROUP_ID, "/budget set 1000000000001", user_id=ADMIN, first_name="Ada")
            assert (await said(tg, 7))[-1].startswith("Not a number of tokens from 0 to 1,000,000,000,000")
            tg.push_message(GROUP_ID, "/budget add -5", user_id=ADMIN, first_name="Ada")
            assert (await said(tg, 8))[-1].startswith("Not a number of tokens from 1 to")

            tg.push_message(GROUP_ID, "/budget add 2500", user_id=OPERATOR, first_name="Op")
            assert (await said(tg, 9))[-1] == (
                "Added 2,500 tokens for today: this chat may use 52,500 today (1,200 used); "
                "tomorrow its allowance is back to 50,000."
            )
            tg.push_message(GROUP_ID, "/budget set default", user_id=OPERATOR, first_name="Op")
            reset = (await said(tg, 10))[-1]
            assert reset.startswith(
                "This chat's daily allowance is the bot's default again (CHAT_DAILY_TOKENS, 10,000)."
            )
            assert "of its daily allowance of 12,500, 2,500 of it added today (9 %)." in reset

            tg.push_message(GROUP_ID, "/budget set 0", user_id=ADMIN, first_name="Ada")
            assert "no daily allowance of its own" in (await said(tg, 11))[-1]
            tg.push_message(GROUP_ID, "/budget add 100", user_id=ADMIN, first_name="Ada")
            assert (await said(tg, 12))[-1].startswith("This chat has no daily allowance, so there is nothing to add")
            tg.push_message(GROUP_ID, "/budget")
            assert (await said(tg, 13))[-1].startswith(
                f"Today ({day}) this chat used 1,200 LLM tokens; it has no daily"
            )
    assert provider.calls == 1


async def test_eighty_percent_is_told_once_and_a_spent_chat_gets_a_notice_without_a_model_call(
    tmp_path: Path,
) -> None:
    provider = Provider(RequestUsage(input_tokens=400, output_tokens=50))  # 450 a call
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, CHAT_DAILY_TOKENS="1000")
        async with telegram_app(settings, model=FunctionModel(provider)) as app:
            tg.push_message(GROUP_ID, f"@{tg.bot_username} one")
            assert await said(tg, 1) == ["Sure."]
            tg.push_message(GROUP_ID, f"@{tg.bot_username} two")  # 900 of 1,000: past 80 %
            told = await said(tg, 3)
            eighty = (
                "This chat has used 900 of its 1,000 LLM tokens for today (90 %); the allowance resets at "
                "00:00 (UTC). /budget shows more."
            )
            assert sorted(told[1:]) == sorted(["Sure.", eighty])
            tg.push_message(GROUP_ID, f"@{tg.bot_username} three")  # 100 left: it takes them, uses 450
            assert (await said(tg, 4))[-1] == "Sure."

            update = tg.push_message(GROUP_ID, f"@{tg.bot_username} four?")
            await said(tg, 5)
            refused = spoken(tg)[-1]
            assert refused.plain_text.removeprefix("Crew: ") == (
                "This chat's daily allowance of 1,000 tokens is used up for today; it resets at 00:00 (UTC)."
            )
            assert refused.reply_to_message_id == update["message"]["message_id"]
            await app.wait_quiet(GROUP_ID)
            stored = await app.stores.messages.recent(GROUP_ID, 50)
            status = await app.allowances.status(GROUP_ID)
    assert provider.calls == 3  # none for the fourth
    assert [m.content for m in stored if not m.is_bot][-1] == f"@{tg.bot_username} four?"  # kept in history
    assert [m.content for m in stored if m.is_bot].count(eighty) == 1  # told once
    assert status.used == 1350  # 350 over: the one call that took the last 100, no more


async def test_a_provider_reporting_no_usage_is_estimated_and_budget_says_so(tmp_path: Path) -> None:
    provider = Provider(None)
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg), model=FunctionModel(provider)):
        tg.push_message(GROUP_ID, f"@{tg.bot_username} hello")
        await said(tg, 1)
        tg.push_message(GROUP_ID, "/budget")
        shown = (await said(tg, 2))[-1]
    assert "it has no daily allowance." in shown
    assert "1 call(s) reported no usage: those are estimated from their size." in shown


async def test_top_up_button_for_admins(tmp_path: Path) -> None:
    """The 80 % notice comes with a day's top-up for the chat's admins: a member's tap is refused with an alert,
    an admin's adds the day's allowance once (stored first), a second tap is told it was done."""
    provider = Provider(RequestUsage(input_tokens=800, output_tokens=50))
    async with FakeTelegram() as tg:
        tg.set_chat_admins(GROUP_ID, [ADMIN])
        settings = make_settings(tmp_path, tg, CHAT_DAILY_TOKENS="1000")
        async with telegram_app(settings, model=FunctionModel(provider)) as app:
            tg.push_message(GROUP_ID, f"@{tg.bot_username} one")  # 850 of 1,000: past 80 %

            def offered() -> SentMessage | None:
                return next((m for m in tg.sent_messages(GROUP_ID) if m.plain_text.startswith(TOP_UP)), None)

            question = await tg.wait_until(offered, WAIT_SECONDS)
            assert question.plain_text == "Admins: add a day's top-up (1,000 tokens) for today?"
            # The offer ends with the day it is for, at the latest (a tap after the reset must not top up the next).
            query = "SELECT expires_at FROM questions WHERE kind = 'topup'"
            async with app.stores.db.conn.execute(query) as cursor:
                [(expires_at,)] = list(await cursor.fetchall())
            assert expires_at <= (await app.allowances.status(GROUP_ID)).resets_at
            [button] = tg.buttons(GROUP_ID, question.message_id)
            assert button["text"] == "Add a day's top-up"
            member = await tg.wait_for_answer(
                tg.push_callback_query(GROUP_ID, question.message_id, button["callback_data"])
            )
            assert member.show_alert and member.text == "Only a chat admin can answer this."
            assert (await app.allowances.status(GROUP_ID)).allowance == 1000
            admin = await tg.wait_for_answer(
                tg.push_callback_query(GROUP_ID, question.message_id, button["callback_data"], user_id=ADMIN)
            )
            assert admin.text is not None and admin.text.startswith("Added 1,000 tokens for today")
            again = await tg.wait_for_answer(
                tg.push_callback_query(GROUP_ID, question.message_id, button["callback_data"], user_id=ADMIN)
            )
            assert again.text is not None and again.text.startswith("Already answered by")
            status = await app.allowances.status(GROUP_ID)
    assert (status.allowance, status.added) == (2000, 1000)
