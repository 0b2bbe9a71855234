"""What a benchmark reports (rows of measures beside their baselines), the markdown table, and the JSON file."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

Extra = dict[str, float | int | str]


@dataclass(frozen=True, slots=True)
class Measure:
    """A median and p95 (nearest rank) over samples, or one named figure (`p95` None)."""

    median: float
    p95: float | None
    n: int
    samples: tuple[float, ...] = ()

    @classmethod
    def of(cls, samples: Sequence[float]) -> Measure:
        if not samples:
            raise ValueError("no samples to summarise")
        ordered = sorted(samples)
        rank = max(math.ceil(0.95 * len(ordered)), 1)
        return cls(statistics.median(ordered), ordered[rank - 1], len(ordered), tuple(samples))

    @classmethod
    def rates(cls, samples: Sequence[float]) -> Measure:
        """Median of per-round rates; no p95 (a rate's bad tail is its low end, and rounds are few)."""
        if not samples:
            raise ValueError("no samples to summarise")
        return cls(statistics.median(samples), None, len(samples), tuple(samples))

    @classmethod
    def figure(cls, value: float, n: int = 1) -> Measure:
        return cls(value, None, n)


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a measure, the baseline it is compared with, and their ratio."""

    bench: str
    metric: str
    unit: str
    result: Measure
    baseline_label: str = ""
    baseline: Measure | None = None
    text: str | None = None  # shown instead of the median (e.g. "3 / 47 / 0")
    baseline_text: str | None = None
    extra: Extra = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """result / baseline (medians); below 1 means smaller than the baseline."""
        if self.baseline is None or self.baseline.median == 0:
            return None
        return self.result.median / self.baseline.median

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


@dataclass(slots=True)
class Outcome:
    """What one benchmark's worker hands back to the orchestrator."""

    name: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duration_seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rows": [row.to_json() for row in self.rows],
            "notes": self.notes,
            "duration_seconds": self.duration_seconds,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        rows = [_row_from_json(row) for row in data.get("rows", [])]
        return cls(
            name=str(data["name"]),
            rows=rows,
            notes=[str(note) for note in data.get("notes", [])],
            duration_seconds=float(data.get("duration_seconds", 0.0)),
            error=data.get("error"),
        )


def _measure_from_json(data: dict[str, Any] | None) -> Measure | None:
    if data is None:
        return None
    return Measure(
        median=float(data["median"]),
        p95=None if data["p95"] is None else float(data["p95"]),
        n=int(data["n"]),
        samples=tuple(float(s) for s in data.get("samples", ())),
    )


def _row_from_json(data: dict[str, Any]) -> Row:
    result = _measure_from_json(data["result"])
    assert result is not None
    return Row(
        bench=str(data["bench"]),
        metric=str(data["metric"]),
        unit=str(data["unit"]),
        result=result,
        baseline_label=str(data.get("baseline_label", "")),
        baseline=_measure_from_json(data.get("baseline")),
        text=data.get("text"),
        baseline_text=data.get("baseline_text"),
        extra=dict(data.get("extra", {})),
    )


# --- the markdown table ---------------------------------------------------------------------------------


def format_number(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _with_unit(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{format_number(value)} {unit}".rstrip()


def _ratio_text(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    return f"{ratio:.3f}×" if ratio < 0.1 else f"{ratio:.2f}×"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(outcomes: Sequence[Outcome]) -> str:
    header = [
        "| benchmark | metric | median | p95 | baseline | baseline median | baseline p95 | ratio | n |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    lines = list(header)
    for outcome in outcomes:
        if outcome.error is not None:
            lines.append(f"| {outcome.name} | FAILED: {_cell(outcome.error[:200])} | | | | | | | |")
        for row in outcome.rows:
            base = row.baseline
            n = str(row.result.n) if base is None else f"{row.result.n} / {base.n}"
            cells = [
                row.bench,
                row.metric,
                row.text if row.text is not None else _with_unit(row.result.median, row.unit),
                _with_unit(row.result.p95, row.unit),
                row.baseline_label or "—",
                row.baseline_text
                if row.baseline_text is not None
                else _with_unit(base.median if base else None, row.unit),
                _with_unit(base.p95 if base else None, row.unit),
                _ratio_text(row.ratio),
                n,
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def notes_text(outcomes: Sequence[Outcome]) -> str:
    lines = [f"- {outcome.name}: {note}" for outcome in outcomes for note in outcome.notes]
    return "\n".join(lines)
