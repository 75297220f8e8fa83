"""bench.distance: the migrations foresight needs at a given time above the threshold, the chart."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.distance import chart, daily_points, needed


def test_needed_reads_the_curve_between_its_points() -> None:
    moves, pct = [10, 20, 30], [90.0, 70.0, 60.0]
    assert needed(moves, pct, 90.0) == 10.0
    assert needed(moves, pct, 80.0) == pytest.approx(15.0)
    assert needed(moves, pct, 65.0) == pytest.approx(25.0)
    assert needed(moves, pct, 50.0) is None  # beyond the curve
    assert needed(moves, pct, 95.0) is None  # the curve starts below it


def test_chart_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    chart(
        path,
        [10, 20],
        {"foresight": [80.0, 60.0], "day 0": [90.0, 70.0]},
        [("default", 150, 55.0), ("budget 1", 60, 96.0), ("daily 3d", 140, 45.0)],
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_daily_points_are_reused_under_their_keys() -> None:
    stored = {
        "daily 3d": {"migrations": 150, "pct_time_above_threshold": 43.8},
        "daily 3d budget 2": {"migrations": 80, "pct_time_above_threshold": 70.0},
    }
    saved: list[int] = []
    points = daily_points(3, [2], stored, lambda: saved.append(1))
    assert points == [("daily 3d", 150, 43.8), ("daily 3d budget 2", 80, 70.0)]
    assert not saved  # nothing run, nothing saved
