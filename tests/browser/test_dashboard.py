"""The dashboard in a real browser: ``opendrs run`` in a subprocess against the simulator (active
mode, held to a pace of wall time so that migrations stay in flight for seconds), its dashboard on
a free loopback port, opened in headless Chromium. The page must list the nodes, show a migration
while it runs — brought by its own refresh, without reloading — and log no console error. The
daemon is stopped (SIGTERM) by the test and must exit cleanly."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.browser.conftest import console_errors

from daemon import Daemon, served

#: The longest the page may take to show what the test waits for.
TIMEOUT = 90.0


def sim_config(directory: Path) -> Path:
    """The built-in demo (80 guests packed on three of 8 nodes) in active mode, 10 simulated
    seconds per second: a migration (20 to 40 simulated seconds) stays in flight for 2 to 4 s;
    a decision every 5 simulated minutes (30 s)."""
    config = directory / "opendrs.yaml"
    config.write_text(
        "mode: active\n"
        "backend: {type: sim, scenario: 'builtin:demo', days: 1, speed: 10}\n"
        "history: history.sqlite\n"
        "policy: {interval: 5m, hold: 1, smoothing: 0, threshold: 0.15}\n"
        "executor: {max_parallel: 2}\n"
        "http: {listen: '127.0.0.1:0'}\n"
    )
    return config


def wait_until(what: str, check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """``check()``'s first true answer, asked every 100 ms; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"the page never showed {what}"
        time.sleep(0.1)


def read(driver: Any, selector: str) -> list[str]:
    """The text of each element ``selector`` finds, read at once by the page itself: its script
    may swap the panel in at any moment, which leaves element references stale."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", selector
    )


def version(driver: Any) -> int:
    """The version of the snapshot the page shows."""
    return int(driver.execute_script("return document.getElementById('panel').dataset.version"))


def test_the_dashboard_shows_the_nodes_and_a_migration_while_it_runs(
    chromium: Any, tmp_path: Path
) -> None:
    with Daemon(sim_config(tmp_path)) as daemon:
        address = served(daemon)
        chromium.get(f"http://{address}/")
        assert chromium.title in ("opendrs · demo", "opendrs")
        rows = wait_until("the nodes", lambda: read(chromium, "tr.node"))
        assert [row.split()[0] for row in rows] == [f"pve{i}" for i in range(1, 9)]
        loaded = version(chromium)
        # The page refreshes itself: a newer panel is swapped in without a reload, and a
        # decision opened to show its migrations stays open.
        wait_until("a decision with migrations", lambda: read(chromium, "li.decision details"))
        key, opened_in = chromium.execute_script(
            "const details = document.querySelector('li.decision details');"
            "details.querySelector('summary').click();"
            "const panel = document.getElementById('panel');"
            "return [details.dataset.key, Number(panel.dataset.version)];"
        )
        wait_until("a newer snapshot", lambda: version(chromium) > max(loaded, opened_in))
        still = chromium.execute_script(
            'const d = document.querySelector(`details[data-key="${arguments[0]}"]`);'
            "return d ? [d.open, d.innerText] : null;",
            key,
        )
        assert still is not None and still[0] and "step 1:" in still[1]
        flying = wait_until("a migration in flight", lambda: read(chromium, "tr.in-flight"))
        guest, route, _ = flying[0].split("\t")
        assert re.fullmatch(r"[a-z]+-\d{3} \(\d+\)", guest), flying[0]  # name (id)
        assert re.fullmatch(r"pve\d → pve\d", route), flying[0]
        shot = tmp_path / "dashboard.png"
        assert chromium.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        decisions = read(chromium, "li.decision")
        assert any("plan" in d and "threshold" in d for d in decisions)
        assert chromium.execute_script("return performance.navigation.type") == 0  # no reload
        assert console_errors(chromium) == []
        assert daemon.stop() == 0
    assert "stopping: state recorded" in daemon.log()
    assert "Traceback" not in daemon.log()
