"""`crewbot stats --plot FILE.png`: running subagents over time against the cap, and the queue length.

Drawn with Pillow (the optional `plot` extra), PLOT_WIDTH_PX x PLOT_HEIGHT_PX, step lines: the cap in
red, running in blue, queued in orange, time along the bottom (UTC).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from crewbot.startup import StartupError
from crewbot.usage_stats import Step

PLOT_WIDTH_PX = 1000
PLOT_HEIGHT_PX = 400
MARGIN_LEFT_PX, MARGIN_RIGHT_PX, MARGIN_TOP_PX, MARGIN_BOTTOM_PX = 50, 20, 30, 40
CAP_COLOUR, RUNNING_COLOUR, QUEUED_COLOUR = (200, 30, 30), (30, 90, 200), (230, 140, 20)
AXIS_COLOUR, GRID_COLOUR, BACKGROUND = (60, 60, 60), (225, 225, 225), (255, 255, 255)
LINE_WIDTH_PX = 2
TIME_FORMAT = "%Y-%m-%d %H:%M UTC"


class PlotUnavailable(StartupError):
    """Pillow is not installed: one line naming the extra."""

    def __init__(self) -> None:
        super().__init__("--plot needs the plot extra (Pillow)", "pip install 'crewbot[plot]'")


def require_pillow() -> None:
    """Before any work: PlotUnavailable when Pillow is not installed."""
    if importlib.util.find_spec("PIL") is None:
        raise PlotUnavailable


def draw(steps: Sequence[Step], start: float, end: float, path: Path) -> None:
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:
        raise PlotUnavailable from exc
    image = Image.new("RGB", (PLOT_WIDTH_PX, PLOT_HEIGHT_PX), BACKGROUND)
    pen = ImageDraw.Draw(image)
    top = max([max(s.running, s.queued, s.cap) for s in steps] + [1]) + 1
    left, right = MARGIN_LEFT_PX, PLOT_WIDTH_PX - MARGIN_RIGHT_PX
    upper, lower = MARGIN_TOP_PX, PLOT_HEIGHT_PX - MARGIN_BOTTOM_PX
    span = max(end - start, 1e-6)

    def x(at: float) -> float:
        return left + (right - left) * (min(max(at, start), end) - start) / span

    def y(count: float) -> float:
        return lower - (lower - upper) * count / top

    tick = max(1, top // 10)
    for count in range(0, top + 1, tick):
        pen.line([(left, y(count)), (right, y(count))], fill=GRID_COLOUR)
        pen.text((8, y(count) - 6), str(count), fill=AXIS_COLOUR)
    pen.line([(left, upper), (left, lower), (right, lower)], fill=AXIS_COLOUR)
    pen.text((left, lower + 8), time.strftime(TIME_FORMAT, time.gmtime(start)), fill=AXIS_COLOUR)
    end_label = time.strftime(TIME_FORMAT, time.gmtime(end))
    pen.text((right - 6 * len(end_label), lower + 8), end_label, fill=AXIS_COLOUR)

    def series(value: Callable[[Step], int], colour: tuple[int, int, int]) -> None:
        points: list[tuple[float, float]] = []
        for step, following in zip(steps, [s.at for s in steps[1:]] + [end], strict=True):
            points += [(x(step.at), y(value(step))), (x(following), y(value(step)))]
        if len(points) > 1:
            pen.line(points, fill=colour, width=LINE_WIDTH_PX)

    series(lambda s: s.queued, QUEUED_COLOUR)
    series(lambda s: s.running, RUNNING_COLOUR)
    series(lambda s: s.cap, CAP_COLOUR)
    legend_x = left + 10
    for label, colour in (
        ("MAX_CONCURRENT_SUBAGENTS", CAP_COLOUR),
        ("running", RUNNING_COLOUR),
        ("queued", QUEUED_COLOUR),
    ):
        pen.rectangle([legend_x, 10, legend_x + 12, 20], fill=colour)
        pen.text((legend_x + 16, 9), label, fill=AXIS_COLOUR)
        legend_x += 30 + 7 * len(label)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")
