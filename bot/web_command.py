"""`/web`: where this chat's subagents may go on the web. Lists the mode, the operator's allowlist (to admins;
others see how many entries it has) and the hosts the chat's admins allowed "in this chat" (SUBAGENT_EGRESS=ask:
who added each, when); `/web remove <entry>` takes one off the chat's own list (admins). The next run of the chat
reads the list anew."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from bot.run_web import shown_host, shown_reason
from core.egress_rules import EgressMode
from core.settings import Settings
from core.store.questions import QuestionStore

USAGE = "Usage: /web, or /web remove <host> (admins)"
WHO_MAY = "Only chat admins can change this chat's web list."
MAX_LISTED = 30


class WebCommand:
    def __init__(self, settings: Settings, questions: QuestionStore) -> None:
        self._settings = settings
        self._questions = questions

    async def reply(
        self,
        chat_id: int,
        args: Sequence[str],
        may_change: Callable[[], Awaitable[bool]],
        sees_operators: Callable[[], Awaitable[bool]] | None = None,
    ) -> str:
        """`sees_operators`: whether the asker may see the operator's allowlist (the host's configuration)."""
        if not args:
            return await self.show(chat_id, operators=await (sees_operators or may_change)())
        if args[0].lower() != "remove" or len(args) != 2:
            return USAGE
        if not await may_change():
            return WHO_MAY
        entry = args[1].strip().lower()[:300]
        if await self._questions.remove_from_chat(chat_id, entry):
            return f"Removed {shown_host(entry)} from this chat's web list; the next run of the chat has it no more."
        return f"{shown_host(entry)} is not on this chat's web list. /web lists it."

    async def show(self, chat_id: int, *, operators: bool = False) -> str:
        mode = self._settings.subagent_egress
        listed = self._settings.subagent_egress_allow
        operator = ", ".join(listed) or "none"
        if not operators and listed:  # what the host may reach is the operator's to know, not every member's
            operator = f"{len(listed)} entries (shown to admins)"
        lines = [
            f"Web for subagents: {mode.value}." + ("" if mode is EgressMode.NONE else f" Operator's list: {operator}.")
        ]
        own = await self._questions.chat_allowlist(chat_id)
        if own:
            lines.append("Allowed in this chat:")
            for allowed in own[:MAX_LISTED]:
                when = time.strftime("%Y-%m-%d", time.gmtime(allowed.added_at))
                lines.append(f"• {shown_host(allowed.entry)} (by {shown_reason(allowed.added_by_name)}, {when})")
            if mode is not EgressMode.ASK:
                lines.append("(used only while SUBAGENT_EGRESS=ask)")
        elif mode is EgressMode.ASK:
            lines.append("No host allowed in this chat yet: an admin's tap on Allow in this chat adds one.")
        return "\n".join(lines)
