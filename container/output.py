"""Cap long text for the model: keep the head and the tail, say how much was cut in between."""

from __future__ import annotations

import codecs


def cap_text(text: str, cap_chars: int) -> str:
    """`text` if it fits in `cap_chars`, else its head and tail around a note of what was cut."""
    if len(text) <= cap_chars:
        return text
    head_chars, tail_chars = _split(cap_chars)
    cut = len(text) - head_chars - tail_chars
    tail = text[len(text) - tail_chars :] if tail_chars else ""
    return f"{text[:head_chars]}{cut_note(cut)}{tail}"


def cut_note(cut_chars: int) -> str:
    return f"\n[... {cut_chars} characters cut ...]\n"


def _split(cap_chars: int) -> tuple[int, int]:
    # Errors tend to be at the end and context at the start: keep both halves.
    head_chars = max(cap_chars // 2, 0)
    return head_chars, max(cap_chars - head_chars, 0)


class OutputCollector:
    """Collects a byte stream of unknown size in bounded memory: the head, a rolling tail and the total."""

    def __init__(self, cap_chars: int) -> None:
        self._cap_chars = max(cap_chars, 0)
        self._head_chars, self._tail_chars = _split(self._cap_chars)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head: list[str] = []
        self._head_len = 0
        self._tail = ""
        self._total_chars = 0

    @property
    def total_chars(self) -> int:
        return self._total_chars

    def feed(self, data: bytes, *, final: bool = False) -> None:
        text = self._decoder.decode(data, final=final)
        if not text:
            return
        self._total_chars += len(text)
        # The head holds the first `cap_chars` in full, so output that fits is returned untouched.
        room = self._cap_chars - self._head_len
        if room > 0:
            taken = text[:room]
            self._head.append(taken)
            self._head_len += len(taken)
            text = text[room:]
        if text:
            self._tail = (self._tail + text)[-self._cap_chars :] if self._cap_chars else ""

    def text(self) -> str:
        self.feed(b"", final=True)
        head = "".join(self._head)
        if self._total_chars <= self._cap_chars:
            return head
        # Everything after the first `head_chars` characters that is still known, in order.
        rest = head[self._head_chars :] + self._tail
        tail = rest[len(rest) - self._tail_chars :] if self._tail_chars else ""
        cut = self._total_chars - self._head_chars - len(tail)
        return f"{head[: self._head_chars]}{cut_note(cut)}{tail}"
