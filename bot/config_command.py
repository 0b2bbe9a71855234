"""`/config` in a chat: the live-changeable settings, and `/config NAME=VALUE` to change one.

Only users in ADMIN_USER_IDS (the operators; a chat admin runs one group, a cap is for the whole host)
and the local console. A change goes through the same validation, persistence and log as
`crewbot config set`; the reply is the start-up error line when it is refused.
"""

from __future__ import annotations

from core.live_config import LiveConfig, parse_assignments
from core.settings import SettingsError

USAGE = "Usage: /config (show) or /config NAME=VALUE, e.g. /config MAX_CONCURRENT_SUBAGENTS=5"


async def config_reply(config: LiveConfig, args: tuple[str, ...], changed_by: str) -> str:
    if not args:
        rows = [r for r in await config.effective() if r.live]
        lines = [f"{r.name} = {r.value} ({r.source.value})" for r in rows]
        return "Live settings (change with /config NAME=VALUE; from the next run's start):\n" + "\n".join(lines)
    try:
        changes = parse_assignments(args)
    except ValueError as exc:
        return f"{exc}\n{USAGE}"
    replies: list[str] = []
    for name, value in changes.items():
        try:
            change = await config.set(name, value, changed_by)
        except SettingsError as exc:
            replies.extend(exc.lines)
            break
        replies.append(f"{change.name}: {change.old_value} -> {change.new_value} (from the next run's start)")
    return "\n".join(replies)
