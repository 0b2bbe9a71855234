"""Each run's door to the web (runner/egress/door.py): opened beside its run socket when the operator allows
egress, with the rules in force at the run's start (the settings are live: a change applies to the next
run), and closed with its channel. With SUBAGENT_EGRESS=none no door listens at all. In ask mode the run's
rules add its chat's own list, and the door asks the chat about any other public host
(runner/lifecycle/egress_questions.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from container.protocol import EGRESS_SOCKET_FILE, MAX_EGRESS_ENTRIES, EgressOffer
from core.egress_rules import AllowEntry, EgressMode, EntryInvalid, IpAddress, parse_entry
from core.logging import get_logger
from core.questions import Questions
from core.settings import Settings
from core.store.runs import RunStore
from runner.egress.door import EgressDoor
from runner.egress.records import EgressRules
from runner.egress.resolve import SystemLookups, own_addresses
from runner.lifecycle.egress_log import EgressLog
from runner.lifecycle.egress_questions import EgressQuestions

log = get_logger(__name__)

BYTES_PER_MB = 1024 * 1024
OFFERED_MODES: dict[EgressMode, Literal["allowlist", "ask", "open"]] = {
    EgressMode.ALLOWLIST: "allowlist",
    EgressMode.ASK: "ask",
    EgressMode.OPEN: "open",
}


class RunDoors:
    def __init__(
        self,
        settings: Settings,
        egress_log: EgressLog,
        questions: Questions | None = None,
        runs: RunStore | None = None,
    ) -> None:
        self._settings = settings
        self._questions = questions
        self._asking = (
            EgressQuestions(settings, questions, runs) if questions is not None and runs is not None else None
        )
        self._log = egress_log
        self._doors: dict[str, EgressDoor] = {}
        self._own: frozenset[IpAddress] | None = None  # this host's addresses, found once
        self._lookups = SystemLookups()  # one pool of lookup threads; each door holds at most its share

    async def rules(self, chat_id: int | None = None) -> EgressRules | None:
        """The rules a run of the chat starting now gets (in ask mode, with the chat's own list); None: no egress."""
        s = self._settings
        if s.subagent_egress is EgressMode.NONE:
            return None
        allow = _entries(list(s.subagent_egress_allow))
        chat: list[AllowEntry] = []
        if s.subagent_egress is EgressMode.ASK and self._questions is not None and chat_id is not None:
            own = [allowed.entry for allowed in await self._questions.store.chat_allowlist(chat_id)]
            chat = [entry for entry in _entries(own) if entry not in allow]
        return EgressRules(
            mode=s.subagent_egress,
            allow=tuple(allow),
            max_bytes=s.subagent_egress_max_mb * BYTES_PER_MB,
            max_connections=s.subagent_egress_max_connections,
            chat_allow=tuple(chat),  # spares a question only: never an address the door refuses
        )

    async def open(self, run_id: str, chat_id: int, channel_dir: Path) -> EgressOffer | None:
        """Listen at the run's `egress.sock` (again, for a re-attached run); what its task says it may reach."""
        rules = await self.rules(chat_id)
        if rules is None:
            return None
        await self.close(run_id)
        if self._own is None:
            self._own = await asyncio.to_thread(own_addresses)
        door = EgressDoor(
            channel_dir / EGRESS_SOCKET_FILE,
            rules,
            on_event=self._log.listener(run_id, chat_id),
            resolver=self._lookups.for_door(),
            own_addresses=self._own or frozenset(),
            asker=self._asking.asker(run_id, chat_id) if self._asking is not None else None,
        )
        await door.start()
        self._doors[run_id] = door
        log.info(
            "egress_door_opened",
            run_id=run_id,
            mode=rules.mode.value,
            allow=len(rules.allow),
            chat_allow=len(rules.chat_allow),
        )
        offered = [str(entry) for entry in (*rules.allow, *rules.chat_allow)]
        return EgressOffer(
            mode=OFFERED_MODES[rules.mode],
            allow=offered[:MAX_EGRESS_ENTRIES],  # what the task is told; the door checks every list whole
            max_bytes=rules.max_bytes,
        )

    async def close(self, run_id: str) -> None:
        door = self._doors.pop(run_id, None)
        if door is not None:
            await door.close()
            await self._log.close_run(run_id)

    async def close_all(self) -> None:
        for run_id in list(self._doors):
            await self.close(run_id)
        self._lookups.close()


def _entries(texts: list[str]) -> list[AllowEntry]:
    """The entries, each once; one the chat's list holds that no longer parses is left out."""
    found: list[AllowEntry] = []
    for text in texts:
        try:
            entry = parse_entry(text)
        except EntryInvalid:
            log.warning("egress_entry_ignored", entry=text[:80])
            continue
        if entry not in found:
            found.append(entry)
    return found
