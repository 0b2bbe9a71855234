"""pydantic-ai's price table left unloaded: the bot counts tokens, never a price from it.

pydantic-ai loads genai-prices' bundled table of every provider's models when its first model is built, to fill
`usage.cost` (best effort). Nothing here reads that cost (allowances and `crewbot stats` count tokens), and the
table is about 4.5 MiB of the host's memory for good; with an empty one each lookup ends as it does for an
unknown model (no cost, no context window: pydantic-ai's documented "unknown").
"""

from __future__ import annotations


def skip_price_table() -> None:
    """Call before the first pydantic-ai model is built (it loads the table then); calling again is harmless."""
    # genai-prices' own API for a replaced table (its auto-update sets one the same way). Not get_snapshot() to
    # check first: without a replacement that loads the bundled table.
    from genai_prices.data_snapshot import DataSnapshot, set_custom_snapshot

    set_custom_snapshot(DataSnapshot(providers=[], from_auto_update=False))
