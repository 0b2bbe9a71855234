"""pydantic-ai's price table stays unloaded once the main agent's model is built (core/price_table.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from genai_prices.data_snapshot import get_snapshot, set_custom_snapshot
from pydantic_ai import Agent

from bot.agent.main_agent import build_main_model
from core.settings import load_settings


@pytest.fixture
def bundled_table() -> Iterator[None]:
    """As a fresh process has it: no replacement set (and none left behind for other tests)."""
    set_custom_snapshot(None)
    yield
    set_custom_snapshot(None)


@pytest.mark.usefixtures("bundled_table")
async def test_the_main_agents_model_is_built_without_the_price_table(tmp_path: Path) -> None:
    model = build_main_model(load_settings(DATA_DIR=tmp_path, LLM_PROVIDER="offline"))
    assert get_snapshot().providers == []  # the bundled table has every provider's models

    result = await Agent(model).run("hello")  # a turn's model call: no cost, no error
    assert result.output
    assert result.usage.input_tokens > 0
