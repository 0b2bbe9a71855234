"""Telegram's text rules for the fake Bot API: parse_mode parsing, entities, length.

The HTML and MarkdownV2 parsers follow tdlib's (`parse_html`, `parse_markdown_v2`), which the Bot API
server uses: same accepted tags, same error wording, byte offsets in UTF-8. Entity offsets and lengths
are in UTF-16 code units, as in the Bot API. Telegram checks the 4,096 limit on the parsed text,
counted in Unicode code points (tdlib: `utf8_length(text) > message_text_length_max`).
"""

from __future__ import annotations

import re
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


# --- HTML -----------------------------------------------------------------------------------------

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


# --- MarkdownV2 -----------------------------------------------------------------------------------

_MD_RESERVED = "_*[]()~`>#+-=|{}.!"
_MD_END_MARKS = {
    "bold": "*",
    "italic": "_",
    "underline": "__",
    "strikethrough": "~",
    "spoiler": "||",
    "code": "`",
    "pre": "```",
    "text_link": "]",
}
_MD_TYPE_NAMES = {  # tdlib's names in "Can't find end of ... entity"
    "bold": "Bold",
    "italic": "Italic",
    "underline": "Underline",
    "strikethrough": "Strikethrough",
    "spoiler": "Spoiler",
    "code": "Code",
    "pre": "Pre",
    "text_link": "TextUrl",
}


@dataclass
class _OpenMark:
    type: str
    utf16_offset: int
    byte_offset: int
    language: str = ""


def parse_markdown_v2(text: str) -> ParsedText:
    """Telegram's MarkdownV2: reserved characters must be escaped, entities must close."""
    out: list[str] = []
    utf16 = 0
    entities: list[JsonDict] = []
    open_marks: list[_OpenMark] = []
    i = 0

    def emit(chars: str) -> None:
        nonlocal utf16
        out.append(chars)
        utf16 += utf16_len(chars)

    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text) and 0 < ord(text[i + 1]) <= 126:
            emit(text[i + 1])
            i += 2
            continue
        in_code = bool(open_marks) and open_marks[-1].type in ("code", "pre")
        reserved = "`" if in_code else _MD_RESERVED
        if char not in reserved:
            emit(char)
            i += 1
            continue
        if char == ">" and (i == 0 or text[i - 1] == "\n"):
            i += 1  # blockquote marker at a line start; the quote itself is not modelled as an entity
            continue
        byte_offset = len(text[:i].encode())
        end_mark = _MD_END_MARKS[open_marks[-1].type] if open_marks else None
        if end_mark is not None and text.startswith(end_mark, i):
            mark = open_marks.pop()
            i += len(end_mark)
            entity: JsonDict = {"type": mark.type, "offset": mark.utf16_offset, "length": utf16 - mark.utf16_offset}
            if mark.type == "text_link":
                url, i = _markdown_link_url(text, i)
                if url is None:
                    continue
                entity["url"] = url
            if mark.type == "pre" and mark.language:
                entity["language"] = mark.language
            if entity["length"] > 0:
                entities.append(entity)
            continue
        mark_type, i, language = _markdown_open_mark(text, i, byte_offset)
        open_marks.append(_OpenMark(mark_type, utf16, byte_offset, language))
    if open_marks:
        mark = open_marks[-1]
        raise EntityParseError(
            f"Can't find end of {_MD_TYPE_NAMES[mark.type]} entity at byte offset {mark.byte_offset}"
        )
    entities.sort(key=lambda e: (e["offset"], -e["length"]))
    return ParsedText("".join(out), entities)


def _markdown_open_mark(text: str, i: int, byte_offset: int) -> tuple[str, int, str]:
    """(entity type, index after the mark, pre language) for the mark starting at text[i]."""
    char = text[i]
    if char == "_":
        return ("underline", i + 2, "") if text.startswith("__", i) else ("italic", i + 1, "")
    if char == "*":
        return "bold", i + 1, ""
    if char == "~":
        return "strikethrough", i + 1, ""
    if char == "|" and text.startswith("||", i):
        return "spoiler", i + 2, ""
    if char == "[":
        return "text_link", i + 1, ""
    if char == "`":
        if not text.startswith("```", i):
            return "code", i + 1, ""
        i += 3
        end = i
        while end < len(text) and not text[end].isspace() and text[end] != "`":
            end += 1
        language = ""
        if end != i and end < len(text) and text[end] != "`":
            language, i = text[i:end], end
        if i < len(text) and text[i] in "\r\n":
            i += 1
        return "pre", i, language
    raise EntityParseError(f"Character '{char}' is reserved and must be escaped with the preceding '\\'")


def _markdown_link_url(text: str, i: int) -> tuple[str | None, int]:
    """The URL in `(...)` after a link's `]`, with `\\` escapes; None when there is none."""
    if i >= len(text) or text[i] != "(":
        return None, i
    i += 1
    url: list[str] = []
    while i < len(text) and text[i] != ")":
        if text[i] == "\\" and i + 1 < len(text):
            i += 1
        url.append(text[i])
        i += 1
    if i >= len(text):
        raise EntityParseError("Can't find end of a URL")
    return "".join(url), i + 1


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
