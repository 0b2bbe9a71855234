"""Splitting at Telegram's limit (UTF-16 units, code fences kept whole) and Markdown to Telegram HTML (pyromark)."""

from __future__ import annotations

import html
from html.parser import HTMLParser

import pytest

from bot.channels.formatting import (
    TELEGRAM_MESSAGE_LIMIT_UNITS,
    markdown_to_telegram_html,
    split_message,
    utf16_len,
)

LIMIT = TELEGRAM_MESSAGE_LIMIT_UNITS


def fence_lines(chunk: str) -> list[str]:
    return [line.strip() for line in chunk.split("\n") if line.strip().startswith("```")]


def test_utf16_len_counts_astral_characters_twice() -> None:
    assert utf16_len("abc") == 3
    assert utf16_len("é") == 1
    assert utf16_len("😀") == 2
    assert utf16_len("a😀b") == 4


def test_short_text_is_one_chunk_unchanged() -> None:
    text = "hello\n```py\nprint(1)\n```"

    assert split_message(text) == [text]


def test_long_plain_text_splits_at_lines_within_the_limit() -> None:
    line = "The quick brown fox jumps over the lazy dog, again and again."  # 61 chars
    text = "\n".join(f"{i:04d} {line}" for i in range(150))
    assert len(text) > 10_000

    chunks = split_message(text)

    assert len(chunks) >= 3
    assert all(utf16_len(chunk) <= LIMIT for chunk in chunks)
    assert "\n".join(chunks) == text  # cut only at line ends, nothing lost or added


def test_single_long_line_is_cut_without_losing_text() -> None:
    text = "x" * 10_000

    chunks = split_message(text)

    assert len(chunks) == 3
    assert all(utf16_len(chunk) <= LIMIT for chunk in chunks)
    assert "".join(chunks) == text


def test_long_code_block_keeps_fences_balanced_and_reopens_with_language() -> None:
    body = "\n".join(f"value_{i} = compute({i}) * 2  # step {i}" for i in range(400))
    text = f"Here is the script:\n```python\n{body}\n```\nDone."

    chunks = split_message(text)

    assert len(chunks) >= 3
    for index, chunk in enumerate(chunks):
        assert utf16_len(chunk) <= LIMIT
        fences = fence_lines(chunk)
        assert len(fences) % 2 == 0, f"chunk {index} has unbalanced fences: {fences}"
        if index > 0:
            assert chunk.startswith("```python\n"), f"chunk {index} does not reopen the block"
    code_lines = [
        line for chunk in chunks for line in chunk.split("\n") if line.startswith("value_")
    ]  # every code line survives once, in order
    assert code_lines == body.split("\n")
    assert chunks[0].startswith("Here is the script:")
    assert chunks[-1].endswith("```\nDone.")


def test_tilde_fences_are_closed_with_tildes() -> None:
    body = "\n".join("line " * 10 for _ in range(200))
    text = f"~~~\n{body}\n~~~"

    chunks = split_message(text, 1000)

    assert len(chunks) > 1
    for chunk in chunks:
        assert chunk.startswith("~~~")
        assert chunk.endswith("~~~")
        assert utf16_len(chunk) <= 1000


def test_emoji_count_two_units_and_are_never_split() -> None:
    text = "a" + "😀" * 3000  # 6001 units

    chunks = split_message(text)

    assert "".join(chunks) == text
    for chunk in chunks:
        assert utf16_len(chunk) <= LIMIT
        chunk.encode("utf-16-le")  # a lone surrogate would raise here
        assert not any(0xD800 <= ord(char) <= 0xDFFF for char in chunk)
    # Counted as 2 units, the first chunk holds "a" + 2047 emoji (4095 units): one more would be 4097.
    assert chunks[0] == "a" + "😀" * 2047


def test_emoji_lines_split_by_units_not_characters() -> None:
    line = "😀" * 30  # 60 units per line
    text = "\n".join([line] * 200)

    chunks = split_message(text, 1000)

    assert all(utf16_len(chunk) <= 1000 for chunk in chunks)
    assert "\n".join(chunks) == text


@pytest.mark.parametrize("limit", [16, 64, 500, LIMIT])
def test_every_chunk_respects_a_custom_limit(limit: int) -> None:
    text = "\n".join(f"line {i} " + "é" * (i % 37) for i in range(800))

    chunks = split_message(text, limit)

    assert all(utf16_len(chunk) <= limit for chunk in chunks)
    # Lines longer than a chunk are cut mid-line, so compare the text without line breaks.
    assert "".join(chunks).replace("\n", "") == text.replace("\n", "")


def test_limit_below_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        split_message("x" * 100, 10)


@pytest.mark.parametrize("prose", [4087, 4090])
def test_opening_fence_near_the_limit_stays_within_it(prose: int) -> None:
    text = "a" * prose + "\n```py\nprint(1)\n```"

    chunks = split_message(text)

    assert all(utf16_len(chunk) <= LIMIT for chunk in chunks), [utf16_len(c) for c in chunks]


# --- Markdown to Telegram HTML ----------------------------------------------------------------------

