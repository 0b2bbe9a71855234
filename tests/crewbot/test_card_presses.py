"""The status card's buttons, pressed: the whole app (real PTB against the fake Bot API, real store, engine,
main agent, status card and subagent service on the in-memory container runtime). Whoever asked for the run,
a chat admin or an operator (ADMIN_USER_IDS) cancels it with a tap and its container goes; anyone else is
told who may, and nothing changes; forged, replayed, foreign and stale presses do nothing; every press is
answered. The same with Docker: tests/crewbot/test_card_presses_docker.py."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup

from bot.agent.offline import prompt_text
from bot.channels.telegram import TelegramChannel
from bot.status_card import StatusCards
from container.channel import RunChannel
from core.delivery import Delivery
from core.store.runs import RunRecord, RunStatus
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from crewbot.app import App
from crewbot.serve import ObservedSubagents, unguarded
from runner.service import SubagentService
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.fakes.telegram_server import CallbackAnswer, FakeTelegram
from tests.harness import GROUP_ID, POLL_TIMEOUT_SECONDS, make_settings
from tests.runner.lifecycle_helpers import socket_of

pytestmark = pytest.mark.timeout(60)

ASKER, OUTSIDER, ADMIN, OPERATOR = 7001, 7002, 7003, 7004
OTHER_GROUP = -1002  # allowed too
STRANGE_GROUP = -1003  # not allowed
WAIT_SECONDS = 10.0
CARD = "Subagents of this request"


async def works_until_killed(container: MemoryContainer) -> int | None:
    async with RunChannel(socket_of(container)) as channel:
        await channel.task()
        await asyncio.Event().wait()
    return None


def spawning_model() -> FunctionModel:
    """Spawns a run for each name after "work on" in the newest message (once each), then says what the
    tool returned."""
    spawned: set[str] = set()

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(" ".join(str(p.content) for p in returns))])
        found = re.findall(r"work on ([\w ,]+)", prompt_text(messages))
        names = [n.strip() for n in found[-1].split(",")] if found else []
        fresh = [n for n in names if n and n not in spawned]
        spawned.update(fresh)
        if not fresh:
            return ModelResponse(parts=[TextPart("noted")])
        calls = [
            ToolCallPart("spawn_subagent", {"task": name, "label": name, "include_context": False}, tool_call_id=name)
            for name in fresh
        ]
        return ModelResponse(parts=list(calls))

    return FunctionModel(respond)


@dataclass
class Rig:
    app: App
    service: SubagentService
    runtime: MemoryRuntime
    tg: FakeTelegram

    def ask(self, user_id: int, name: str, text: str) -> None:
        self.tg.push_message(GROUP_ID, f"@{self.tg.bot_username} {text}", user_id=user_id, first_name=name)

    async def card_with(self, count: int) -> int:
        """The card of the newest turn, once it shows `count` live runs' Cancel buttons."""

        def ready() -> int | None:
            cards = [m.message_id for m in self.tg.sent_messages(GROUP_ID) if m.plain_text.startswith(CARD)]
            cancels = (
                [b for b in self.tg.buttons(GROUP_ID, cards[-1]) if b["callback_data"][:2] == "c:"] if cards else []
            )
            return cards[-1] if len(cancels) == count else None

        return await self.tg.wait_until(ready, WAIT_SECONDS)

    def buttons(self, card: int) -> dict[str, str]:
        """The card's buttons now: label -> callback_data."""
        return {b["text"]: b["callback_data"] for b in self.tg.buttons(GROUP_ID, card)}

    async def press(
        self, user_id: int, data: str | bytes, card: int, *, chat_id: int = GROUP_ID, name: str = "Someone"
    ) -> CallbackAnswer:
        query = self.tg.push_callback_query(chat_id, card, data, user_id=user_id, first_name=name)
        return await self.tg.wait_for_answer(query, WAIT_SECONDS)

    async def run(self, label: str) -> RunRecord:
        [record] = [r for r in await self.service.runs.for_chat(GROUP_ID, 50) if r.label == label]
        return record

    async def until_running(self, label: str) -> RunRecord:
        """The run, once it runs in its container."""
        async with asyncio.timeout(WAIT_SECONDS):
            while True:  # the store has no change events
                record = await self.run(label)
                if record.status == RunStatus.RUNNING and record.container_id is not None:
                    return record
                await asyncio.sleep(0.02)

    async def until_gone(self, record: RunRecord) -> None:
        """The run's container was killed and removed."""
        await self.until(lambda: record.container_id in self.runtime.removed)
        assert record.container_id in self.runtime.kills

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_SECONDS):
            while True:  # nor the runtime's lists
                if check():
                    return
                await asyncio.sleep(0.02)


