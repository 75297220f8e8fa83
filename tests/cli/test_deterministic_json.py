"""The same snapshot gives the same JSON, byte for byte, run after run: ``plan --strategy optimal``
included — its solve time is a measurement, printed by ``-v`` on standard error, not in the plan —
and a plan of an over-full cluster that the exact repair (CP-SAT) mends."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.daemon import opendrs

from repairs import write

#: Node a holds three guests, b and c one each: CP-SAT proves the optimum in an instant.
SMALL = """\
version: 1
settings: {mode: static}
nodes:
  a: {cpu: 16, memory: 32GiB}
  b: {cpu: 16, memory: 32GiB}
  c: {cpu: 16, memory: 32GiB}
guests:
  - {id: "100", node: a, cpu: 4, memory: 8GiB}
  - {id: "101", node: a, cpu: 4, memory: 8GiB}
  - {id: "102", node: a, cpu: 4, memory: 8GiB}
  - {id: "103", node: b, cpu: 2, memory: 4GiB}
  - {id: "104", node: c, cpu: 2, memory: 4GiB}
"""


def test_an_exact_repair_plan_json_is_the_same_bytes_twice(tmp_path: Path) -> None:
    # Node a is over its memory and nothing fits anywhere until 4 leaves c for b: the greedy
    # repair is stuck, the exact repair (CP-SAT) moves 4 first (tests/repairs.py).
    argv = ("plan", str(write(tmp_path, "overload")), "--format", "json")
    first, second = opendrs(*argv, timeout=120), opendrs(*argv, timeout=120)
    assert first.returncode == 0, first.stderr
    found = json.loads(first.stdout)
    assert found["options"]["repair"]["deterministic"] is True
    assert [(m["guest"], m["target"]) for m in found["moves"]] == [("4", "b"), ("3", "c")]
    assert first.stdout == second.stdout


def test_optimal_plan_json_is_the_same_bytes_twice(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    argv = ("plan", str(path), "--strategy", "optimal", "--format", "json")
    first, second = opendrs(*argv, timeout=120), opendrs(*argv, timeout=120)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["moves"], "the plan moves a guest off the loaded node"
    assert first.stdout == second.stdout
    assert "wall" not in first.stdout and " ms" not in first.stdout


def test_verbose_plan_gives_its_wall_time_on_stderr_only(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    done = opendrs("plan", str(path), "--strategy", "optimal", "--format", "json", "-v")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"plan: planned in \d+ ms of wall time\n", done.stderr)
    assert " ms" not in done.stdout
