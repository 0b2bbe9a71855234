"""The model's Markdown as Telegram HTML, and long replies split at Telegram's limit without breaking a code block.

The Markdown is parsed by pyromark: pulldown-cmark (the CommonMark parser rustdoc uses) compiled from Rust, MIT,
typed, with wheels for every common platform. The small renderer below writes only Telegram's tags (b, i, s,
code, pre, a, blockquote), escapes all text and any raw HTML, and closes whatever it opens. Compared with:
- telegramify-markdown: the same parser, but it drops raw HTML ("<script>…" in a reply vanished, and a line of
  it alone left an empty message) and gives entities, not HTML, with emoji before headings;
- chatgpt-md-converter: regexes; nested emphasis comes out misnested (`<b>a <i>b</b> c</i>`, which Telegram
  rejects), a literal "</span>" in the text is turned back into a tag, and a quote in a URL breaks its href;
- markdown-it-py: CommonMark too, but pure Python: 7× the old hand-written converter on a 4,000-character
  reply, where pyromark with this renderer is about 1× (`python -m bench --only markdown`).
"""

from __future__ import annotations

import bisect
import html
import re
from collections.abc import Iterable

import pyromark
from pyromark.event import Event, Range

TELEGRAM_MESSAGE_LIMIT_UNITS = 4096  # Telegram counts UTF-16 code units
_OPTIONS = pyromark.Options.ENABLE_STRIKETHROUGH
_STYLE_TAGS = {"Strong": "b", "Emphasis": "i", "Strikethrough": "s"}
_LINK_SCHEMES = ("https://", "http://", "tg://")
_LANGUAGE = re.compile(r"[\w+#.-]{1,32}")
_FENCE_RUN = re.compile(r"`{3,}|~{3,}")
_TAG = re.compile(r"<[^>]*>")
_RULE = "———"
_LOOK_BACK_BYTES = 64


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


# --- Markdown to Telegram HTML ------------------------------------------------------------------------


def markdown_to_telegram_html(text: str) -> str:
    """CommonMark (and ~~strikethrough~~) as Telegram's HTML subset: headings bold, lists with • or their
    numbers, links only to http(s) and tg:// (others show their address), raw HTML as text."""
    rendered = _Renderer(text).render(pyromark.events_with_range(text, options=_OPTIONS, merge_text=True))
    if not visible_text(rendered).strip():  # e.g. only a link definition: Telegram refuses an empty message
        return html.escape(text, quote=False)
    return rendered


def visible_text(telegram_html: str) -> str:
    """What users see of Telegram HTML: Telegram's length limit counts this, not the tags and escapes."""
    return html.unescape(_TAG.sub("", telegram_html))


