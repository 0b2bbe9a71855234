"""The old baseline for bench/markdown.py, and nothing else: bot/channels/formatting.py's hand-written Markdown to
Telegram HTML converter and splitter (regexes and a fence regex), as they were before the product moved to
pyromark (commit 5d1a6a5). Kept verbatim so the benchmark can time the same answer through both in one run; the
product no longer has this code and must not import it."""

from __future__ import annotations

import html
import re

TELEGRAM_MESSAGE_LIMIT_UNITS = 4096  # Telegram counts UTF-16 code units
_FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


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
    the same language, so every chunk renders on its own.
    """
    if limit < 16:
        raise ValueError("limit too small to split with code fences")
    if utf16_len(text) <= limit:
        return [text]
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    fence: str | None = None  # opening line of the code block the current chunk is inside

    for raw in text.split("\n"):
        # Inside a block a piece of a long line shares its chunk with the reopened and the closing fence.
        room = limit if fence is None else max(limit - utf16_len(fence) - utf16_len(_closing(fence)) - 2, 8)
        for piece in _hard_split(raw, room) if utf16_len(raw) > room else [raw]:
            after = _toggle(fence, piece)
            reserve = utf16_len(_closing(after)) + 1 if after is not None else 0
            added = utf16_len(piece) + (1 if current else 0)
            has_content = len(current) > (1 if fence is not None else 0)
            if has_content and size + added + reserve > limit:
                body = "\n".join(current)
                chunks.append(body + ("\n" + _closing(fence) if fence is not None else ""))
                current = [fence] if fence is not None else []
                size = utf16_len(fence) if fence is not None else 0
                added = utf16_len(piece) + (1 if current else 0)
            current.append(piece)
            size += added
            fence = after
    if len(current) > (1 if fence is not None else 0) or not chunks:
        chunks.append("\n".join(current))
    return chunks


def _toggle(fence: str | None, line: str) -> str | None:
    """The open fence after `line`: a fence line opens a block outside one and closes it inside."""
    if not _FENCE.match(line):
        return fence
    return line.strip() if fence is None else None


def _closing(fence_line: str | None) -> str:
    if fence_line is None:
        return ""
    match = _FENCE.match(fence_line)
    return match.group(2) if match else "```"


_INLINE = re.compile(
    r"(?P<code>`[^`\n]+`)"
    r"|(?P<bold>\*\*(?=\S)[^\n]*?(?<=\S)\*\*)"
    r"|(?P<italic>(?<![\w*])\*(?=[^\s*])[^*\n]*?(?<=[^\s*])\*(?![\w*]))"
    r"|(?P<strike>~~(?=\S)[^\n]*?(?<=\S)~~)"
    r"|(?P<link>\[[^\]\n]+\]\((?:https?|tg)://[^\s)]+\))"
)


def _inline_to_html(text: str) -> str:
    out: list[str] = []
    pos = 0
    for match in _INLINE.finditer(text):
        out.append(html.escape(text[pos : match.start()], quote=False))
        token = match.group(0)
        if match.group("code"):
            out.append(f"<code>{html.escape(token[1:-1], quote=False)}</code>")
        elif match.group("bold"):
            out.append(f"<b>{_inline_to_html(token[2:-2])}</b>")
        elif match.group("italic"):
            out.append(f"<i>{_inline_to_html(token[1:-1])}</i>")
        elif match.group("strike"):
            out.append(f"<s>{_inline_to_html(token[2:-2])}</s>")
        else:
            label, url = token[1:].split("](", 1)
            out.append(f'<a href="{html.escape(url[:-1], quote=True)}">{html.escape(label, quote=False)}</a>')
        pos = match.end()
    out.append(html.escape(text[pos:], quote=False))
    return "".join(out)


def markdown_to_telegram_html(text: str) -> str:
    """The Markdown LLMs write (fences, inline code, bold, italic, links) as Telegram's HTML subset."""
    out: list[str] = []
    code: list[str] | None = None
    language = ""
    for line in text.split("\n"):
        fence = _FENCE.match(line)
        if fence and code is None:
            code, language = [], fence.group(3).strip().split(" ")[0]
            continue
        if fence and code is not None:
            out.append(_code_block(code, language))
            code = None
            continue
        if code is not None:
            code.append(line)
        else:
            out.append(_inline_to_html(line))
    if code is not None:  # unterminated fence: still show it as code
        out.append(_code_block(code, language))
    return "\n".join(out)


def _code_block(lines: list[str], language: str) -> str:
    body = html.escape("\n".join(lines), quote=False)
    if language and re.fullmatch(r"[\w+#.-]{1,32}", language):
        return f'<pre><code class="language-{language}">{body}</code></pre>'
    return f"<pre>{body}</pre>"
