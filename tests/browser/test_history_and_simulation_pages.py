"""The history report (``opendrs report --config``, after a daemon ran against the simulator)
and the simulation report (``opendrs simulate --report``) opened in headless Chromium: their
sections and charts are displayed, the page logs no console error; a screenshot of each is kept
in the test's temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

from tests.browser.conftest import console_errors

from daemon import opendrs, write_sim_config


def assert_charts_drawn(driver: object) -> list[str]:
    """The two charts are displayed at a readable size; their labels."""
    figures = driver.find_elements("css selector", "figure.chart")
    assert len(figures) == 2
    for figure in figures:
        svg = figure.find_element("css selector", "svg")
        assert svg.is_displayed()
        assert svg.size["width"] > 300 and svg.size["height"] > 100
        assert svg.find_elements("css selector", "path, polyline, rect, line")
    return [figure.get_attribute("aria-label") for figure in figures]


def assert_shown_cleanly(driver: object, shot: Path) -> None:
    assert console_errors(driver) == []
    assert driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


def test_the_history_report_opens_in_a_browser(chromium, tmp_path: Path) -> None:
    config = write_sim_config(tmp_path, days=0.25)
    ran = opendrs("run", "--config", str(config), timeout=60)
    assert ran.returncode == 0, ran.stderr
    report = tmp_path / "history.html"
    done = opendrs("report", "--config", str(config), "-o", str(report), timeout=60)
    assert done.returncode == 0, done.stderr
    history = json.loads(opendrs("history", "--config", str(config), "--format", "json").stdout)
    chromium.get(report.as_uri())
    assert chromium.title == "opendrs history report: demo"
    for section in ("summary", "spread", "per-day", "movers", "decisions"):
        assert chromium.find_element("css selector", f"section#{section}").is_displayed()
    summary = chromium.find_element("css selector", "section#summary").text.split()
    assert summary[summary.index("migrations") - 1] == str(len(history["migrations"]))
    movers = chromium.find_elements("css selector", "tr.mover")
    moved = {m["guest"] for m in history["migrations"]}
    assert movers and all(row.is_displayed() for row in movers)
    shown = {row.find_element("css selector", "td").text for row in movers}  # name (id)
    assert {text.rsplit(" ", 1)[-1].strip("()") for text in shown} <= moved
    labels = assert_charts_drawn(chromium)
    assert any("spread" in label for label in labels)
    assert any("migrations per day" in label for label in labels)
    assert_shown_cleanly(chromium, tmp_path / "history.png")


def test_the_simulation_report_opens_in_a_browser(chromium, tmp_path: Path) -> None:
    report = tmp_path / "simulation.html"
    args = ("simulate", "builtin:demo", "--days", "0.25", "--policy", "opendrs,proxlb")
    done = opendrs(*args, "--no-progress", "--format", "json", "--report", str(report), timeout=60)
    assert done.returncode == 0, done.stderr
    stability = json.loads(done.stdout)
    chromium.get(report.as_uri())
    assert chromium.title == "opendrs simulation report: builtin:demo"
    rows = chromium.find_elements("css selector", "tr.policy")
    assert all(row.is_displayed() for row in rows)
    assert [row.find_element("css selector", "td").text for row in rows] == [
        r["policy"] for r in stability
    ]
    labels = assert_charts_drawn(chromium)
    assert labels == ["spread over time, each policy", "migrations per simulated day, each policy"]
    for figure in chromium.find_elements("css selector", "figure.chart"):
        assert "opendrs" in figure.text and "proxlb" in figure.text
    assert_shown_cleanly(chromium, tmp_path / "simulation.png")
