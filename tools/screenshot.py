"""``make screenshot``: the README's picture of the dashboard, made by the project's own demo.

Starts ``opendrs demo`` with its dashboard on a free loopback port, spread over a few minutes of
wall time, opens the page in headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
through Selenium, as the browser tests do) and, once the simulated day is past its morning and a
migration is in flight, saves the first screen as a PNG (``docs/dashboard.png`` by default). The
demo is stopped afterwards. Exit status 0 with the picture, 1 without (the reason on stderr).

    python tools/screenshot.py [OUTPUT.png] [--after HOURS] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser.chromium import missing, start_chromium  # noqa: E402

ADDRESS = re.compile(r"dashboard: http://(127\.0\.0\.1:\d+)/")
#: The picture's size, in CSS pixels: the README's first screen.
SIZE = (1280, 960)
#: A PNG larger than this is refused: the README must stay light.
MAX_BYTES = 300_000


def start_demo(seconds: float) -> tuple[subprocess.Popen[str], str]:
    """``opendrs demo`` spread over ``seconds``, and the address of its dashboard."""
    demo = subprocess.Popen(
        [sys.executable, "-u", "-m", "opendrs", "demo", "--seconds", f"{seconds:g}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert demo.stdout is not None
    for line in demo.stdout:
        match = ADDRESS.search(line)
        if match:
            return demo, match.group(1)
    demo.wait(10)
    raise SystemExit(f"error: opendrs demo ended (status {demo.returncode}) before its dashboard")


def state(address: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address}/api/state", timeout=10) as answer:
        return json.loads(answer.read())


def ready(data: dict[str, Any], after: float) -> bool:
    """Past ``after`` simulated hours, with a migration in flight."""
    observed = data["observation"]
    return bool(observed and observed["at"] >= after * 3600 and data["in_flight"])


def shoot(driver: Any, address: str, demo: subprocess.Popen[str], after: float) -> bytes:
    """The first screen of the page at a moment a migration is in flight."""
    driver.get(f"http://{address}/")
    while demo.poll() is None:
        if ready(state(address), after):
            driver.refresh()  # the page as the snapshot is now, not at its next refresh
            if driver.find_elements("css selector", "tr.in-flight"):
                return driver.get_screenshot_as_png()
        time.sleep(0.05)
    raise SystemExit("error: the demo ended before a migration in flight could be pictured")


def stop(demo: subprocess.Popen[str]) -> None:
    """End the demo (it keeps nothing: its history is in memory)."""
    if demo.poll() is None:
        demo.terminate()
        try:
            demo.wait(15)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait(15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default=str(ROOT / "docs" / "dashboard.png"))
    parser.add_argument("--after", type=float, default=9.0, help="simulated hours (default 9)")
    parser.add_argument("--seconds", type=float, default=240.0, help="the demo's wall time")
    args = parser.parse_args()
    reason = missing()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    demo, address = start_demo(args.seconds)
    try:
        with tempfile.TemporaryDirectory(prefix="opendrs-screenshot-") as directory:
            driver = start_chromium(Path(directory), size=SIZE)
            try:
                picture = shoot(driver, address, demo, args.after)
            finally:
                driver.quit()
    finally:
        stop(demo)
    if len(picture) > MAX_BYTES:
        print(f"error: the picture has {len(picture)} bytes, over {MAX_BYTES}", file=sys.stderr)
        return 1
    Path(args.output).write_bytes(picture)
    print(f"{args.output}: {len(picture)} bytes, the dashboard of opendrs demo at {address}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
