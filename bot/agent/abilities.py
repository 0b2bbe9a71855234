"""What subagents can do here, for the main agent's prompt: which hosts they reach through the egress door
and which tools their image has. Read at every turn: the egress settings change on the running bot, and
a promise of a fetch that will be refused is worse than no promise."""

from __future__ import annotations

from core.egress_rules import EgressMode
from core.settings import Settings

MAX_HOSTS_SHOWN = 20


def subagent_abilities(settings: Settings) -> str:
    mode = settings.subagent_egress
    if mode is EgressMode.NONE:
        web = "Subagents have no network: they cannot fetch web pages or packages; do not offer that."
    elif mode is EgressMode.OPEN:
        web = "Subagents can reach any public web address over HTTP(S) (curl, pip, git work)."
    else:
        hosts = settings.subagent_egress_allow
        shown = ", ".join(hosts[:MAX_HOSTS_SHOWN]) + (
            f" and {len(hosts) - MAX_HOSTS_SHOWN} more" if len(hosts) > MAX_HOSTS_SHOWN else ""
        )
        web = (
            f"Subagents can reach only these hosts over HTTP(S): {shown}; any other is refused."
            if hosts
            else "Subagents' web access allows no host yet: every fetch is refused."
        )
    tools = [*settings.subagent_image_packages, *settings.subagent_image_apt]
    image = (
        f"Their image has Python's standard library, bash and: {', '.join(tools)}."
        if tools
        else "Their image has Python's standard library and bash's basic commands, no other packages."
    )
    return f"{web} {image}"