@pytest.fixture(autouse=True)
def quick_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's cards edit at most every 0.05 s here (3 s in a group): the tests wait for their edits."""
    defaults = StatusCards.__init__.__kwdefaults__
    assert defaults is not None
    monkeypatch.setitem(defaults, "interval_seconds", 0.05)


@asynccontextmanager
async def rig(tmp_path: Path, **settings: Any) -> AsyncIterator[Rig]:
    async with FakeTelegram() as tg:
        for chat in (GROUP_ID, OTHER_GROUP, STRANGE_GROUP):
            tg.add_chat(chat, title=f"chat {chat}")
        tg.set_chat_admins(GROUP_ID, [ADMIN])
        tg.set_chat_admins(OTHER_GROUP, [OUTSIDER])  # an admin elsewhere is no admin here
        config = make_settings(
            tmp_path / "data",
            tg,
            ALLOWED_CHAT_IDS=f"{GROUP_ID},{OTHER_GROUP},{ASKER}",  # the asker's private chat too
            ADMIN_USER_IDS=str(OPERATOR),
            STATUS_CARD="true",
            **settings,
        )
        stores = await Stores.open(config)
        runtime = MemoryRuntime(on_start=works_until_killed)
        built: list[SubagentService] = []

        def factory(delivery: Delivery, typing: TypingIndicator) -> ObservedSubagents:
            built.append(SubagentService(config, stores, delivery, typing, runtime))
            return unguarded(config, stores, built[0])

        assert config.telegram_bot_token is not None
        channel = TelegramChannel(
            config.telegram_bot_token.get_secret_value(), tg.base_url, poll_timeout_seconds=POLL_TIMEOUT_SECONDS
        )
        app = App(config, channel, stores, factory, model=spawning_model())
        await app.start()
        try:
            yield Rig(app, built[0], runtime, tg)
        finally:
            await app.stop()
            await runtime.stop_behaviours()


