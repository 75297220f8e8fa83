"""`opendrs show` lists the guests that break a rule right now (issue #12 part 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opendrs.cli.main import main
from opendrs.engine.breaks import rule_breaks
from opendrs.model.snapshot import load

BROKEN = """\
version: 1
nodes:
  a: {cpu: 8, memory: 32GiB}
  b: {cpu: 8, memory: 32GiB}
  c: {cpu: 8, memory: 32GiB}
guests:
  - {id: 1, node: a, memory: 2GiB}
  - {id: 2, node: a, memory: 2GiB}
  - {id: 3, node: b, memory: 2GiB}
  - {id: 4, node: c, memory: 2GiB}
  - {id: 5, node: c, memory: 2GiB}
  - {id: 6, node: b, memory: 2GiB}
rules:
  - {type: anti-affinity, name: apart, guests: [1, 2, 3]}
  - {type: anti-affinity, name: loose, guests: [4, 5], hard: false}
  - {type: affinity, name: together, guests: [3, 4]}
  - {type: pin, name: on-b, guests: [1], nodes: [b]}
  - {type: node-affinity, name: likes-a, guests: [6], nodes: {a: 1}}
  - {type: anti-affinity, name: kept, guests: [2, 6]}
"""


def test_show_lists_every_rule_broken_now(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    assert main(["show", str(path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [b["text"] for b in data["rule_breaks"]] == [
        "apart (hard anti-affinity): 1, 2 share a",
        "on-b (hard node-affinity): 1 runs on a, outside its nodes",
        "together (hard affinity): 3, 4 are spread over b, c",
        "likes-a (soft node-affinity): 6 runs on b, outside its nodes",
        "loose (soft anti-affinity): 4, 5 share c",
    ]
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Rules broken now" in out and "apart (hard anti-affinity): 1, 2 share a" in out


def test_a_cluster_that_keeps_its_rules_breaks_none(tmp_path: Path) -> None:
    path = tmp_path / "kept.yaml"
    path.write_text(BROKEN.replace("{id: 2, node: a", "{id: 2, node: c").split("rules:")[0])
    assert rule_breaks(load(path)) == []
    # A dropped rule is a rule problem, not a break.
    dropped = BROKEN.split("rules:")[0] + (
        "rules:\n  - {type: anti-affinity, name: crowd, guests: [1, 2, 3, 4]}\n"
    )
    path.write_text(dropped)
    assert rule_breaks(load(path)) == []
