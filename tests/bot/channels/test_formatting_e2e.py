"""Hard Markdown from the model, end to end: the real PTB Application sends the HTML to the fake Bot API, which
parses it as Telegram does (and refuses a bare "&"). Every reply must go out as HTML, not fall back to plain
text, and read as the model wrote it."""

from __future__ import annotations

from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

CODE_LINE = 'if (a < b && c > d) { out << "<tag>"; }'
LONG_CODE = "\n".join([CODE_LINE] * 130)  # 5,000+ characters; its HTML is three times as long

# (the model's reply, what users see after "Crew: ", the entity types Telegram makes of it)
REPLIES = [
    ("Run:\n```python\nprint('<x>' & 1)\nmore", "Run:\nprint('<x>' & 1)\nmore", ["pre"]),
    ("**bold *italic* inside** and **a *b** c*", "bold italic inside and a b c", ["bold", "italic", "italic"]),
    ("Try <script>alert(1)</script> & <b>this</b>", "Try <script>alert(1)</script> & <b>this</b>", []),
    ("See [the docs & more](https://example.com/?a=1&b=2)", "See the docs & more", ["text_link"]),
]


class Replies:
    """A model answering each turn with the next reply."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = iter(replies)

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(next(self.replies))])


async def test_hard_markdown_goes_out_as_html_that_telegram_accepts(tmp_path: Path) -> None:
    model = FunctionModel(Replies([reply for reply, _, _ in REPLIES]))
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg), model=model):
        for count, (_, shown, entities) in enumerate(REPLIES, 1):
            tg.push_message(GROUP_ID, f"@{tg.bot_username} once more")
            sent = (await tg.wait_for_messages(GROUP_ID, count))[-1]
            assert sent.parse_mode == "HTML", sent.text
            assert sent.plain_text == f"Crew: {shown}"
            assert sorted(e["type"] for e in sent.entities) == sorted(entities)


async def test_five_thousand_characters_of_code_go_out_as_code_blocks(tmp_path: Path) -> None:
    reply = f"Here:\n```cpp\n{LONG_CODE}\n```\nDone & dusted."
    model = FunctionModel(Replies([reply]))
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg), model=model):
        tg.push_message(GROUP_ID, f"@{tg.bot_username} the whole file please")
        await tg.wait_until(lambda: any("Done & dusted." in m.plain_text for m in tg.sent_messages(GROUP_ID)) or None)
        sent = tg.sent_messages(GROUP_ID)
        assert len(sent) == 2
        # The first one's HTML is over 4,096 characters, what users see of it is not: it still went out as HTML.
        assert all(m.parse_mode == "HTML" for m in sent)
        assert len(sent[0].text) > 4096 >= len(sent[0].plain_text)
        blocks = [m.plain_text[e["offset"] : e["offset"] + e["length"]] for m in sent for e in m.entities]
        assert [e["type"] for m in sent for e in m.entities] == ["pre", "pre"]
        assert [e["language"] for m in sent for e in m.entities] == ["cpp", "cpp"]
        assert "\n".join(blocks) == LONG_CODE
