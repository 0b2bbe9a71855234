"""The Markdown a model may write that is hard to render, parsed by the fake Bot API's HTML parser (tdlib's rules,
and a bare "&" refused): unclosed code fences, nested emphasis, 5,000 characters in one code block, <script>
and & in the text. Each must parse, show the text as written and keep to Telegram's nesting rules; a long one is
split so that every part does the same."""

from __future__ import annotations

import pytest

from bot.channels.formatting import TELEGRAM_MESSAGE_LIMIT_UNITS, markdown_to_telegram_html, split_message, utf16_len
from bot.channels.telegram import SPLIT_MARGIN_UNITS
from tests.fakes.telegram_html import parse_html
from tests.fakes.telegram_parsed import JsonDict, ParsedText

PART_LIMIT = TELEGRAM_MESSAGE_LIMIT_UNITS - SPLIT_MARGIN_UNITS  # what TelegramChannel.split cuts at
STYLES = {"bold", "italic", "underline", "strikethrough", "spoiler"}


def telegram(markdown: str) -> ParsedText:
    """What Telegram makes of the HTML the bot sends for `markdown` (raises where Telegram would refuse it)."""
    parsed = parse_html(markdown_to_telegram_html(markdown))
    check_nesting(parsed.entities)
    assert len(parsed.text) <= TELEGRAM_MESSAGE_LIMIT_UNITS
    return parsed


def check_nesting(entities: list[JsonDict]) -> None:
    """The Bot API's rules: entities sharing characters nest; styles go anywhere but inside pre and code;
    blockquotes do not nest; any other two entities do not contain each other (a blockquote may hold code)."""

    def span(entity: JsonDict) -> tuple[int, int]:
        return entity["offset"], entity["offset"] + entity["length"]

    for index, outer in enumerate(entities):
        for inner in entities[index + 1 :]:
            (a, b), (c, d) = span(outer), span(inner)
            if max(a, c) >= min(b, d):
                continue  # no characters in common
            assert (a <= c and d <= b) or (c <= a and b <= d), f"{outer} and {inner} overlap without nesting"
            kinds = {outer["type"], inner["type"]}
            if (a, b) != (c, d):
                big, small = (outer, inner) if a <= c and d <= b else (inner, outer)
                assert not (big["type"] in {"pre", "code"} and small["type"] in STYLES), f"{small} inside {big}"
            if kinds & STYLES:
                continue
            assert "blockquote" in kinds and kinds != {"blockquote"}, f"{outer} and {inner} may not nest"


def pre_texts(parsed: ParsedText) -> list[str]:
    return [parsed.text[e["offset"] : e["offset"] + e["length"]] for e in parsed.entities if e["type"] == "pre"]


# --- unclosed code fences -------------------------------------------------------------------------------------


def test_an_unclosed_fence_is_code_to_the_end() -> None:
    parsed = telegram("Run:\n```python\nprint('<x>' & 1)\nmore")

    assert parsed.text == "Run:\nprint('<x>' & 1)\nmore"
    assert parsed.entities == [{"type": "pre", "offset": 5, "length": 21, "language": "python"}]


def test_an_unclosed_fence_in_a_quote_ends_with_the_quote() -> None:
    parsed = telegram("> ```\n> a < b\n\nafter **this**")

    assert parsed.text == "a < b\n\nafter this"
    assert sorted(e["type"] for e in parsed.entities) == ["blockquote", "bold", "pre"]


@pytest.mark.parametrize("text", ["`open and **bold**", "```", "~~~sh", "text\n````\n```\nstill code"])
def test_unclosed_backticks_and_empty_fences_still_parse(text: str) -> None:
    telegram(text)


def test_a_long_unclosed_block_is_reopened_in_every_part() -> None:
    code = [f"line_{i} = value < {i} & mask" for i in range(400)]
    parts = split_message("Here:\n```py\n" + "\n".join(code), PART_LIMIT)

    assert len(parts) >= 3
    assert all(part.startswith("```py\n") for part in parts[1:])
    assert "\n".join(text for part in parts for text in pre_texts(telegram(part))) == "\n".join(code)


# --- nested emphasis --------------------------------------------------------------------------------------


def test_emphasis_inside_emphasis_nests() -> None:
    parsed = telegram("**bold with *italic* inside** and ~~**both**~~")

    assert parsed.text == "bold with italic inside and both"
    assert sorted(parsed.entities, key=lambda e: (e["offset"], e["type"])) == [
        {"type": "bold", "offset": 0, "length": 23},
        {"type": "italic", "offset": 10, "length": 6},
        {"type": "bold", "offset": 28, "length": 4},
        {"type": "strikethrough", "offset": 28, "length": 4},
    ]


