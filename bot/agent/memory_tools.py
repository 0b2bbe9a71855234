"""The main agent's memory tools: remember, remember_about, forget and search_history. Each answers in words
the model can pass on; who may do what is decided by who wrote the messages the turn answers."""

from __future__ import annotations

from pydantic_ai import RunContext

from bot.agent.deps import TurnDeps
from bot.agent.memory import Askers, NoteRefused

NOT_AVAILABLE = "Memory is not available here."
NO_MEMBER = "no member (a scheduled or subagent turn)"


async def remember(ctx: RunContext[TurnDeps], text: str) -> str:
    """Keep a note for this chat: a decision, a date, a fact the group will want later. Notes are shown at
    every turn and listed by /memory; keep each one short and self-contained.

    Args:
        text: The note, in a sentence or two (say who decided what, and when, if it matters).
    """
    deps = ctx.deps
    if deps.memory is None:
        return NOT_AVAILABLE
    askers = _askers(deps)
    try:
        by_id = askers.sole()
    except NoteRefused as exc:
        return f"Not kept: {exc}."
    by_name = deps.asker_names.get(by_id, f"member {by_id}") if by_id is not None else NO_MEMBER
    return await deps.memory.remember(deps.chat_id, text, by_id, by_name, askers.message_of(by_id))


async def remember_about(ctx: RunContext[TurnDeps], user: str, text: str) -> str:
    """Keep a note about a member, from what that member says about themselves (role, time zone,
    preferences). Only the member who wrote the message you answer, when no one else's message is part of this
    turn, can have a note written about them; it is shown when they take part, and they can list (/memory me)
    and erase (/forgetme) theirs.

    Args:
        user: The member's name as the transcript shows it (or `me`).
        text: What they told you about themselves, in a sentence.
    """
    deps = ctx.deps
    if deps.memory is None:
        return NOT_AVAILABLE
    return await deps.memory.remember_about(deps.chat_id, user, text, _askers(deps))


async def forget(ctx: RunContext[TurnDeps], note_id: str) -> str:
    """Erase a note of this chat (a chat admin, or the member it came from, may).

    Args:
        note_id: The note's id as shown (`n12`).
    """
    deps = ctx.deps
    if deps.memory is None:
        return NOT_AVAILABLE
    return await deps.memory.forget(deps.chat_id, note_id, deps.askers, await deps.asked_by_admins())


async def search_history(
    ctx: RunContext[TurnDeps], query: str, since: str | None = None, author: str | None = None
) -> str:
    """Search every stored message of this chat, far beyond the transcript you see: for what was decided,
    said or shared earlier. Returns the newest matches with message id, date, author and a snippet; more
    distinctive words reach further back.

    Args:
        query: A few distinctive words that the message contains (every word must occur; any language).
        since: Only messages from this date on (`2026-11-23`, UTC).
        author: Only messages whose sender's name contains this.
    """
    deps = ctx.deps
    if deps.memory is None:
        return NOT_AVAILABLE
    return await deps.memory.search(deps.chat_id, query, since, author)


def _askers(deps: TurnDeps) -> Askers:
    return Askers(deps.askers, deps.asker_names, deps.asker_messages)


MEMORY_TOOLS = (remember, remember_about, forget, search_history)
