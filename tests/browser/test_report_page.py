"""The HTML report opened in headless Chromium: the nodes are listed, the charts are drawn, the
page logs no console error (nothing failed to load: it needs nothing outside itself)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.browser.conftest import console_errors

from daemon import opendrs


def test_the_plan_report_opens_in_a_browser_with_its_nodes_and_charts(
    chromium, tmp_path: Path
) -> None:
    report = tmp_path / "report.html"
    done = opendrs("report", "demo", "-o", str(report))
    assert done.returncode == 0, done.stderr
    nodes = [
        n["name"] for n in json.loads(opendrs("show", "demo", "--format", "json").stdout)["nodes"]
    ]
    chromium.get(report.as_uri())
    assert chromium.title == "opendrs plan report: demo"
    rows = chromium.find_elements("css selector", "#nodes tr.node")
    assert [row.find_element("css selector", "td").text for row in rows] == nodes
    charts = chromium.find_elements("css selector", "figure.chart svg")
    assert len(charts) == 2
    assert all(chart.size["width"] > 300 and chart.size["height"] > 100 for chart in charts)
    assert chromium.find_elements("css selector", ".timeline li.move")
    assert console_errors(chromium) == []
    shot = tmp_path / "report.png"
    assert chromium.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
