"""Telegram's text rules for the fake Bot API: parse_mode parsing (HTML in telegram_html, MarkdownV2 in
telegram_markdown, what they give in telegram_parsed) and the entities Telegram adds to incoming messages."""

from __future__ import annotations

import re

from tests.fakes.telegram_html import parse_html
from tests.fakes.telegram_markdown import parse_markdown_v2
from tests.fakes.telegram_parsed import JsonDict, ParsedText, utf16_len


def parse_text(text: str, parse_mode: str | None, *, strict_html: bool = True) -> ParsedText:
    """The text users see and its entities; raises EntityParseError, or ValueError on a bad mode."""
    mode = (parse_mode or "").lower()
    if mode == "":
        return ParsedText(text)
    if mode == "html":
        return parse_html(text, strict=strict_html)
    if mode == "markdownv2":
        return parse_markdown_v2(text)
    if mode == "markdown":
        return ParsedText(text)  # legacy Markdown is not modelled: taken as plain text
    raise ValueError(f"unsupported parse_mode {parse_mode!r}")


# --- entities Telegram adds to incoming messages --------------------------------------------------


_BOT_COMMAND = re.compile(r"(?<!\S)/[A-Za-z0-9_]{1,32}(?:@[A-Za-z0-9_]{3,32})?(?![\w/@])")
_MENTION = re.compile(r"(?<![\w@/])@[A-Za-z0-9_]{5,32}(?!\w)")


def auto_entities(text: str) -> list[JsonDict]:
    """`bot_command` and `mention` entities, as Telegram attaches them to a user's message."""
    found: list[JsonDict] = []
    for pattern, kind in ((_BOT_COMMAND, "bot_command"), (_MENTION, "mention")):
        for match in pattern.finditer(text):
            found.append(
                {
                    "type": kind,
                    "offset": utf16_len(text[: match.start()]),
                    "length": utf16_len(match.group()),
                }
            )
    found.sort(key=lambda e: (e["offset"], -e["length"]))
    return found
