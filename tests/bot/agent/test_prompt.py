"""The main agent is told what subagents can reach and use, as the settings say at that turn."""

from __future__ import annotations

from pathlib import Path

from bot.agent.prompt import subagent_abilities
from core.settings import load_settings


def test_no_network_by_default_and_the_lean_image(tmp_path: Path) -> None:
    text = subagent_abilities(load_settings(DATA_DIR=str(tmp_path)))
    assert "no network" in text and "do not offer" in text
    assert "no other packages" in text


def test_the_allowlist_names_its_hosts_and_the_image_its_tools(tmp_path: Path) -> None:
    settings = load_settings(
        DATA_DIR=str(tmp_path),
        SUBAGENT_EGRESS="allowlist",
        SUBAGENT_EGRESS_ALLOW="pypi.org,*.wikipedia.org",
        SUBAGENT_IMAGE_PACKAGES="pandas matplotlib",
        SUBAGENT_IMAGE_APT="poppler-utils",
    )
    text = subagent_abilities(settings)
    assert "only these hosts over HTTP(S): pypi.org, *.wikipedia.org; any other is refused" in text
    assert "pandas, matplotlib, poppler-utils" in text


def test_a_live_change_shows_at_the_next_turn(tmp_path: Path) -> None:
    settings = load_settings(DATA_DIR=str(tmp_path), SUBAGENT_EGRESS="allowlist")
    assert "allows no host yet" in subagent_abilities(settings)
    settings.subagent_egress_allow = ["api.github.com:443"]  # as LiveConfig applies a change: in place
    assert "api.github.com:443" in subagent_abilities(settings)
    settings.subagent_egress = type(settings.subagent_egress)("open")
    assert "any public web address" in subagent_abilities(settings)
