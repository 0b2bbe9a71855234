"""What a run did on the web through the egress door, as operators read it: its totals, then its latest
connections, one a line (`pypi.org:443 → 151.101.0.223, 1.1 MB down`, `evil.example:443 refused: ...`).

Host names and reasons come from what a container asked for (a task follows strangers' instructions), so each
is made safe to show before it is: no control characters (no newline, no terminal escape, no bidi override),
no character that starts Markdown code, a code fence or a link in the chat, and a bounded length. Used by
`/subagents <run id>`, `crewbot logs <run id>` and (the totals) `crewbot stats`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from core.store.chat_files import size_text
from core.store.egress import EgressRecord, EgressTotals

CHAT_CONNECTIONS = 5  # the latest connections /subagents <run id> lists (one Telegram message holds them)
LOGS_CONNECTIONS = 20  # the latest connections `crewbot logs` lists
MAX_SHOWN_HOST_CHARS = 80
MAX_SHOWN_REASON_CHARS = 120
_NOT_IN_A_HOST = re.compile(r"[^A-Za-z0-9._:%-]")  # names (IDNs asked for as punycode), IPv4 and IPv6 literals
_SPACES = re.compile(r"\s+")


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def shown_host(host: str) -> str:
    """A host (or address) as asked for, each character no host name has shown as `?`; IPv6 in brackets."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    shown = _cut(_NOT_IN_A_HOST.sub("?", bare), MAX_SHOWN_HOST_CHARS) or "?"
    return f"[{shown}]" if ":" in shown else shown


def shown_reason(reason: str) -> str:
    """Free text on one line: control and format characters as spaces, no code span, no Markdown link."""
    flat = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in reason)  # Z: also U+2028, NBSP
    safe = _SPACES.sub(" ", flat).strip().replace("`", "'").replace("](", "] (")
    return _cut(safe, MAX_SHOWN_REASON_CHARS)


def _count(n: int, one: str) -> str:
    return f"{n:,} {one}" if n == 1 else f"{n:,} {one}s"


def totals_text(totals: EgressTotals) -> str:
    """`12 connections (2 refused), 1.2 MB down, 3 KB up`."""
    refused = f" ({totals.refused:,} refused)" if totals.refused else ""
    down, up = size_text(totals.bytes_down), size_text(totals.bytes_up)
    return f"{_count(totals.connections, 'connection')}{refused}, {down} down, {up} up"


def connection_text(record: EgressRecord) -> str:
    """`pypi.org:443 → 151.101.0.223, 1.1 MB down, 3 KB up` (up when any; `cut: why` when the door cut it),
    or `evil.example:443 refused: why`."""
    asked = f"{shown_host(record.host)}:{record.port}"
    reason = shown_reason(record.reason)
    if not record.allowed:
        return f"{asked} refused: {reason}" if reason else f"{asked} refused"
    to = f" → {shown_host(record.address)}" if record.address else ""
    up = f", {size_text(record.bytes_up)} up" if record.bytes_up else ""
    cut = f", cut: {reason}" if reason else ""
    return f"{asked}{to}, {size_text(record.bytes_down)} down{up}{cut}"


def web_lines(totals: EgressTotals, latest: Sequence[EgressRecord]) -> list[str]:
    """`Web: <totals>` then the latest connections (oldest first), one a line; nothing for a run that made none.
    The totals count every connection, also those past the recording cap, so the list may be shorter."""
    if not totals.connections and not latest:
        return []
    shown = f"; the last {len(latest)}:" if 0 < len(latest) < totals.connections else ""
    return [f"Web: {totals_text(totals)}{shown}", *(connection_text(r) for r in latest)]