TELEGRAM_TAGS = {"b", "i", "s", "u", "code", "pre", "a", "tg-spoiler", "blockquote"}


class TagChecker(HTMLParser):
    """Collects text and checks that tags nest and close properly (Telegram rejects anything else)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.text: list[str] = []
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in TELEGRAM_TAGS:
            self.errors.append(f"unsupported tag {tag}")
        self.stack.append(tag)
        self.tags.append((tag, attrs))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"misnested </{tag}>")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html_text: str) -> TagChecker:
    checker = TagChecker()
    checker.feed(html_text)
    checker.close()
    assert checker.errors == []
    assert checker.stack == [], f"unclosed tags: {checker.stack}"
    return checker


def test_special_characters_are_escaped_outside_tags() -> None:
    out = markdown_to_telegram_html("if a < b && c > d: print('<b>')")

    assert out == "if a &lt; b &amp;&amp; c &gt; d: print('&lt;b&gt;')"
    assert "".join(parse(out).text) == "if a < b && c > d: print('<b>')"


def test_fenced_block_with_language() -> None:
    out = markdown_to_telegram_html("Run:\n```python\nif x < 3 and y > 1:\n    print('&')\n```\nok")

    assert out == (
        "Run:\n<pre><code class=\"language-python\">if x &lt; 3 and y &gt; 1:\n    print('&amp;')</code></pre>\nok"
    )
    parse(out)


def test_fenced_block_without_language_and_unterminated() -> None:
    assert markdown_to_telegram_html("```\n**not bold**\n```") == "<pre>**not bold**</pre>"
    assert (
        markdown_to_telegram_html("```sh\necho <hi>") == '<pre><code class="language-sh">echo &lt;hi&gt;</code></pre>'
    )


def test_inline_styles() -> None:
    out = markdown_to_telegram_html("Use `a<b` with **bold**, *italic* and ~~gone~~.")

    assert out == "Use <code>a&lt;b</code> with <b>bold</b>, <i>italic</i> and <s>gone</s>."
    parse(out)


def test_code_content_is_not_styled() -> None:
    assert markdown_to_telegram_html("`**x** *y*`") == "<code>**x** *y*</code>"


def test_links_keep_an_escaped_href() -> None:
    out = markdown_to_telegram_html("See [the <docs>](https://example.com/a?b=1&c=2) now")

    assert out == 'See <a href="https://example.com/a?b=1&amp;c=2">the &lt;docs&gt;</a> now'
    checker = parse(out)
    assert checker.tags == [("a", [("href", "https://example.com/a?b=1&c=2")])]


def test_links_elsewhere_than_the_web_are_text_with_their_address() -> None:
    assert markdown_to_telegram_html("[x](javascript:alert(1))") == "x (javascript:alert(1))"
    assert markdown_to_telegram_html("[docs](/docs) <me@example.org>") == "docs (/docs) me@example.org"


@pytest.mark.parametrize("text", ["snake_case_variable", "a * b * c", "price: 5 * 3", "**", "`", "1 < 2 > 0"])
def test_plain_text_that_only_looks_like_markdown_is_left_alone(text: str) -> None:
    assert markdown_to_telegram_html(text) == html.escape(text, quote=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("__dunder__", "<b>dunder</b>"),  # the hand-written converter left these as typed; CommonMark (and
        ("2*3*4 = 24", "2<i>3</i>4 = 24"),  # GitHub, and the model's training) reads them as markup
        ("* a list item", "• a list item"),
        ("# Title\ntext", "<b>Title</b>\ntext"),
        ("1. one\n2. two\n\n- a\n  - b", "1. one\n2. two\n\n• a\n  • b"),
        ("> quoted **text**\n\nafter", "<blockquote>quoted <b>text</b></blockquote>\n\nafter"),
    ],
)
def test_commonmark_markup_becomes_telegram_html(text: str, expected: str) -> None:
    assert markdown_to_telegram_html(text) == expected
    parse(expected)


def test_nested_styles_nest_properly() -> None:
    out = markdown_to_telegram_html("**bold with *italic* inside** and **`code`**")

    assert out == "<b>bold with <i>italic</i> inside</b> and <b><code>code</code></b>"
    parse(out)


@pytest.mark.parametrize(
    "text",
    [
        "***x***",
        "**a *b** c*",
        "*a **b* c**",
        "~~**x~~**",
        "[**b**](https://x.y) **[a](https://z.w)**",
        "`a` ** `b` **",
        "<script>alert(1)</script> & **<b>**",
        "```\n</pre>\n```",
        "**unclosed *and `open",
    ],
)
def test_awkward_markdown_still_gives_balanced_html(text: str) -> None:
    parse(markdown_to_telegram_html(text))


def test_long_reply_chunks_each_convert_to_balanced_html() -> None:
    body = "\n".join(f"x = a < b  # **{i}**" for i in range(500))
    text = f"**Intro** with *style*\n```python\n{body}\n```\nThe end & more."

    for chunk in split_message(text):
        checker = parse(markdown_to_telegram_html(chunk))
        assert "pre" in {tag for tag, _ in checker.tags}
