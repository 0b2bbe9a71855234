"""SUBAGENT_EGRESS=ask: a run's door holds a connection to an unlisted public host while the chat's admins are
asked "run 3f2a wants to reach pypi.org:443" with Allow once, Allow in this chat and Deny; no answer is a deny.

The door asks only after its address check passed (loopback, private, link-local, metadata and the host's own
addresses are refused without asking: no tap opens them) and connects only to the addresses it checked then.
"Allow in this chat" is stored in the chat's own list before it takes effect; later runs of the chat get it with
the operator's allowlist (RunDoors), /web lists it and admins remove entries. A run's questions (these and its
ask_chat ones together) are bounded by SUBAGENT_MAX_QUESTIONS: past it, a host is denied unasked.
"""

from __future__ import annotations

import time

from core.egress_rules import entry_for
from core.logging import get_logger
from core.questions import Questions
from core.settings import Settings
from core.store.questions import Audience, NewQuestion, QuestionKind, QuestionStatus
from core.store.runs import RunStore
from runner.egress.records import HostAsker, HostDecision

log = get_logger(__name__)

ALLOW_ONCE, ALLOW_IN_CHAT, DENY = "Allow once", "Allow in this chat", "Deny"
OPTIONS = (ALLOW_ONCE, ALLOW_IN_CHAT, DENY)  # a press names the option's index
DECISIONS = (HostDecision.ALLOW_ONCE, HostDecision.ALLOW_IN_CHAT, HostDecision.DENY)
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

    def asker(self, run_id: str, chat_id: int) -> HostAsker:
        async def ask(host: str, port: int) -> HostDecision:
            return await self.ask(run_id, chat_id, host, port)

        return ask

    async def ask(self, run_id: str, chat_id: int, host: str, port: int) -> HostDecision:
        asked = [q for q in await self._desk.store.for_run(run_id) if q.kind in COUNTED_KINDS]
        if len(asked) >= self._settings.subagent_max_questions:
            log.info("egress_not_asked", run_id=run_id, host=host[:80], port=port, reason="questions used up")
            return HostDecision.DENY
        question = await self._desk.ask(
            NewQuestion(
                chat_id=chat_id,
                run_id=run_id,
                kind=QuestionKind.EGRESS,
                text=f"🌐 Run {run_id[:SHORT_RUN_ID_CHARS]} wants to reach {host}:{port}.",
                options=OPTIONS,
                audience=Audience.ADMINS,
                expires_at=time.time() + self._settings.subagent_ask_timeout_seconds,
            ),
            reply_to=await self._runs.asked_by(run_id),
        )
        closed = await self._desk.wait(question)
        if closed.status is not QuestionStatus.ANSWERED or closed.option is None:
            return HostDecision.DENY
        decision = DECISIONS[closed.option]
        if decision is HostDecision.ALLOW_IN_CHAT:
            await self._desk.store.allow_in_chat(
                chat_id, chat_entry(host, port), closed.answered_by or 0, closed.answered_by_name or ""
            )
        log.info("egress_decided", run_id=run_id, host=host[:80], port=port, decision=str(decision))
        return decision
