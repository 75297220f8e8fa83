"""Debian's headless Chromium through Selenium, for the browser tests and ``make screenshot``.

Selenium is given the paths of ``/usr/bin/chromium`` and ``/usr/bin/chromedriver``, so it never
looks for a driver of its own (no download). Chromium starts with the flags that keep it off the
network — only loopback is used — and with a fresh profile in the directory it is given.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

__all__ = ["CHROMEDRIVER", "CHROMIUM", "missing", "start_chromium"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

#: Flags that keep a headless Chromium off the network and quiet in a container.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
)


def missing() -> str | None:
    """Why Chromium cannot be driven here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[dev]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists():
            return f"{path} is missing: install Debian's {package} (make test does, as root)"
    return None


def start_chromium(directory: Path, *, size: tuple[int, int] = (1280, 900)) -> Any:
    """A headless Chromium WebDriver keeping the browser's console log, its profile and its
    driver's log in ``directory``. The caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    options.add_argument(f"--user-data-dir={directory / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(directory / "chromedriver.log"))
    return webdriver.Chrome(options=options, service=service)
