"""Rule semantics through the command line (issue #12): node priorities are tiers a full node
falls through, and HA states the HA manager handles keep a guest where it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opendrs.cli.main import main

# n1 (priority 2) is full: 'big' is pinned there with 14 of 16 GiB. Guest 1 (4 GiB) sits outside
# its strict rule on n3 and must go to n2, the next priority.
TIERS = """\
version: 1
nodes:
  n1: {cpu: 8, memory: 16GiB}
  n2: {cpu: 8, memory: 16GiB}
  n3: {cpu: 8, memory: 16GiB}
guests:
  - {id: big, node: n1, memory: 14GiB, uptime: 1d}
  - {id: 1, node: n3, memory: 4GiB, uptime: 1d}
  - {id: 2, node: n3, memory: 4GiB, uptime: 1d}
rules:
  - {type: pin, name: keep, guests: [big], nodes: [n1]}
  - {type: node-affinity, name: tiers, guests: [1], nodes: {n1: 2, n2: 1}, strict: true}
"""

HELD = ("error", "freeze", "fence", "recovery", "stopped")
HA = (
    "version: 1\nnodes: {a: {cpu: 8, memory: 32GiB}, b: {cpu: 8, memory: 32GiB}}\nguests:\n"
    + "".join(
        f"  - {{id: {i}, node: a, memory: 4GiB, uptime: 1d, ha: true, ha_state: {state}}}\n"
        for i, state in enumerate((*HELD, "started", "started"), start=1)
    )
)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main([*argv, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_place_uses_the_next_priority_when_the_top_is_full(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _write(tmp_path, "tiers.yaml", TIERS)
    code, out = _json(capsys, "place", path, "--guest", "1")
    assert code == 0 and out["best"] == "n2"
    reasons = {r["node"]: r["reason"] for r in out["rejected"]}
    assert reasons["n1"] == (
        "strict node affinity (tiers): priority 2 has no room for it, priority 1 is used"
    )


def test_evacuate_and_plan_use_the_next_priority_when_the_top_is_full(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _write(tmp_path, "tiers.yaml", TIERS)
    code, out = _json(capsys, "place", path, "--evacuate", "n3")
    assert code == 0 and out["stuck"] == []
    assert {m["guest"]: m["target"] for m in out["moves"]}["1"] == "n2"
    code, out = _json(capsys, "plan", path)
    assert code == 0 and out["notes"] == []
    assert {m["guest"]: m["target"] for m in out["moves"]}["1"] == "n2"


def test_plan_never_moves_a_guest_in_a_held_ha_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _write(tmp_path, "ha.yaml", HA)
    code, out = _json(capsys, "plan", path)
    assert code == 0
    moved = {m["guest"] for m in out["moves"]}
    assert moved and moved <= {"6", "7"}


def test_evacuation_names_the_ha_state_that_holds_a_guest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _write(tmp_path, "ha.yaml", HA)
    code, out = _json(capsys, "place", path, "--evacuate", "a")
    assert code == 1
    assert {m["guest"] for m in out["moves"]} == {"6", "7"}
    assert out["stuck"] == [
        {"guest": str(i), "reason": f"HA state {state}"} for i, state in enumerate(HELD, start=1)
    ]
