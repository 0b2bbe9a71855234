"""Replies' Markdown to Telegram HTML: the product's converter (pyromark's CommonMark parser and the small renderer
in bot/channels/formatting.py) on the same answers in the same run, interleaved with pulldown-cmark's parsing alone.

- A 4,000-character answer (exactly) as a model writes one: headings, paragraphs with bold, italic,
  strikethrough, inline code and links, an ordered list with a nested bullet list, a quote, a Python and a shell
  code block, and `<`, `>`, `&` in text and code: `markdown_to_telegram_html` on it.
- A 12,000-character answer of the same kind as the Telegram channel sends it: split into parts at 3,796 UTF-16
  units (`TelegramChannel.split`: the limit less its margin) and each part to HTML; the splitter asks the
  parser where the code blocks are.
Each sample is a batch of BATCH conversions (the batch's time / BATCH), the arms alternating which goes first.
Before any timing, every part's HTML is parsed by the fake Bot API's parser (tdlib's rules, as Telegram parses
it): it must be accepted, and what users see of it must fit Telegram's limit.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import pyromark

from bench.common import BenchContext, ms
from bench.report import Measure, Row
from bot.channels import formatting
from bot.channels.telegram import SPLIT_MARGIN_UNITS
from tests.fakes.telegram_html import parse_html

NAME = "markdown"
ANSWER_CHARS = 4_000
LONG_ANSWER_CHARS = 12_000
PART_LIMIT_UNITS = formatting.TELEGRAM_MESSAGE_LIMIT_UNITS - SPLIT_MARGIN_UNITS
BATCH = 10
WARMUP_ROUNDS = 50

_SECTION = """## Step {n}: the gateway's health check

Reading the **logs** and the *config* of `api-{n}` shows it restarts every ~~hour~~ {m} minutes: its health
check times out. See [the runbook](https://example.com/runbook/{n}?a=1&b=2) and the
[dashboard](https://grafana.example.com/d/{n}) for the details & the history.

1. Raise the **timeout** to `{m}s` in `values.yaml`.
2. Roll out *one* replica at a time, then:
   - watch the error rate (if a < b && c > d, it is fine),
   - roll back if it goes **over 1 %**.
3. Tell the *on-call* channel.

> Note: the gateway keeps **state** in Redis; a restart drops in-flight requests.

```python
async def check(url: str, timeout: float = {m}.0) -> bool:
    async with aiohttp.ClientSession() as session:
        async with session.get(url, timeout=timeout) as resp:
            return resp.status < 500 and "ok" in await resp.text()
```

```sh
kubectl -n prod set env deploy/api-{n} HEALTH_TIMEOUT={m}s && kubectl -n prod rollout status deploy/api-{n}
```
"""
_FILLER = "If `rollout status` hangs, check the events and ping me; it should not take long. "

Convert = Callable[[str], object]


def answer(chars: int) -> str:
    """Sections while they fit, then a closing paragraph cut to make exactly `chars` characters."""
    sections: list[str] = []
    n = 0
    while sum(len(s) for s in sections) + len(_SECTION) + 200 < chars:
        n += 1
        sections.append(_SECTION.format(n=n, m=20 + n) + "\n")
    body = "".join(sections)
    closing = (_FILLER * (chars // len(_FILLER) + 1))[: chars - len(body)]
    text = body + closing
    assert len(text) == chars
    return text


def _send(text: str) -> list[str]:
    return [formatting.markdown_to_telegram_html(part) for part in formatting.split_message(text, PART_LIMIT_UNITS)]


def _parse_only(text: str) -> object:
    return tuple(pyromark.events_with_range(text, options=pyromark.Options.ENABLE_STRIKETHROUGH, merge_text=True))


def _batch(convert: Convert, text: str) -> float:
    """ms per conversion, over a batch of BATCH."""
    started = time.perf_counter()
    for _ in range(BATCH):
        convert(text)
    return ms(time.perf_counter() - started) / BATCH


def _check(ctx: BenchContext, label: str, parts: list[str]) -> None:
    """Every part parses as Telegram parses it (tests/fakes/telegram_html.py raises if not); note what users see
    and the entities Telegram makes."""
    seen, entities = [], 0
    for part in parts:
        parsed = parse_html(part)
        seen.append(len(parsed.text))
        entities += len(parsed.entities)
    if max(seen) > formatting.TELEGRAM_MESSAGE_LIMIT_UNITS:
        raise RuntimeError(f"{label}: a part shows {max(seen)} characters, over Telegram's limit")
    html = sum(len(part) for part in parts)
    ctx.note(f"{label}: {len(parts)} part(s), {html:,} characters of HTML, {sum(seen):,} shown, {entities} entities")


async def run(ctx: BenchContext) -> list[Row]:
    rounds = ctx.scaled(1000, 200)
    short, long = answer(ANSWER_CHARS), answer(LONG_ANSWER_CHARS)
    ctx.note(
        f"the answer: {len(short):,} characters, {short.count('```') // 2} code blocks, {short.count('](')} links, "
        f"{short.count(chr(10))} lines; the long one: {len(long):,} characters; {BATCH} conversions per sample, "
        f"{rounds} rounds after {WARMUP_ROUNDS} warm-up, the arms alternating which goes first"
    )
    _check(ctx, "4,000 characters", [formatting.markdown_to_telegram_html(short)])
    _check(ctx, "12,000 characters", _send(long))

    arms: dict[str, tuple[Convert, str]] = {
        "answer": (formatting.markdown_to_telegram_html, short),
        "sent": (_send, long),
        "parse": (_parse_only, short),
    }
    times: dict[str, list[float]] = {key: [] for key in arms}
    gc.collect()
    for index in range(WARMUP_ROUNDS + rounds):
        order = list(arms) if index % 2 == 0 else list(reversed(arms))
        for key in order:
            convert, text = arms[key]
            took = _batch(convert, text)
            if index >= WARMUP_ROUNDS:
                times[key].append(took)
    measure = {key: Measure.of(samples) for key, samples in times.items()}
    return [
        Row(
            NAME,
            "a 4,000-character answer to Telegram HTML: pyromark + the renderer",
            "ms",
            measure["answer"],
        ),
        Row(
            NAME,
            "a 12,000-character answer as sent: split at 3,796 units (fences by the parser), each part to HTML",
            "ms",
            measure["sent"],
        ),
        Row(
            NAME,
            "where the time goes: pulldown-cmark's events for the 4,000-character answer (pyromark, parsing only)",
            "ms",
            measure["parse"],
        ),
    ]
