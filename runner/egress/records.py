"""What a run's door is given (its rules, fixed at the run's start) and what it reports (one event a connection)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from core.egress_rules import AllowEntry, EgressMode

MIB = 1024 * 1024
# Names a run's door looks up, in all: each is real DNS traffic from the host, to names the run chooses.
# Generous for a task's fetches (a page's hosts, a package index's mirrors); a literal address is no lookup.
MAX_LOOKUPS_PER_RUN = 256


class HostDecision(StrEnum):
    """What the chat decided about an unlisted public host (SUBAGENT_EGRESS=ask)."""

    ALLOW_ONCE = "allow_once"  # for this run
    ALLOW_IN_CHAT = "allow_in_chat"  # for this run, and the chat's own list keeps it for later runs
    DENY = "deny"  # denied, not answered, or not asked (the run's questions are used up)


# (host, port) as the client asked for them: the chat's decision, asked once per host and port in a run.
HostAsker = Callable[[str, int], Coroutine[Any, Any, HostDecision]]


@dataclass(frozen=True, slots=True)
class EgressRules:
    """The settings at the run's start: where it may connect, how many bytes and connections it may use."""

    mode: EgressMode  # never NONE here: with none no door is opened at all
    allow: tuple[AllowEntry, ...]
    max_bytes: int  # SUBAGENT_EGRESS_MAX_MB * 1 MiB, both directions together
    max_connections: int  # SUBAGENT_EGRESS_MAX_CONNECTIONS, held at once
    max_lookups: int = MAX_LOOKUPS_PER_RUN  # names looked up, in the run's whole life
    # Ask mode: the chat's own list ("Allow in this chat"). It only spares a question: an address the operator's
    # list does not name stays refused if it is loopback, private, link-local, metadata or the host's own.
    chat_allow: tuple[AllowEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class EgressEvent:
    """One connection attempt, reported when it ends or is refused."""

    host: str  # what the client asked for ("" when it was turned away before saying)
    port: int
    address: str | None  # the address connected to, if any
    allowed: bool
    reason: str  # refused: why, in one line, with the detail the client was not told; allowed: "" or why cut
    bytes_up: int  # client -> server, and what the name's lookup was counted as (lookup_bytes)
    bytes_down: int  # server -> client
    started_at: float
    ended_at: float
    lookups: int = 0  # 1: the host looked the name up for it (or began to)


def megabytes(count: int) -> str:
    """A byte budget as the operator set it: `50 MB`, or `0.06 MB` for a test's small one."""
    return f"{count // MIB} MB" if count % MIB == 0 else f"{count / MIB:.2g} MB"


def budget_reason(max_bytes: int) -> str:
    return f"this run has used its SUBAGENT_EGRESS_MAX_MB ({megabytes(max_bytes)}, both directions together)"


def lookups_reason(max_lookups: int) -> str:
    return f"this run has made its {max_lookups} DNS lookups (a literal IP address needs none)"
