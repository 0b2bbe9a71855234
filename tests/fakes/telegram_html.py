"""Telegram's HTML parse_mode for the fake Bot API, following tdlib's `parse_html` (which the Bot API server
uses): same accepted tags, same error wording, byte offsets in UTF-8."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.fakes.telegram_parsed import EntityParseError, JsonDict, ParsedText, utf16_len

_HTML_TAG_TYPES = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
_HTML_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_HTML_ENTITY = re.compile(r"&(?:#(\d{1,7})|#[xX]([0-9a-fA-F]{1,6})|([a-zA-Z]+));")


@dataclass
class _OpenTag:
    name: str
    argument: str
    utf16_offset: int
    byte_offset: int


def _decode_html_entity(source: str, pos: int) -> tuple[str, int] | None:
    """(character, length in source) for an entity at `pos` that Telegram decodes, else None."""
    match = _HTML_ENTITY.match(source, pos)
    if match is None:
        return None
    decimal, hexadecimal, name = match.groups()
    if name is not None:
        char = _HTML_NAMED_ENTITIES.get(name)
        return (char, match.end() - pos) if char is not None else None
    code = int(decimal) if decimal is not None else int(hexadecimal, 16)
    if code == 0 or code > 0x10FFFF:
        return None
    return chr(code), match.end() - pos


class _HtmlParser:
    def __init__(self, source: str, strict: bool) -> None:
        self.src = source
        self.strict = strict
        self.pos = 0
        self.out: list[str] = []
        self.utf16 = 0
        self.open: list[_OpenTag] = []
        self.entities: list[JsonDict] = []

    def byte_offset(self, pos: int) -> int:
        return len(self.src[:pos].encode())

    def emit(self, chars: str) -> None:
        self.out.append(chars)
        self.utf16 += utf16_len(chars)

    def at(self, pos: int) -> str:
        return self.src[pos] if pos < len(self.src) else ""

    def parse(self) -> ParsedText:
        while self.pos < len(self.src):
            char = self.src[self.pos]
            if char == "&":
                self.entity()
            elif char == "<":
                if self.at(self.pos + 1) == "/":
                    self.end_tag()
                else:
                    self.start_tag()
            else:
                self.emit(char)
                self.pos += 1
        if self.open:
            raise EntityParseError(f'Can\'t find end tag corresponding to start tag "{self.open[-1].name}"')
        self.entities.sort(key=lambda e: (e["offset"], -e["length"]))
        return ParsedText("".join(self.out), self.entities)

    def entity(self) -> None:
        decoded = _decode_html_entity(self.src, self.pos)
        if decoded is not None:
            self.emit(decoded[0])
            self.pos += decoded[1]
            return
        if self.strict:  # Telegram keeps a stray "&" literally; the fake insists on html.escape()
            raise EntityParseError(
                f'Unescaped "&" at byte offset {self.byte_offset(self.pos)} (strict fake: use &amp;)'
            )
        self.emit("&")
        self.pos += 1

    def start_tag(self) -> None:
        begin = self.pos
        begin_byte = self.byte_offset(begin)
        i = begin + 1
        while i < len(self.src) and not self.src[i].isspace() and self.src[i] != ">":
            i += 1
        if i >= len(self.src):
            raise EntityParseError(f"Unclosed start tag at byte offset {begin_byte}")
        name = self.src[begin + 1 : i].lower()
        if name not in _HTML_TAG_TYPES:
            raise EntityParseError(f'Unsupported start tag "{name}" at byte offset {begin_byte}')
        argument = ""
        while self.at(i) != ">":
            while self.at(i).isspace():
                i += 1
            if self.at(i) == ">":
                break
            attr_begin = i
            while i < len(self.src) and not self.src[i].isspace() and self.src[i] not in "=>":
                i += 1
            attr_name = self.src[attr_begin:i].lower()
            if not attr_name:
                raise EntityParseError(f'Empty attribute name in the tag "{name}" at byte offset {begin_byte}')
            while self.at(i).isspace():
                i += 1
            if name == "blockquote" and attr_name == "expandable" and self.at(i) != "=":
                argument = "expandable"
                continue
            if self.at(i) != "=":
                raise EntityParseError(
                    f'Expected equal sign in declaration of an attribute of the tag "{name}" '
                    f"at byte offset {begin_byte}"
                )
            i += 1
            while self.at(i).isspace():
                i += 1
            if i >= len(self.src):
                raise EntityParseError(f"Unclosed start tag at byte offset {begin_byte}")
            value, i = self.attribute_value(i)
            if i >= len(self.src):
                raise EntityParseError(f"Unclosed start tag at byte offset {begin_byte}")
            argument = _tag_argument(name, attr_name, value, argument)
        if name == "span" and argument != "spoiler":
            raise EntityParseError(f'Tag "span" must have class "tg-spoiler" at byte offset {begin_byte}')
        self.open.append(_OpenTag(name, argument, self.utf16, begin_byte))
        self.pos = i + 1

    def attribute_value(self, i: int) -> tuple[str, int]:
        quote = self.src[i]
        if quote not in "'\"":
            token_begin = i
            while i < len(self.src) and (self.src[i].isalnum() or self.src[i] in ".-"):
                i += 1
            if i < len(self.src) and not self.src[i].isspace() and self.src[i] != ">":
                raise EntityParseError(f"Unexpected end of name token at byte offset {self.byte_offset(i)}")
            return self.src[token_begin:i].lower(), i
        i += 1
        chars: list[str] = []
        while i < len(self.src) and self.src[i] != quote:
            decoded = _decode_html_entity(self.src, i) if self.src[i] == "&" else None
            if decoded is not None:
                chars.append(decoded[0])
                i += decoded[1]
            else:
                chars.append(self.src[i])
                i += 1
        if i < len(self.src):
            i += 1  # the closing quote
        return "".join(chars), i

    def end_tag(self) -> None:
        begin_byte = self.byte_offset(self.pos)
        if not self.open:
            raise EntityParseError(f"Unexpected end tag at byte offset {begin_byte}")
        i = self.pos + 2
        name_begin = i
        while i < len(self.src) and not self.src[i].isspace() and self.src[i] != ">":
            i += 1
        name = self.src[name_begin:i].lower()
        top = self.open[-1]
        if name and name != top.name:
            raise EntityParseError(
                f'Unmatched end tag at byte offset {begin_byte}, expected "</{top.name}>", found "</{name}>"'
            )
        while self.at(i).isspace():
            i += 1
        if self.at(i) != ">":
            raise EntityParseError(f"Unclosed end tag at byte offset {begin_byte}")
        self.pos = i + 1
        self.open.pop()
        self.close_entity(top)

    def close_entity(self, tag: _OpenTag) -> None:
        length = self.utf16 - tag.utf16_offset
        if length == 0:
            return
        entity: JsonDict = {"type": _HTML_TAG_TYPES[tag.name], "offset": tag.utf16_offset, "length": length}
        if tag.name == "a":
            if not tag.argument:
                return  # an <a> without href is plain text
            entity["url"] = tag.argument
        elif tag.name == "tg-emoji":
            entity["custom_emoji_id"] = tag.argument
        elif tag.name == "blockquote" and tag.argument == "expandable":
            entity["type"] = "expandable_blockquote"
        elif tag.name == "pre":
            # <pre><code class="language-x"> is one pre entity with a language, not two entities
            inner = self.entities[-1] if self.entities else None
            if inner and inner["type"] == "code" and (inner["offset"], inner["length"]) == (tag.utf16_offset, length):
                self.entities.pop()
                if inner.get("language"):
                    entity["language"] = inner["language"]
        elif tag.name == "code" and tag.argument and self.open and self.open[-1].name == "pre":
            entity["language"] = tag.argument
        self.entities.append(entity)


def _tag_argument(tag: str, attribute: str, value: str, current: str) -> str:
    if tag == "a" and attribute == "href":
        return value
    if tag == "code" and attribute == "class" and value.startswith("language-"):
        return value.removeprefix("language-")
    if tag == "span" and attribute == "class" and value.startswith("tg-"):
        return value.removeprefix("tg-")
    if tag == "tg-emoji" and attribute == "emoji-id":
        return value
    return current


def parse_html(text: str, *, strict: bool = True) -> ParsedText:
    """Telegram's HTML; `strict` also rejects a bare "&" (Telegram would keep it literally)."""
    return _HtmlParser(text, strict).parse()
