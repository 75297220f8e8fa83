"""``opendrs plan`` moves the cheaper of two guests that balance alike (#30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opendrs.cli.main import main

#: Node a holds three guests of 4 vCPUs and 8 GiB, the first with a 100 GiB local disk; b and c
#: one small guest each. Two of a's guests must go, and either of the diskless two balances as
#: the one with the disk does.
TWINS = """\
version: 1
settings: {mode: static, allow_local_disks: true}
nodes:
  a: {cpu: 16, memory: 32GiB, storage: {local-lvm: 500GiB}}
  b: {cpu: 16, memory: 32GiB, storage: {local-lvm: 500GiB}}
  c: {cpu: 16, memory: 32GiB, storage: {local-lvm: 500GiB}}
guests:
  - {id: "100", node: a, cpu: 4, memory: 8GiB, disks: [{pool: local-lvm, size: 100GiB}]}
  - {id: "101", node: a, cpu: 4, memory: 8GiB}
  - {id: "102", node: a, cpu: 4, memory: 8GiB}
  - {id: "103", node: b, cpu: 2, memory: 4GiB}
  - {id: "104", node: c, cpu: 2, memory: 4GiB}
"""


def _plan(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, object]:
    code = main(["plan", str(path), "--format", "json"])
    out, _ = capsys.readouterr()
    assert code == 0
    data: dict[str, object] = json.loads(out)
    return data


def test_plan_moves_the_diskless_twins(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "twins.yaml"
    path.write_text(TWINS)
    data = _plan(capsys, path)
    moves = data["moves"]
    assert isinstance(moves, list)
    assert sorted(m["guest"] for m in moves) == ["101", "102"]
    assert {m["target"] for m in moves} == {"b", "c"}
    assert data["cost"] == 2 * 32  # 8 GiB in 256 MiB units each, no disk to copy


def test_a_twin_in_a_rule_stays(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # 102 is pinned to a (and may go nowhere else): the guest with the disk moves in its place.
    path = tmp_path / "twins.yaml"
    path.write_text(TWINS + "rules:\n  - {type: pin, guests: ['102'], nodes: [a]}\n")
    data = _plan(capsys, path)
    moves = data["moves"]
    assert isinstance(moves, list)
    assert sorted(m["guest"] for m in moves) == ["100", "101"]
