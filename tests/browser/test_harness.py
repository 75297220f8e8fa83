"""The browser harness itself: the console check sees a page's errors, screenshots are written."""

from __future__ import annotations

from pathlib import Path

from tests.browser.conftest import console_errors


def test_console_errors_are_seen_and_a_screenshot_is_written(chromium, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text(
        "<!doctype html><title>t</title><h1 id=title>ready</h1>"
        "<script>console.error('broken on purpose')</script>"
    )
    chromium.get(page.as_uri())
    assert chromium.find_element("id", "title").text == "ready"
    assert any("broken on purpose" in message for message in console_errors(chromium))
    assert console_errors(chromium) == []  # the log is drained by each read
    shot = tmp_path / "page.png"
    assert chromium.save_screenshot(str(shot))
    assert shot.stat().st_size > 1000
