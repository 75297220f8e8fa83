"""Inline SVG charts (opendrs.report.charts): well-formed, deterministic, labelled."""

from __future__ import annotations

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
