"""``opendrs simulate`` says whose each capacity violation is: generated seed 102 (6 nodes, 100
guests, 70 % filled) under ``keep_failover: 1`` judged by Proxmox's static recovery has two
(node, step) pairs over capacity on day 4.40 — node04's three 8-vCPU batch guests, there from
the start, running flat out with the rest at 35.2 of its 32 cores, no move in flight and none
onto node04 for 2.8 days — the guests' own load, which the repair then relieves
(docs/scenarios.md, "What the simulator reports")."""

from __future__ import annotations

import json
from pathlib import Path

from daemon import opendrs


def test_the_seed_102_violations_are_the_guests_load(tmp_path: Path) -> None:
    policy = tmp_path / "kf-static.yaml"
    policy.write_text(
        "policy: {name: kf-static, keep_failover: 1, failover_recovery: pve-static}\n"
    )
    report_md = tmp_path / "report.md"
    args = ("simulate", "--generate", "102", "--nodes", "6", "--guests", "100", "--fill", "0.7")
    done = opendrs(
        *args,
        "--days",
        "4.45",
        "--policy",
        str(policy),
        "--format",
        "json",
        "--no-progress",
        "--report",
        str(report_md),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    over = report["capacity_violations"]
    assert over > 0
    assert report["capacity_violations_by"] == {
        "moves": 0,
        "platform": 0,
        "placement": 0,
        "load": over,
    }
    assert f"| {over} (load {over}) |" in report_md.read_text()
