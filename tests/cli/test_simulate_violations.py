"""``opendrs simulate`` says whose each capacity violation is (docs/scenarios.md, "What the
simulator reports"): on a one-node cluster whose two 4-vCPU batch guests run flat out on its 4
cores, every step is over capacity and no move could help — the guests' own load, in the JSON
and in the report's cell. (The small cases of each cause are in tests/backends/
test_sim_violations.py; the generated month that first showed one, seed 102 under
``keep_failover`` judged by Proxmox's static recovery, is traced in docs/performance.md.)"""

from __future__ import annotations

import json
from pathlib import Path

from daemon import opendrs

CLUSTER = """\
version: 1
settings: {mode: dynamic}
nodes: {n1: {cpu: 4, memory: 64GiB}}
guests:
  - {id: 1, name: batch1, node: n1, cpu: 4, memory: 4GiB}
  - {id: 2, name: batch2, node: n1, cpu: 4, memory: 4GiB}
"""

BUSY = """\
version: 1
cluster: one.yaml
step: 1m
duration: 2h
workloads:
  - guests: [1, 2]
    cpu: {constant: 1.0}
"""


def test_a_nodes_own_load_over_capacity_is_the_guests_load(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(CLUSTER)
    scenario = tmp_path / "busy.yaml"
    scenario.write_text(BUSY)
    report_md = tmp_path / "report.md"
    done = opendrs(
        "simulate",
        str(scenario),
        "--policy",
        "opendrs",
        "--format",
        "json",
        "--no-progress",
        "--report",
        str(report_md),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert report["migrations"] == 0
    assert report["capacity_violations"] == 120  # every minute of the 2 hours
    assert report["capacity_violations_by"] == {
        "moves": 0,
        "platform": 0,
        "placement": 0,
        "load": 120,
    }
    assert "| 120 (load 120) |" in report_md.read_text()
