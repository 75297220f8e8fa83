"""``policy.keep_failover: 1`` against node failures in the simulator: the first 7 days of a
generated month (two node failures, on days 1.8 and 6.2, on four nodes that start without the
headroom), run through ``opendrs simulate`` in a subprocess — every HA guest of a failed node
restarts elsewhere; and ``--failover-check``, which fails every node each simulated hour on a copy
of the cluster."""

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
        "78",
        "--nodes",
        "4",
        "--guests",
        "80",
        "--days",
        "7",
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


def test_failover_check_tries_every_node_each_hour_in_each_mode(tmp_path: Path) -> None:
    policy = tmp_path / "keep1.yaml"
    policy.write_text("policy: {name: keep1, keep_failover: 1}\n")
    args = ("simulate", "--generate", "15", "--nodes", "4", "--guests", "40", "--fill", "0.8")
    checks = ("--failover-check", "basic,static,opendrs", "--days", "0.25", "--no-progress")
    done = opendrs(*args, *checks, "--policy", f"opendrs,{policy}", "--format", "json")
    assert done.returncode == 0, done.stderr
    plain, kept = json.loads(done.stdout)
    for report in (plain, kept):
        failover = report["failover"]
        assert failover["checks"] == 6  # hours 0 to 5 of 6
        for mode in ("basic", "static", "opendrs"):
            tally = failover[mode]
            assert tally["cases"] == 4 * failover["checks"]  # no node down in the first hours
            assert 0 <= tally["short_cases"] <= tally["cases"]
            assert tally["short_cases"] <= tally["stranded"] <= tally["worst"] * tally["cases"]
    # keep_failover gives back what balancing may lose: never worse in its own measure.
    assert kept["failover"]["opendrs"]["stranded"] <= plain["failover"]["opendrs"]["stranded"]
    text = opendrs(*args, *checks, "--policy", "opendrs", columns=300)  # lines not wrapped
    assert text.returncode == 0, text.stderr
    assert "memory 80 % filled" in text.stdout
    assert "opendrs: node failures tried hourly (Proxmox HA, basic mode restarts): " in text.stdout
    assert "(the headroom check's restarts)" in text.stdout
