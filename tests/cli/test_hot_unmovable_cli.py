"""The note of a node that runs hot with no guest that may move, through ``opendrs run --once``
on a snapshot: a guest that a hard rule keeps on the node (a pin, a strict node affinity to that
node alone) counts as unable to move, as an ignored one does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon import run_once
from repairs import run_config

# n1 runs at 87 % of its 10 cores: the job (7.9 cores, held by RULE) and an ignored helper.
SNAPSHOT = """\
version: 1
name: held
settings: {{mode: dynamic}}
nodes:
  n1: {{cpu: 10, memory: 64GiB}}
  n2: {{cpu: 10, memory: 64GiB}}
  n3: {{cpu: 10, memory: 64GiB}}
  n4: {{cpu: 10, memory: 64GiB, maintenance: true}}
guests:
  - {{id: 101, name: job, node: n1, cpu: 8, memory: 4GiB, usage: {{cpu: 7.9, memory: 2GiB}},
      uptime: 1d}}
  - {{id: 102, name: helper, node: n1, cpu: 4, memory: 4GiB, usage: {{cpu: 0.8, memory: 2GiB}},
      uptime: 1d}}
  - {{id: 201, name: web, node: n2, cpu: 4, memory: 4GiB, usage: {{cpu: 2, memory: 2GiB}},
      uptime: 1d}}
rules:
  - {rule}
  - {{type: ignore, guests: [102]}}
"""
NOTE = "; n1 runs hot (above 85 %) with no guest that may move"


def decision(rule: str, tmp_path: Path) -> str:
    snapshot = tmp_path / "held.yaml"
    snapshot.write_text(SNAPSHOT.format(rule=rule))
    done = run_once(run_config(snapshot))
    assert done.returncode == 0, done.stderr
    (line,) = re.findall(r"decision \(shadow\): (.*)", done.stderr)
    return line


@pytest.mark.parametrize(
    "rule",
    [
        "{type: pin, guests: [101], nodes: [n1]}",
        "{type: node-affinity, guests: [101], nodes: [n1], strict: true}",
        # A strict node affinity whose other node is in maintenance: n1 alone is left.
        "{type: node-affinity, guests: [101], nodes: [n1, n4], strict: true}",
    ],
)
def test_a_guest_a_hard_rule_keeps_on_the_hot_node_may_not_move(rule: str, tmp_path: Path) -> None:
    said = decision(rule, tmp_path)
    assert said.endswith(NOTE), said


def test_a_strict_node_affinity_with_another_node_lets_it_move(tmp_path: Path) -> None:
    said = decision("{type: node-affinity, guests: [101], nodes: [n1, n3], strict: true}", tmp_path)
    assert NOTE not in said, said
