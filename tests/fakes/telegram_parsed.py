"""What parsing a message's text gives the fake Bot API: the text users see and its entities, or tdlib's
reason it does not parse. Entity offsets and lengths are in UTF-16 code units, as in the Bot API.
Telegram checks the 4,096 limit on the parsed text, counted in Unicode code points (tdlib:
`utf8_length(text) > message_text_length_max`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_MESSAGE_TEXT_CHARS = 4096


JsonDict = dict[str, Any]


class EntityParseError(ValueError):
    """The text does not parse; str() is tdlib's reason, to follow "can't parse entities: "."""


@dataclass
class ParsedText:
    text: str
    entities: list[JsonDict] = field(default_factory=list)


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2
