"""Rendering reports (opendrs.report.render) and the simulation report's figures per day."""

from __future__ import annotations

import pytest

from opendrs.cli.simulate import PolicyTrace
from opendrs.cli.simulation_report import _hourly, _per_day
from opendrs.report.charts import line_chart
from opendrs.report.render import Document, inline_svg, render


def test_inline_svg_names_no_url_and_keeps_the_drawing() -> None:
    svg = line_chart({"a": [(0, 1), (1, 2)]}, title="t", xlabel="x", ylabel="y")
    assert "http" in svg  # matplotlib's metadata and namespaces
    inline = str(inline_svg(svg))
    assert "http" not in inline and "<metadata" not in inline
    assert inline.startswith("<svg") and inline.count("<path") == svg.count("<path")


def test_markdown_values_are_never_markup_and_stay_in_their_cell() -> None:
    document = Document(
        "history",
        "t",
        {
            "config": "c|1",
            "history": "<h1>x</h1>",
            "cluster": "c",
            "backend": "sim",
            "mode": "shadow",
            "metric": "spread",
            "threshold": "15.0 pp",
            "first": None,
            "latest": None,
            "counts": {
                "decisions": 0,
                "acted": 0,
                "migrations": 0,
                "done": 0,
                "failed": 0,
                "lost": 0,
                "in flight": 0,
            },
            "codes": [],
            "days": [],
            "failures": [],
            "avoid_after_failure": 3600,
            "avoided": [],
            "movers": [],
            "actions": [],
            "shadow": {"decisions": 0, "latest": [], "last": None, "last_moves": []},
        },
    )
    text = render(document, "md")
    assert "History &lt;h1&gt;x&lt;/h1&gt; of configuration c\\|1" in text
    html = render(document, "html")
    assert "&lt;h1&gt;x&lt;/h1&gt;" in html and "<h1>x</h1>" not in html
    assert text == render(document, "md")


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="pdf"):
        render(Document("plan", "t", {}), "pdf")


def test_simulation_figures_per_day_and_per_hour() -> None:
    # Steps of 30 minutes over a day and a half: 72 steps; day 2 holds half a day.
    trace = PolicyTrace(
        policy="p",
        step=1800.0,
        spreads=tuple(0.1 if k < 48 else 0.3 for k in range(72)),
        migrations=(0.0, 100.0, 86_400.0),
        failed=(100.0,),
    )
    day = _per_day(trace, 2)
    assert day["migrations"] == [2, 1] and day["failed"] == [1, 0]
    assert day["mean_spread"] == pytest.approx([0.1, 0.3])
    hourly = _hourly(trace)
    assert len(hourly) == 36
    assert hourly[0] == pytest.approx((0.0, 10.0)) and hourly[-1][1] == pytest.approx(30.0)