@pytest.mark.parametrize(
    "text",
    [
        "***x***",
        "**a *b** c*",
        "*a **b* c**",
        "~~**x~~**",
        "*a *b* c*",
        "**bold ~~and *all* of~~ it**",
        "_a __b__ c_ __a _b_ c__",
        "[**b** *i* `c`](https://x.y) **[a](https://z.w)**",
        "# **heading** *with* `code`",
        "> **quoted *nested***\n> > deeper `code`\n> ```\n> block\n> ```",
        "- **item *one***\n  - *nested **two***",
        "**unclosed *and `open",
    ],
)
def test_nested_and_crossed_emphasis_gives_what_telegram_accepts(text: str) -> None:
    telegram(text)


# --- 5,000 characters in one code block ---------------------------------------------------------------------


@pytest.mark.parametrize("newlines", [True, False])
def test_five_thousand_characters_in_one_code_block_split_into_code_blocks(newlines: bool) -> None:
    line = 'if (a < b && c > d) { out << "<tag>"; }'  # escapes make its HTML far longer than its text
    code = "\n".join([line] * 130) if newlines else line * 130
    assert len(code) >= 5_000
    parts = split_message(f"Here:\n```cpp\n{code}\n```\nDone & dusted.", PART_LIMIT)

    assert len(parts) >= 2
    parsed = [telegram(part) for part in parts]
    blocks = [pre_texts(p) for p in parsed]  # one per part (the intro may be a part of its own, before a long line)
    assert all(len(block) <= 1 for block in blocks) and sum(map(len, blocks)) >= 2
    assert all(e.get("language") == "cpp" for p in parsed for e in p.entities)
    assert ("\n" if newlines else "").join(block[0] for block in blocks if block) == code
    assert parsed[-1].text.endswith("Done & dusted.")
    # Telegram counts what users see, not the HTML: these parts fit although their HTML is over the limit.
    assert max(utf16_len(markdown_to_telegram_html(part)) for part in parts) > TELEGRAM_MESSAGE_LIMIT_UNITS


# --- <script> and & in the text -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<script>alert(1)</script> & **<b>** &amp; a < b",  # a line starting with a tag: an HTML block, shown as is
        "Try <script>alert('x')</script> & <b>this</b> or <span class=tg-spoiler>that</span>",  # inline HTML
        "<!-- a comment --> and </pre></code></a>",
        "a & b && c &#; &x; &",
    ],
)
def test_html_in_the_text_is_shown_as_written(text: str) -> None:
    parsed = telegram(text)

    assert parsed.text == text
    assert parsed.entities == []


def test_character_references_are_decoded_as_commonmark_says() -> None:
    assert telegram("AT&amp;T, &lt;tag&gt; &copy;").text == "AT&T, <tag> ©"


def test_tags_and_ampersands_in_links_and_code_stay_text() -> None:
    parsed = telegram('[a <b> & "c"](https://x.y/?a=1&b="2") and `<i>&amp;</i>`')

    assert parsed.text == 'a <b> & "c" and <i>&amp;</i>'
    assert parsed.entities == [
        {"type": "text_link", "offset": 0, "length": 11, "url": 'https://x.y/?a=1&b="2"'},
        {"type": "code", "offset": 16, "length": 12},
    ]


# --- splits agree with the parser about code blocks ---------------------------------------------------------


def test_a_fence_inside_a_longer_fence_is_code_and_the_split_reopens_the_outer_one() -> None:
    inner = "\n".join(["```py", *[f"print({i})  # shown as Markdown source" for i in range(150)], "```"])
    parts = split_message(f"Example:\n````md\n{inner}\n````\nend", PART_LIMIT)

    assert len(parts) >= 2
    assert all(part.startswith("````md\n") for part in parts[1:])
    assert all(part.endswith("\n````") for part in parts[:-1])
    assert "\n".join(pre_texts(telegram(part))[0] for part in parts) == inner


def test_a_tilde_line_inside_a_backtick_block_does_not_end_it() -> None:
    body = "\n".join("~~~" if i % 10 == 0 else f"row {i} of the listing, padded out a little" for i in range(200))
    parts = split_message(f"```text\n{body}\n```", 1_000)

    assert len(parts) >= 5
    assert all(part.startswith("```text\n") and part.endswith("\n```") for part in parts)
    assert "\n".join(pre_texts(telegram(part))[0] for part in parts) == body
