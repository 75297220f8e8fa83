"""The simulator paced to wall time (``backend: {type: sim, speed: N}``) wakes the daemon as a real
clock does: ``opendrs approve`` and ``balance-now`` (SIGUSR1) are taken at once, not at the end
of the interval the daemon was sleeping through; and the decision balance now asks for is
recorded, and held to the migration windows; in manual mode it proposes at once. ``opendrs run`` in
a subprocess."""

from __future__ import annotations

import json
import re
from pathlib import Path

from daemon import Daemon, opendrs

PROPOSED = r"proposal ([0-9a-f]{8}) \(balance\) waits for approval"


def paced_manual_config(directory: Path) -> Path:
    """Manual mode on the built-in demo at one simulated second per second, deciding hourly."""
    config = directory / "opendrs.yaml"
    config.write_text(
        "mode: manual\n"
        "backend: {type: sim, scenario: 'builtin:demo', days: 60, speed: 1}\n"
        "history: history.sqlite\n"
        "policy: {interval: 1h, hold: 1, smoothing: 0}\n"
    )
    return config


def test_an_approval_is_taken_at_once_on_a_paced_simulation(tmp_path: Path) -> None:
    config = paced_manual_config(tmp_path)
    with Daemon(config) as daemon:
        match = re.search(PROPOSED, daemon.wait_for(PROPOSED, timeout=60))
        assert match is not None
        done = opendrs("approve", match.group(1), "--config", str(config), timeout=60)
        assert done.returncode == 0, done.stderr
        assert "takes it now" in done.stdout
        # the next cycle is an hour away (of simulated time, an hour of wall time at speed 1)
        daemon.wait_for(rf"proposal {match.group(1)} approved by \S+@cli: checked again", 30)
        daemon.wait_for(r"started \S+ \(\d+\) pve\d → pve\d", timeout=30)
        assert daemon.stop() == 0
    listed = opendrs("proposals", "--all", "--config", str(config), "--format", "json")
    (approved,) = [p for p in json.loads(listed.stdout)["proposals"] if p["id"] == match.group(1)]
    assert approved["state"] == "started"


def test_balance_now_is_recorded_and_waits_for_a_closed_window(tmp_path: Path) -> None:
    """Active mode, its window closed (the simulation starts on a Thursday): balance now makes a
    decision at once, ignoring the hold, but starts nothing outside the window — and the decision
    is in the history (status shows it), though the last one said the same."""
    config = paced_manual_config(tmp_path)
    text = config.read_text().replace("mode: manual", "mode: active")
    window = "timezone: UTC, windows: ['Sat 00:00-01:00']"
    config.write_text(text.replace("hold: 1,", f"hold: 6, {window},"))
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(active\): .* for 1 of 6 observations; outside the migration")
        done = opendrs("balance-now", "--config", str(config), timeout=60)
        assert done.returncode == 0, done.stderr
        daemon.wait_for(r"balance now, asked by \S+@cli", timeout=30)
        daemon.wait_for(r"for 1 of 1 observations; outside the migration window", timeout=30)
        assert daemon.count(r"started ") == 0
        assert daemon.stop() == 0
    shown = opendrs("history", "--config", str(config), "--format", "json", timeout=60)
    decisions = json.loads(shown.stdout)["decisions"]
    assert [d["code"] for d in decisions] == ["outside-window", "outside-window"]
    assert json.loads(shown.stdout)["migrations"] == []


def test_balance_now_in_manual_mode_proposes_at_once_and_a_rejection_starts_nothing(
    tmp_path: Path,
) -> None:
    """Manual mode, a hold of six hourly observations: balance now proposes at once what the
    daemon would have proposed six hours on; rejected, nothing starts and it stays rejected."""
    config = paced_manual_config(tmp_path)
    config.write_text(config.read_text().replace("hold: 1,", "hold: 6,"))
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(manual\): .* for 1 of 6 observations")
        assert daemon.count(PROPOSED) == 0
        done = opendrs("balance-now", "--config", str(config), timeout=60)
        assert done.returncode == 0, done.stderr
        daemon.wait_for(r"balance now, asked by \S+@cli", timeout=30)
        match = re.search(PROPOSED, daemon.wait_for(PROPOSED, timeout=30))
        assert match is not None
        done = opendrs("reject", match.group(1), "--config", str(config), timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"proposal {match.group(1)} rejected by" in done.stdout
        assert daemon.count(r"started ") == 0
        assert daemon.stop() == 0
    listed = opendrs("proposals", "--all", "--config", str(config), "--format", "json")
    states = [(p["id"], p["state"]) for p in json.loads(listed.stdout)["proposals"]]
    assert states == [(match.group(1), "rejected")]
    shown = opendrs("history", "--config", str(config), "--format", "json", timeout=60)
    assert json.loads(shown.stdout)["migrations"] == []
