"""``policy.keep_failover: 1`` against node failures in the simulator: a generated month (two
node failures, on days 15 and 24, on four nodes that start without the headroom), run through
``opendrs simulate`` in a subprocess — every HA guest of a failed node restarts elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

from daemon import opendrs


def test_with_keep_failover_every_failure_restarts_every_ha_guest(tmp_path: Path) -> None:
    policy = tmp_path / "keep1.yaml"
    policy.write_text("policy: {name: keep1, keep_failover: 1}\n")
    done = opendrs(
        "simulate",
        "--generate",
        "15",
        "--nodes",
        "4",
        "--guests",
        "80",
        "--days",
        "25",
        "--policy",
        str(policy),
        "--format",
        "json",
        "--no-progress",
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert report["policy"] == "keep1"
    # Both failures happened and HA restarted their guests elsewhere ...
    assert report["recoveries"] > 0
    # ... every one that may restart elsewhere (pinned guests wait for their node).
    assert report["ha_unrestartable"] == 0
    assert report["capacity_violations"] == 0
