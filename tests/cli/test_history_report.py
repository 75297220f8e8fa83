"""The history report of a daemon that has recorded nothing yet: every section says so."""

from __future__ import annotations

from pathlib import Path

from opendrs.cli.report_command import report_of_history
from opendrs.controller.history import History
from opendrs.report.render import render


def test_an_empty_history_gives_a_report_that_says_it_is_empty(tmp_path: Path) -> None:
    History(tmp_path / "history.sqlite").close()
    config = tmp_path / "opendrs.yaml"
    config.write_text("backend: {type: sim, scenario: 'builtin:demo'}\nhistory: history.sqlite\n")
    document = report_of_history(str(config))
    assert document.charts() == {}
    html = render(document, "html")
    assert "The history is empty." in html and "<svg" not in html
    assert "No migration failed or was lost." in html and "No guest was migrated." in html
    text = render(document, "md")
    assert "The history is empty." in text and "No guest was migrated." in text
