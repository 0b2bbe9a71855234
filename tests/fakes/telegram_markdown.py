"""Telegram's MarkdownV2 parse_mode for the fake Bot API, following tdlib's `parse_markdown_v2` (which the
Bot API server uses): same reserved characters, same error wording, byte offsets in UTF-8."""

from __future__ import annotations

from dataclasses import dataclass

from tests.fakes.telegram_parsed import EntityParseError, JsonDict, ParsedText, utf16_len

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
