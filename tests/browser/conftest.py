"""Headless Chromium for the browser tests, driven through Selenium (``chromium.py``).

Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``, ``/usr/bin/chromedriver``)
are installed by ``tools/install-test-packages`` when ``make test`` runs as root; without them the
tests here skip with that reason. Chromium starts off the network — this machine has none beyond
loopback — with a fresh profile under the test's temporary directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.browser.chromium import missing, start_chromium


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[object]:
    """A headless Chromium WebDriver with the browser's console log kept; quit afterwards."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    driver = start_chromium(tmp_path)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: object) -> list[str]:
    """The page's console messages at level SEVERE (errors, failed loads) since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
