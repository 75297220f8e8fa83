"""The simulator paced to wall time (``backend: {type: sim, speed: N}``) wakes the daemon as a real
clock does: ``opendrs approve`` and ``balance-now`` (SIGUSR1) are taken at once, not at the end
of the interval the daemon was sleeping through. ``opendrs run`` in a subprocess."""

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
