"""Chart layout: every finite point becomes a dot inside the plot area, a spread becomes a band."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from art_proxy.dashboard.plots import HEIGHT, WIDTH, Series, line_chart
from art_proxy.dashboard.training_charts import reward_chart
from art_proxy.records import TrainingStep


def test_no_points_means_no_chart() -> None:
    assert line_chart("Reward", [Series("reward", [])]) is None
    assert line_chart("Loss", [Series("loss", [(1, math.nan), (2, math.inf)])]) is None


def test_every_finite_point_is_a_dot_inside_the_plot() -> None:
    chart = line_chart("Loss", [Series("loss", [(1, 2.0), (2, math.nan), (3, 0.5), (4, 1.0)])])
    assert chart is not None
    (line,) = chart.lines
    assert [dot.label for dot in line.dots] == [
        "loss, step 1: 2",
        "loss, step 3: 0.5",
        "loss, step 4: 1",
    ]
    for dot in line.dots:
        assert chart.plot_left <= dot.x <= chart.plot_right <= WIDTH
        assert chart.plot_top <= dot.y <= chart.plot_bottom <= HEIGHT
    highest = min(line.dots, key=lambda dot: dot.y)
    assert highest.label.endswith(": 2")  # SVG y grows downwards
    assert line.path.startswith("M") and line.path.count("L") == 2


def test_a_spread_is_a_closed_band_and_widens_the_range() -> None:
    chart = line_chart("Reward", [Series("reward", [(1, 0.5), (2, 0.6)], [0.2, 0.1])])
    assert chart is not None
    (line,) = chart.lines
    assert line.band is not None and line.band.endswith("Z")
    labels = [float(tick.label) for tick in chart.y_ticks]
    assert min(labels) <= 0.3 and max(labels) >= 0.7


def test_one_point_gets_a_range_around_it() -> None:
    chart = line_chart("KL", [Series("kl", [(3, 0.0)])])
    assert chart is not None
    assert [tick.label for tick in chart.x_ticks] == ["3"]
    (dot,) = chart.lines[0].dots
    assert chart.plot_top < dot.y < chart.plot_bottom


def test_many_steps_get_at_most_eight_whole_step_ticks() -> None:
    chart = line_chart("Reward", [Series("reward", [(step, step / 100) for step in range(1, 101)])])
    assert chart is not None
    assert 2 <= len(chart.x_ticks) <= 8
    assert all(float(tick.label).is_integer() for tick in chart.x_ticks)


def test_series_keep_their_colour_when_an_earlier_one_is_empty() -> None:
    chart = line_chart("Reward", [Series("train", []), Series("validation", [(1, 0.4)])])
    assert chart is not None
    assert [(line.name, line.index) for line in chart.lines] == [("validation", 1)]


def test_y_ticks_fall_on_round_values() -> None:
    """Once: ticks at 0.0424, 0.736 and the like (the range split in four)."""
    chart = line_chart("KL", [Series("kl", [(1, 0.0424), (2, 0.736)])])
    assert chart is not None
    labels = [float(tick.label) for tick in chart.y_ticks]
    assert labels == [0.0, 0.2, 0.4, 0.6, 0.8]


def test_a_reward_band_stays_within_the_rewards_bounds() -> None:
    """A mean of 0.1 with a spread of 0.3 once drew the band (and the axis) down to -0.2."""
    series = [Series("reward", [(1, 0.1), (2, 0.9)], [0.3, 0.3])]
    chart = line_chart("Reward", series, floor=0.0, ceiling=1.0)
    assert chart is not None
    labels = [float(tick.label) for tick in chart.y_ticks]
    assert min(labels) == 0.0 and max(labels) == 1.0
    (line,) = chart.lines
    assert line.band is not None
    ys = [float(point.split(",")[1]) for point in line.band.removesuffix(" Z").split(" ")]
    assert chart.plot_top <= min(ys) and max(ys) <= chart.plot_bottom


def test_a_count_flat_at_zero_is_drawn_from_zero_up() -> None:
    """Staleness 0 at every step once drew its axis from -1."""
    chart = line_chart("Staleness", [Series("max", [(1, 0.0), (2, 0.0)])], floor=0.0)
    assert chart is not None
    assert float(chart.y_ticks[0].label) == 0.0


def test_the_base_models_validation_is_the_reward_charts_point_at_step_0() -> None:
    """The validation before the first step (the base model) was in the run's log but not on
    the chart, which began at step 1."""
    created = datetime(2026, 11, 28, tzinfo=UTC)
    steps = [
        TrainingStep(
            run="run",
            step=number,
            status="applied",
            metrics=metrics,
            created_at=created,
        )
        for number, metrics in [
            (1, {"reward_mean": 0.2, "val_reward_base": 0.1}),
            (2, {"reward_mean": 0.4, "val_reward": 0.5}),
        ]
    ]
    chart = reward_chart(steps)
    assert chart is not None
    assert chart.x_ticks[0].label == "0"
    validation = [line for line in chart.lines if line.name == "validation reward"]
    assert [dot.label for dot in validation[0].dots] == [
        "validation reward, step 0: 0.1",
        "validation reward, step 2: 0.5",
    ]