async def test_the_askers_tap_cancels_the_run_and_its_button_goes(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.ask(ASKER, "Ann", "work on build, docs")
        card = await r.card_with(2)
        build = await r.until_running("build")
        docs = await r.until_running("docs")
        buttons = r.buttons(card)
        assert buttons.pop("Cancel all") in (f"a:{build.id}", f"a:{docs.id}")  # names a run of the card
        assert buttons == {"Cancel build": f"c:{build.id}", "Cancel docs": f"c:{docs.id}"}

        answer = await r.press(ASKER, r.buttons(card)["Cancel build"], card, name="Ann")

        assert (answer.text, answer.show_alert) == ("Cancelled build.", False)
        assert (await r.run("build")).status == RunStatus.CANCELLED
        await r.until_gone(build)
        await r.card_with(1)  # the line shows it cancelled; its button went with that edit
        assert list(r.buttons(card)) == ["Cancel docs"]
        assert "build: cancelled" in str((r.tg.message(GROUP_ID, card) or {})["text"])
        assert (await r.run("docs")).status == RunStatus.RUNNING


async def test_an_outsiders_tap_gets_an_alert_and_changes_nothing(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.ask(ASKER, "Ann", "work on build")
        card = await r.card_with(1)
        build = await r.until_running("build")
        await r.until(lambda: "build: running" in str((r.tg.message(GROUP_ID, card) or {})["text"]))
        await asyncio.sleep(0.3)  # the card has settled
        before = (r.tg.message(GROUP_ID, card), r.tg.call_count("editMessageText"))

        answer = await r.press(OUTSIDER, f"c:{build.id}", card, name="Mallory")
        all_answer = await r.press(OUTSIDER, f"a:{build.id}", card, name="Mallory")

        for refused in (answer, all_answer):
            assert refused.show_alert
            assert refused.text == "Only Ann (who asked for it) or a chat admin can cancel this run."
        await asyncio.sleep(0.3)
        assert (await r.run("build")).status == RunStatus.RUNNING
        assert r.runtime.kills == []
        assert (r.tg.message(GROUP_ID, card), r.tg.call_count("editMessageText")) == before
        assert r.tg.call_count("editMessageReplyMarkup") == 0


async def test_chat_admins_and_operators_may_cancel_and_cancel_all_takes_the_queued_too(tmp_path: Path) -> None:
    async with rig(tmp_path, MAX_SUBAGENTS_PER_CHAT=1) as r:
        r.ask(ASKER, "Ann", "work on build, docs")
        card = await r.card_with(2)
        async with asyncio.timeout(WAIT_SECONDS):
            while True:  # one runs, the other waits for the chat's only slot (in either order)
                runs = {run.status: run for run in [await r.run("build"), await r.run("docs")]}
                if set(runs) == {RunStatus.RUNNING, RunStatus.QUEUED} and runs[RunStatus.RUNNING].container_id:
                    break
                await asyncio.sleep(0.02)
        running, queued = runs[RunStatus.RUNNING], runs[RunStatus.QUEUED]  # a queued run has its button too

        answer = await r.press(ADMIN, r.buttons(card)["Cancel all"], card, name="Ada")

        assert (answer.text, answer.show_alert) == ("Cancelled 2 run(s).", False)
        assert (await r.run(queued.label)).status == RunStatus.CANCELLED
        await r.until_gone(running)
        await r.until(lambda: r.buttons(card) == {})
        assert (await r.run(running.label)).error == "cancelled: cancelled from the status card by Ada"

        r.ask(ASKER, "Ann", "work on tests")
        second = await r.card_with(1)
        assert second != card
        tests = await r.until_running("tests")
        answer = await r.press(OPERATOR, f"c:{tests.id}", second, name="Op")  # ADMIN_USER_IDS, no chat admin
        assert answer.text == "Cancelled tests." and not answer.show_alert
        await r.until_gone(tests)


async def test_forged_foreign_replayed_and_stale_presses_do_nothing_and_all_are_answered(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.ask(ASKER, "Ann", "work on build")
        card = await r.card_with(1)
        build = await r.until_running("build")
        data = f"c:{build.id}"

        # A press in a chat the bot does not work in, and one in another chat of its naming this chat's run.
        strange = await r.press(ASKER, data, card, chat_id=STRANGE_GROUP)
        assert strange.text == "This chat is not enabled for Crew." and not strange.show_alert
        foreign = await r.press(OUTSIDER, data, card, chat_id=OTHER_GROUP)  # an admin there
        assert foreign.text == "No such run in this chat. /subagents lists them."
        # 64 random bytes, data of a shape the bot never makes, a run that never was.
        for forged in (secrets.token_bytes(64), "c:" + "x" * 62 + "é", "cancel:" + build.id, "c:", "c:../../x"):
            assert (await r.press(ASKER, forged, card)).text == "This button does nothing (any more)."
        assert (await r.press(ASKER, "c:feedfacecafe", card)).text == "No such run in this chat. /subagents lists them."
        assert (await r.run("build")).status == RunStatus.RUNNING and r.runtime.kills == []

        # Pressed twice quickly: both answered, the run cancelled once.
        first = r.tg.push_callback_query(GROUP_ID, card, data, user_id=ASKER)
        second = r.tg.push_callback_query(GROUP_ID, card, data, user_id=ASKER)
        answers = [await r.tg.wait_for_answer(q, WAIT_SECONDS) for q in (first, second)]
        assert [a.text for a in answers] == ["Cancelled build.", "build had already ended (cancelled)."]
        await r.until_gone(build)
        # Replayed: the same callback query delivered again is answered by no one (Telegram takes one
        # answer) and does nothing.
        message = r.tg.message(GROUP_ID, card)
        r.tg.push_raw_update(
            {
                "callback_query": {
                    "id": first,
                    "from": {"id": ASKER, "is_bot": False, "first_name": "Ann"},
                    "message": message,
                    "chat_instance": "1",
                    "data": data,
                }
            }
        )
        await r.tg.wait_until(lambda: True if not r.tg.pending_updates() else None, WAIT_SECONDS)
        assert len(r.tg.callback_answers(first)) == 1

        # A card from before a restart: its buttons name a run that has ended. They go when pressed.
        async with Bot(r.tg.token, base_url=r.tg.base_url) as bot:
            markup = InlineKeyboardMarkup([[InlineKeyboardButton("Cancel build", callback_data=data)]])
            old = await bot.send_message(GROUP_ID, f"{CARD}:\n• build: running", reply_markup=markup)
        stale = await r.press(ASKER, data, old.message_id)
        assert stale.text == "build had already ended (cancelled)."
        await r.until(lambda: r.tg.buttons(GROUP_ID, old.message_id) == [])
        older = r.tg.push_callback_query(GROUP_ID, old.message_id, data, user_id=ASKER, inaccessible=True)
        assert (await r.tg.wait_for_answer(older, WAIT_SECONDS)).text == "build had already ended (cancelled)."

        assert r.tg.unanswered_queries() == []  # no spinner left turning
        assert set(r.runtime.kills) == {build.container_id}  # (killed at once, then again by its supervisor)
