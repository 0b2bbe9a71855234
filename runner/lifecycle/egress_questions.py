"""SUBAGENT_EGRESS=ask: a run's door holds a connection to an unlisted public host while the chat's admins are
asked "run 3f2a wants to reach pypi.org:443" with Allow once, Allow in this chat and Deny; no answer is a deny.

The door asks only after its address check passed (loopback, private, link-local, metadata and the host's own
addresses are refused without asking: no tap opens them) and connects only to the addresses it checked then.
"Allow in this chat" is stored in the chat's own list (canonical form, at most MAX_CHAT_ENTRIES) before it takes
effect; later runs of the chat reach that host without a question (RunDoors; the list never opens an address the
door refuses), /web lists it and admins remove entries. A run's questions (these and its ask_chat ones together)
are bounded by SUBAGENT_MAX_QUESTIONS, counted under the run's lock: past it, a host is denied unasked. Concurrent
connections to one host share one question.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from core.egress_rules import entry_for
from core.logging import get_logger
from core.questions import Questions
from core.settings import Settings
from core.store.questions import Audience, NewQuestion, QuestionKind, QuestionStatus
from core.store.runs import RunStore
from runner.egress.records import HostAsker, HostDecision

log = get_logger(__name__)

ALLOW_ONCE, ALLOW_IN_CHAT, DENY = "Allow once", "Allow in this chat", "Deny"
OPTIONS = (ALLOW_ONCE, ALLOW_IN_CHAT, DENY)  # a press names the option's index; its label says what it decides
DECISIONS = {ALLOW_ONCE: HostDecision.ALLOW_ONCE, ALLOW_IN_CHAT: HostDecision.ALLOW_IN_CHAT, DENY: HostDecision.DENY}
# The chat's own list, at most: the task is told every entry (EgressOffer), and /web lists them. A full list is
# asked about without "Allow in this chat" until an admin removes an entry.
MAX_CHAT_ENTRIES = 100
LIST_FULL = f" (This chat's web list has its {MAX_CHAT_ENTRIES} hosts: /web remove one to keep another.)"
SHORT_RUN_ID_CHARS = 4
COUNTED_KINDS = (QuestionKind.ASK, QuestionKind.EGRESS)


def chat_entry(host: str, port: int) -> str:
    """The chat's list entry for an allowed host, in the canonical form (`[2a01::5]:8080`, `pypi.org`): what
    parse_entry reads back as the same host and port, never another address."""
    return str(entry_for(host, port))


class EgressQuestions:
    def __init__(self, settings: Settings, desk: Questions, runs: RunStore) -> None:
        self._settings = settings
        self._desk = desk
        self._runs = runs
        # Per run, while any of its hosts is being asked about: counting and storing a question happen under the
        # run's lock, so concurrent connections cannot all pass SUBAGENT_MAX_QUESTIONS together.
        self._locks: dict[str, asyncio.Lock] = {}
        self._holders: dict[str, int] = {}
        # Per (run, host, port), while it is asked: every connection meanwhile waits for the same question.
        self._pending: dict[tuple[str, str, int], asyncio.Future[HostDecision]] = {}

    def asker(self, run_id: str, chat_id: int) -> HostAsker:
        async def ask(host: str, port: int) -> HostDecision:
            return await self.ask(run_id, chat_id, host, port)

        return ask

    async def ask(self, run_id: str, chat_id: int, host: str, port: int) -> HostDecision:
        """The chat's decision about this host and port for the run; asked once while a question for it is open."""
        key = (run_id, host.lower().rstrip("."), port)
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(run_id, chat_id, host, port))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        # A caller that gives up (its connection closed) leaves the question to the others; the run's end ends it.
        return await asyncio.shield(pending)

    async def _ask(self, run_id: str, chat_id: int, host: str, port: int) -> HostDecision:
        async with self._run_lock(run_id):
            asked = [q for q in await self._desk.store.for_run(run_id) if q.kind in COUNTED_KINDS]
            if len(asked) >= self._settings.subagent_max_questions:
                log.info("egress_not_asked", run_id=run_id, host=host[:80], port=port, reason="questions used up")
                return HostDecision.DENY
            full = len(await self._desk.store.chat_allowlist(chat_id)) >= MAX_CHAT_ENTRIES
            text = f"🌐 Run {run_id[:SHORT_RUN_ID_CHARS]} wants to reach {host}:{port}."
            question = await self._desk.ask(
                NewQuestion(
                    chat_id=chat_id,
                    run_id=run_id,
                    kind=QuestionKind.EGRESS,
                    text=text + (LIST_FULL if full else ""),
                    options=(ALLOW_ONCE, DENY) if full else OPTIONS,
                    audience=Audience.ADMINS,
                    expires_at=time.time() + self._settings.subagent_ask_timeout_seconds,
                ),
                reply_to=await self._runs.asked_by(run_id),
            )
        closed = await self._desk.wait(question)
        if closed.status is not QuestionStatus.ANSWERED or closed.option is None:
            return HostDecision.DENY
        decision = DECISIONS[closed.options[closed.option]]
        if decision is HostDecision.ALLOW_IN_CHAT:
            entry, by = chat_entry(host, port), closed.answered_by or 0
            if not await self._desk.store.allow_in_chat(
                chat_id, entry, by, closed.answered_by_name or "", limit=MAX_CHAT_ENTRIES
            ):
                # Listed already, or the list filled meanwhile: this run has it all the same (as Allow once).
                log.info("egress_chat_entry_not_added", run_id=run_id, chat_id=chat_id, entry=entry[:80])
        log.info("egress_decided", run_id=run_id, host=host[:80], port=port, decision=str(decision))
        return decision

    @contextlib.asynccontextmanager
    async def _run_lock(self, run_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(run_id, asyncio.Lock())
        self._holders[run_id] = self._holders.get(run_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._holders[run_id] -= 1
            if not self._holders[run_id]:  # nobody holds or waits for it: gone, so the dicts hold live runs only
                del self._holders[run_id], self._locks[run_id]
