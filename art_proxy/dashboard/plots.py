"""Line charts as inline SVG, laid out here and drawn by the `chart` template macro.

Server-side on purpose: no chart library, no CDN, nothing for the Content-Security-Policy to allow;
a chart is a few paths and one dot per point (each with a tooltip). Labels reach the page through
the template, escaped like everything else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 640.0, 236.0
# Room for the y labels and the y axis's title on the left, the x labels and title below.
LEFT, RIGHT, TOP, BOTTOM = 70.0, 12.0, 12.0, 44.0
Y_TICKS = 5
MAX_X_TICKS = 8


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]  # (step, value)
    spread: Sequence[float] | None = None  # +- per point: drawn as a band around the line


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    label: str


@dataclass(frozen=True)
class Line:
    name: str
    index: int  # picks the colour (CSS class s0, s1...)
    path: str
    band: str | None
    dots: list[Dot]


@dataclass(frozen=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    width: float
    height: float
    lines: list[Line]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    x_title: str = "training step"
    y_title: str = ""
    plot_left: float = LEFT
    plot_right: float = WIDTH - RIGHT
    plot_top: float = TOP
    plot_bottom: float = HEIGHT - BOTTOM


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    floor: float | None = None,
    ceiling: float | None = None,
    y_title: str = "",
    x_title: str = "training step",
) -> Chart | None:
    """None when no series has a finite point (the page says there is nothing yet). `floor`
    and `ceiling`: what the values cannot pass (a reward in [0, 1], a count from 0): neither a
    band nor the axis goes beyond them. `y_title`, `x_title`: what the axes measure, in what."""
    drawn = [_finite(one) for one in series]
    points = [point for one in drawn for point in one.points]
    if not points:
        return None
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    for one in drawn:
        for low, high in _band(one, floor, ceiling):
            ys.extend((low, high))
    x_low, x_high = _span(min(xs), max(xs))
    y_low, y_high, y_ticks = _nice_axis(min(ys), max(ys), floor, ceiling)

    def to_x(x: float) -> float:
        return LEFT + (x - x_low) / (x_high - x_low) * (WIDTH - LEFT - RIGHT)

    def to_y(y: float) -> float:
        return HEIGHT - BOTTOM - (y - y_low) / (y_high - y_low) * (HEIGHT - TOP - BOTTOM)

    lines = []
    for index, one in enumerate(drawn):
        if not one.points:
            continue
        at = [(to_x(x), to_y(y)) for x, y in one.points]
        band = None
        if one.spread and any(one.spread):
            pairs = list(zip(one.points, _band(one, floor, ceiling), strict=True))
            upper = [(to_x(x), to_y(high)) for (x, _), (_, high) in pairs]
            lower = [(to_x(x), to_y(low)) for (x, _), (low, _) in pairs]
            band = _path(upper + lower[::-1]) + " Z"
        dots = [
            Dot(px, py, f"{one.name}, step {x:g}: {y:.4g}")
            for (px, py), (x, y) in zip(at, one.points, strict=True)
        ]
        lines.append(Line(one.name, index, _path(at), band, dots))
    return Chart(
        title=title,
        width=WIDTH,
        height=HEIGHT,
        lines=lines,
        x_ticks=[Tick(to_x(x), f"{x:g}") for x in _x_ticks(min(xs), max(xs))],
        y_ticks=[Tick(to_y(y), f"{y:.6g}") for y in y_ticks],
        x_title=x_title,
        y_title=y_title,
    )


def _finite(series: Series) -> Series:
    """The series without NaN or infinite points (an abandoned step's loss, say)."""
    spread = series.spread or [0.0] * len(series.points)
    kept = [
        (point, s if math.isfinite(s) else 0.0)
        for point, s in zip(series.points, spread, strict=True)
        if math.isfinite(point[0]) and math.isfinite(point[1])
    ]
    return Series(
        series.name,
        [point for point, _ in kept],
        [s for _, s in kept] if series.spread is not None else None,
    )


def _band(series: Series, floor: float | None, ceiling: float | None) -> list[tuple[float, float]]:
    """Each point's band (its value +- its spread), within the bounds."""
    low_bound = -math.inf if floor is None else floor
    high_bound = math.inf if ceiling is None else ceiling
    spread = series.spread or [0.0] * len(series.points)
    return [
        (max(y - s, low_bound), min(y + s, high_bound))
        for (_, y), s in zip(series.points, spread, strict=True)
    ]


def _nice_axis(
    low: float, high: float, floor: float | None, ceiling: float | None
) -> tuple[float, float, list[float]]:
    """An axis around [low, high] whose ticks fall on round values (a step of 1, 2 or 5 times a
    power of ten), never beyond `floor` and `ceiling`."""
    low, high = _span(low, high)
    if floor is not None:
        low = max(low, floor)
    if ceiling is not None:
        high = min(high, ceiling)
    if high <= low:
        high = low + 1.0
    raw = (high - low) / (Y_TICKS - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step + 1e-9) * step
    last = math.ceil(high / step - 1e-9) * step
    ticks = [first + i * step for i in range(round((last - first) / step) + 1)]
    return first, last, [round(tick, 12) for tick in ticks]


def _span(low: float, high: float) -> tuple[float, float]:
    """A non-empty range around [low, high] (one point, or a flat line, gets room around it)."""
    if high > low:
        return low, high
    pad = abs(low) * 0.1 or 1.0
    return low - pad, high + pad


def _x_ticks(low: float, high: float) -> list[float]:
    """Whole steps, at most MAX_X_TICKS of them, evenly spaced."""
    first, last = math.ceil(low), math.floor(high)
    if last < first:
        return [low]
    stride = max(1, math.ceil((last - first + 1) / MAX_X_TICKS))
    return [float(step) for step in range(first, last + 1, stride)]


def _path(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(points))


@dataclass(frozen=True)
class Interval:
    """One arm of an interval chart: a mean and its 95% interval, at `y` on the page."""

    label: str
    y: float
    mean: float
    low: float
    high: float
    text: str  # what its tooltip says


@dataclass(frozen=True)
class IntervalChart:
    title: str
    width: float
    height: float
    rows: list[Interval]
    x_ticks: list[Tick]
    x_title: str
    plot_left: float
    plot_right: float
    plot_bottom: float


_ROW = 28.0  # the height of one arm's row
_LABELS = 180.0  # room for the arms' labels on the left


def interval_chart(
    title: str,
    arms: Sequence[tuple[str, float | None, float | None, float | None]],
    *,
    x_title: str,
) -> IntervalChart | None:
    """Each arm's mean as a dot and its interval as a bar, one row an arm, on one axis (an
    evaluation's rewards side by side). None when no arm has a mean."""
    shown = [
        (label, mean, low, high)
        for label, mean, low, high in arms
        if mean is not None and low is not None and high is not None
    ]
    if not shown:
        return None
    values = [v for _, mean, low, high in shown for v in (mean, low, high)]
    x_low, x_high, ticks = _nice_axis(min(values), max(values), None, None)
    if min(values) >= 0.0 and max(values) <= 1.0:  # a reward in [0, 1]: the whole of it
        x_low, x_high, ticks = 0.0, 1.0, [0.0, 0.25, 0.5, 0.75, 1.0]
    left, right = _LABELS, WIDTH - RIGHT
    height = TOP + _ROW * len(shown) + BOTTOM

    def to_x(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * (right - left)

    rows = [
        Interval(
            label,
            TOP + _ROW * (index + 0.5),
            to_x(mean),
            to_x(low),
            to_x(high),
            f"{label}: {mean:.3g} [{low:.3g}, {high:.3g}]",
        )
        for index, (label, mean, low, high) in enumerate(shown)
    ]
    return IntervalChart(
        title=title,
        width=WIDTH,
        height=height,
        rows=rows,
        x_ticks=[Tick(to_x(x), f"{x:.6g}") for x in ticks],
        x_title=x_title,
        plot_left=left,
        plot_right=right,
        plot_bottom=height - BOTTOM,
    )