class _Renderer:
    """pulldown-cmark's events to Telegram HTML. Events nest properly, so every tag written is closed.

    Blocks are one line break apart, two where the source has a blank line between them: the reply keeps the
    model's spacing, and what users see is never longer than the Markdown was (but for list numbers)."""

    def __init__(self, text: str) -> None:
        self.source = text.encode()
        self.here = 0  # the current event's first byte in the source
        self.out: list[str] = []
        self.gap = ""  # the line breaks owed before the next block's first content
        self.closers: list[str] = []  # what the end of each open style or link writes
        self.styles = {"b": 0, "i": 0, "s": 0}  # open depth: a style inside the same style adds no tag
        self.lists: list[int | None] = []  # per open list: the next item's number, None for bullets
        self.quotes = 0  # Telegram's blockquotes do not nest: only the outermost is a tag
        self.links = 0
        self.block: list[str] | None = None  # a code or HTML block's text, written at its end
        self.language = ""

    def render(self, events: Iterable[tuple[Event, Range]]) -> str:
        for event, span in events:
            self.here = span["start"]
            if isinstance(event, str):  # SoftBreak, HardBreak, Rule
                if event == "Rule":
                    self.flush()
                    self.out.append(_RULE)
                    self.owe("\n\n")
                else:
                    self.out.append("\n")
            elif "Text" in event:
                self.text(event["Text"])
            elif "Start" in event:
                self.start(event["Start"])
            elif "End" in event:
                self.end(event["End"])
            elif "Code" in event:
                self.flush()
                body = html.escape(event["Code"], quote=False)
                self.out.append(body if self.links else f"<code>{body}</code>")  # a link holds no code
            elif "Html" in event:
                self.text(event["Html"])
            elif "InlineHtml" in event:
                self.text(event["InlineHtml"])
        return "".join(self.out)

    def owe(self, gap: str) -> None:
        if len(gap) > len(self.gap):
            self.gap = gap

    def flush(self) -> None:
        if self.gap:
            if self.out:
                # The blank line, if any, is in the whitespace (and quote marks) just before this block.
                before = self.source[max(self.here - _LOOK_BACK_BYTES, 0) : self.here]
                blank = before.count(b"\n", len(before.rstrip(b" \t\n>"))) > 1
                self.out.append(self.gap if blank else "\n")
            self.gap = ""

    def text(self, value: str) -> None:
        if self.block is not None:
            self.block.append(value)
            return
        self.flush()
        self.out.append(html.escape(value, quote=False))

    def start(self, tag: object) -> None:
        if isinstance(tag, str):
            if tag in _STYLE_TAGS:
                self.style(_STYLE_TAGS[tag])
            elif tag == "Item":
                self.item()
            elif tag == "HtmlBlock":
                self.flush()
                self.block = []
        elif isinstance(tag, dict):
            if "CodeBlock" in tag:
                kind = tag["CodeBlock"]
                self.language = kind["Fenced"].split(" ", 1)[0] if isinstance(kind, dict) else ""
                self.flush()
                self.block = []
            elif "Heading" in tag:
                self.style("b")
            elif "List" in tag:
                self.lists.append(tag["List"])
            elif "BlockQuote" in tag:
                self.flush()
                if not self.quotes:
                    self.out.append("<blockquote>")
                self.quotes += 1
            elif "Link" in tag or "Image" in tag:
                self.link(tag.get("Link") or tag["Image"])

    def end(self, tag: object) -> None:
        if isinstance(tag, str):
            if tag in _STYLE_TAGS:
                self.unstyle(_STYLE_TAGS[tag])
            elif tag == "Paragraph":
                self.owe("\n\n")
            elif tag in ("Link", "Image"):
                self.links -= 1
                self.out.append(self.closers.pop())
            elif tag == "CodeBlock":
                self.code_block("".join(self.block or ()).removesuffix("\n"))
            elif tag == "HtmlBlock":
                self.out.append(html.escape("".join(self.block or ()).rstrip("\n"), quote=False))
                self.block = None
                self.owe("\n\n")
        elif isinstance(tag, dict):
            if "Heading" in tag:
                self.unstyle("b")
                self.owe("\n\n")
            elif "List" in tag:
                self.lists.pop()
                self.owe("\n" if self.lists else "\n\n")  # a nested list goes on with its parent's items
            elif "BlockQuote" in tag:
                self.quotes -= 1
                if not self.quotes:
                    self.out.append("</blockquote>")
                self.gap = "\n\n"  # not the breaks owed inside the quote: they would end up in it

    def style(self, name: str) -> None:
        self.flush()
        if self.styles[name]:
            self.closers.append("")
        else:
            self.out.append(f"<{name}>")
            self.closers.append(f"</{name}>")
        self.styles[name] += 1

    def unstyle(self, name: str) -> None:
        self.styles[name] -= 1
        self.out.append(self.closers.pop())

    def item(self) -> None:
        self.owe("\n")
        self.flush()
        number = self.lists[-1] if self.lists else None
        if number is not None:
            self.lists[-1] = number + 1
        self.out.append("  " * (len(self.lists) - 1) + ("•" if number is None else f"{number}.") + " ")

    def link(self, data: dict[str, object]) -> None:
        self.flush()
        url = str(data["dest_url"])
        if url.lower().startswith(_LINK_SCHEMES) and not self.links:
            self.out.append(f'<a href="{html.escape(url)}">')
            self.closers.append("</a>")
        elif not url or data["link_type"] in ("Autolink", "Email"):
            self.closers.append("")  # the text is the address
        else:
            self.closers.append(html.escape(f" ({url})", quote=False))
        self.links += 1

    def code_block(self, body: str) -> None:
        self.block = None
        escaped = html.escape(body, quote=False)
        if self.language and _LANGUAGE.fullmatch(self.language):
            self.out.append(f'<pre><code class="language-{self.language}">{escaped}</code></pre>')
        else:
            self.out.append(f"<pre>{escaped}</pre>")
        self.owe("\n\n")


