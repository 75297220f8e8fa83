"""Inline SVG charts (opendrs.report.charts): well-formed, deterministic, labelled."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from opendrs.report.charts import Line, bar_chart, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def test_line_chart_is_one_svg_element_with_its_labels() -> None:
    svg = line_chart(
        {"opendrs": [(0, 5.0), (1, 3.0), (2, 1.0)], "proxmox": [(0, 5.0), (2, 4.0)]},
        title="Spread over time",
        xlabel="hours",
        ylabel="spread (pp)",
        lines=[Line(2.5, "threshold")],
    )
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    texts = _texts(svg)
    for label in ("Spread over time", "hours", "spread (pp)", "opendrs", "proxmox", "threshold"):
        assert label in texts


def test_same_data_gives_the_same_bytes() -> None:
    def draw() -> str:
        return bar_chart(
            ["n1", "n2", "n3"],
            {"before": [0.9, 0.2, 0.4], "after": [0.5, 0.5, 0.5]},
            title="memory",
            ylabel="load",
        )

    assert draw() == draw()
    assert "n2" in _texts(draw())


def test_step_chart_draws_and_bar_groups_must_match_categories() -> None:
    assert "<path" in line_chart(
        {"a": [(0, 1), (1, 2)]}, title="t", xlabel="x", ylabel="y", steps=True
    )
    with pytest.raises(ValueError, match="2 values for 3"):
        bar_chart(["a", "b", "c"], {"before": [1, 2]}, title="t", ylabel="y")


def test_many_bars_name_at_most_forty_categories_evenly() -> None:
    names = [f"node{i:03d}" for i in range(128)]
    svg = bar_chart(names, {"load": [i / 128 for i in range(128)]}, title="t", ylabel="y")
    shown = [text for text in _texts(svg) if text.startswith("node")]
    assert shown == names[::4]


def test_charts_drawn_from_several_threads_are_the_same_and_warn_of_no_glyph() -> None:
    """The dashboard draws from its request threads: each draws the same bytes, and a name the
    charts' font lacks (CJK) is no warning — in a process where a warning is an error, so that a
    glyph filter lost while another thread draws would show."""
    program = """
import threading
from opendrs.report.charts import bar_chart
drawn = []
def draw():
    for _ in range(3):
        drawn.append(bar_chart(["\u4e2d\u6587", "b"], {"x": [1, 2]}, title="t", ylabel="y"))
threads = [threading.Thread(target=draw) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert len(drawn) == 12 and len(set(drawn)) == 1, len(set(drawn))
"""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", program],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
