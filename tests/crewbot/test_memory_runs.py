"""Memory and subagent runs end to end (the rig of tests/crewbot/memory_rig.py): a run is handed the chat's notes
(never a member's) and only proposes new ones, and /forgetme leaves no copy of an erased note in the runs that
were handed it: not in their stored task, their record on disk, or the session they handed back."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.agent.memory import PROPOSE
from tests.crewbot.memory_rig import ALICE, BOB, rig

pytestmark = pytest.mark.timeout(90)


async def test_forgetme_leaves_no_copy_in_the_runs_that_were_handed_the_members_note(tmp_path: Path) -> None:
    secret = b"Alice-private-fact-7f3a"
    async with rig(tmp_path) as r:
        r.script.plans.append([("remember", {"text": "Alice-private-fact-7f3a: her new address is 12 Elm St"})])
        r.say(ALICE, "Alice", "remember my new address")
        await r.next_reply()
        r.script.plans.append([("spawn_subagent", {"task": "summarise the thread", "label": "summary"})])
        r.say(BOB, "Bob", "summarise the thread please")
        await r.next_reply()
        await r.next_reply()  # the run's result
        (handed,) = r.tasks
        assert secret.decode() in handed  # the run was handed the note
        data = Path(r.app.stores.db.path).parent

        r.command(ALICE, "Alice", "/forgetme")
        assert "Erased 1 note(s)" in await r.next_reply()
        await r.app.stores.db.flush_erased()
        assert secret not in r.raw_bytes()  # neither `notes` nor the run's stored task holds it
        (task,) = await r.stored("SELECT task FROM subagent_runs")
        assert task == ("summarise the thread",)
        files = [p for p in data.rglob("*") if p.is_file() and p.suffix == ".json"]
        assert any("sessions" in p.parts for p in files) and any(p.name == "task.json" for p in files)
        assert not [p for p in files if secret in p.read_bytes()]  # its record and its saved session neither


async def test_subagents_get_the_chats_notes_and_only_propose_new_ones(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.script.plans.append(
            [
                ("remember", {"text": "The picnic is on Saturday"}),
                ("remember_about", {"user": "Alice", "text": "Alice-private-allergy-peanuts"}),
            ]
        )
        r.say(ALICE, "Alice", "picnic Saturday; I'm allergic to peanuts")
        await r.next_reply()
        r.script.plans.append([("spawn_subagent", {"task": "plan the picnic", "label": "picnic"})])

        r.say(ALICE, "Alice", "plan the picnic please")
        await r.next_reply()
        result = await r.next_reply()

        (task,) = r.tasks
        assert task.startswith("plan the picnic") and '"The picnic is on Saturday"' in task and PROPOSE in task
        (stored,) = await r.stored("SELECT task FROM subagent_runs")
        assert stored == ("plan the picnic",)  # the notes are handed to the run, never stored with it
        assert "peanuts" not in task  # a member's notes are for the main agent only
        assert "[remember] picnic moved to Sunday" in result
        assert ("picnic moved to Sunday",) not in await r.stored("SELECT text FROM notes")
        r.say(BOB, "Bob", "so when is it?")
        await r.next_reply()
        assert "[remember] picnic moved to Sunday" in r.script.prompts[-1]  # the main agent decides
        assert len(await r.stored("SELECT id FROM notes")) == 2