# --- splitting ----------------------------------------------------------------------------------------


def _hard_split(line: str, limit: int) -> list[str]:
    """Cut one over-long line into pieces of at most `limit` UTF-16 units, never inside a surrogate pair."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for char in line:
        width = 2 if ord(char) > 0xFFFF else 1
        if size + width > limit and current:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(char)
        size += width
    if current or not pieces:
        pieces.append("".join(current))
    return pieces


def split_message(text: str, limit: int = TELEGRAM_MESSAGE_LIMIT_UNITS) -> list[str]:
    """Split at line boundaries into chunks of at most `limit` units.

    A chunk that ends inside a fenced code block closes the fence, and the next chunk reopens it with
    the same language, so every chunk renders on its own. Where the code blocks are is the parser's
    answer, so a split agrees with how each chunk renders (a ``` line inside a ```` block is code).
    """
    if limit < 16:
        raise ValueError("limit too small to split with code fences")
    if utf16_len(text) <= limit:
        return [text]
    lines = text.split("\n")
    open_after = _fences_open_after(text, lines)
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    fence: str | None = None  # opening fence of the code block the current chunk is inside
    just_opened = False  # the chunk's last line opened that block

    for index, raw in enumerate(lines):
        # Inside a block a piece of a long line shares its chunk with the reopened and the closing fence.
        room = limit if fence is None else max(limit - utf16_len(fence) - utf16_len(_closing(fence)) - 2, 8)
        pieces = _hard_split(raw, room) if utf16_len(raw) > room else [raw]
        for number, piece in enumerate(pieces, 1):
            after = open_after[index] if number == len(pieces) else fence
            reserve = utf16_len(_closing(after)) + 1 if after is not None else 0
            added = utf16_len(piece) + (1 if current else 0)
            has_content = len(current) > (1 if fence is not None else 0)
            if has_content and size + added + reserve > limit:
                if just_opened:  # the opening fence goes on to the next chunk: no empty block at this one's end
                    chunks.append("\n".join(current[:-1]))
                else:
                    chunks.append("\n".join(current) + ("\n" + _closing(fence) if fence is not None else ""))
                current = [fence] if fence is not None else []
                size = utf16_len(fence) if fence is not None else 0
                added = utf16_len(piece) + (1 if current else 0)
            current.append(piece)
            size += added
            just_opened, fence = fence is None and after is not None, after
    if len(current) > (1 if fence is not None else 0) or not chunks:
        chunks.append("\n".join(current))
    return chunks


def _fences_open_after(text: str, lines: list[str]) -> list[str | None]:
    """Per line: the opening fence (e.g. "```python") of the fenced code block still open after it, else None."""
    starts: list[int] = []  # each line's first byte in UTF-8, as the parser's ranges count
    offset = 0
    for line in lines:
        starts.append(offset)
        offset += len(line.encode()) + 1
    source = text.encode()
    open_after: list[str | None] = [None] * len(lines)
    block: tuple[int, int] | None = None  # the fenced block being read: its range (the fences included)
    content_end = 0
    for event, span in pyromark.events_with_range(text, options=_OPTIONS, merge_text=True):
        if isinstance(event, str):
            continue
        if block is None:
            tag = event.get("Start")
            if isinstance(tag, dict) and isinstance(tag.get("CodeBlock"), dict):  # a fenced one
                block = span["start"], span["end"]
                content_end = _line_end(source, block[0])
        elif "Text" in event:  # inside a block come its text and then its end
            content_end = span["end"]
        else:
            first = bisect.bisect_right(starts, block[0]) - 1
            last = bisect.bisect_right(starts, max(block[1] - 1, block[0])) - 1
            opening = source[block[0] : _line_end(source, block[0])].decode().strip()
            closed = block[1] > content_end and last > first  # else it ran to the end of its container
            for row in range(first, last if closed else last + 1):
                open_after[row] = opening
            block = None
    return open_after


def _line_end(source: bytes, start: int) -> int:
    end = source.find(b"\n", start)
    return len(source) if end < 0 else end


def _closing(fence_line: str | None) -> str:
    if fence_line is None:
        return ""
    match = _FENCE_RUN.match(fence_line)
    return match.group(0) if match else "```"
