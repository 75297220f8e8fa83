"""A repair that must lift the guards sends no guest back to a node it left while another node
takes it, through ``opendrs simulate`` on a hand-made scenario: two jobs held on their nodes take
them over capacity in turns, and the one guest that may move leaves the first node in the first
turn and the second node in the second — for the third node, not back to the first."""

from __future__ import annotations

import json
from pathlib import Path

from daemon import opendrs

CLUSTER = """\
version: 1
name: turns-over-capacity
settings: {min_uptime: 0}
nodes:
  a: {cpu: 8, memory: 64GiB}
  b: {cpu: 8, memory: 64GiB}
  c: {cpu: 8, memory: 64GiB}
guests:
  - {id: 101, node: a, cpu: 8, memory: 8GiB, usage: {cpu: 0.5, memory: 4GiB}, uptime: 1d,
     tags: [job-a]}
  - {id: 102, node: b, cpu: 8, memory: 8GiB, usage: {cpu: 0.5, memory: 4GiB}, uptime: 1d,
     tags: [job-b]}
  - {id: 103, node: c, cpu: 4, memory: 8GiB, usage: {cpu: 3, memory: 4GiB}, uptime: 1d,
     tags: [busy]}
  - {id: 110, node: a, cpu: 2, memory: 4GiB, usage: {cpu: 1.5, memory: 2GiB}, uptime: 1d,
     tags: [steady]}
rules:
  - {type: ignore, guests: [101, 102], reason: batch jobs held on their node}
"""

SCENARIO = """\
version: 1
name: turns-over-capacity
cluster: cluster.yaml
step: 1m
duration: 6h
workloads:
  - tag: job-a
    cpu: {constant: 0.06, surges: [{at: 1h, height: 0.84, last: 50m}]}
  - tag: job-b
    cpu: {constant: 0.06, surges: [{at: 3h, height: 0.84, last: 50m}]}
  - {tag: busy, cpu: {constant: 0.75}}
  - {tag: steady, cpu: {constant: 0.75}}
"""


def test_a_repair_in_the_second_turn_sends_no_guest_back(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    done = opendrs(
        "simulate", str(scenario), "--policy", "opendrs", "--format", "json", "--no-progress"
    )
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    # 110 leaves a in a's turn and b in b's: two repairs, and neither goes back.
    assert (report["repair_migrations"], report["migrations"]) == (2, 2)
    assert report["ping_pongs"] == 0
