"""``opendrs place --failed``: the failed node is offline, never ranked (issue #12 part 3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opendrs.cli.main import main

# Guest 1 sits alone on the emptiest node: were a ranked, it would come first.
SNAPSHOT = """\
version: 1
nodes: {a: {cpu: 8, memory: 32GiB}, b: {cpu: 8, memory: 32GiB}, c: {cpu: 8, memory: 32GiB}}
guests:
  - {id: 1, node: a, memory: 1GiB}
  - {id: 2, node: a, memory: 1GiB}
  - {id: 3, node: b, memory: 8GiB}
  - {id: 4, node: c, memory: 8GiB}
"""


@pytest.fixture
def snapshot(tmp_path: Path) -> str:
    path = tmp_path / "failed.yaml"
    path.write_text(SNAPSHOT)
    return str(path)


def _place(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main(["place", *argv, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_place_guest_failed_never_ranks_the_failed_node(
    capsys: pytest.CaptureFixture[str], snapshot: str
) -> None:
    code, out = _place(capsys, snapshot, "--guest", "1", "--failed")
    assert code == 0
    assert out["best"] == "b"
    assert [r["node"] for r in out["ranking"]] == ["b", "c"]  # type: ignore[union-attr]
    assert out["rejected"] == [{"node": "a", "reason": "node offline"}]


def test_place_guest_without_failed_still_ranks_its_node(
    capsys: pytest.CaptureFixture[str], snapshot: str
) -> None:
    code, out = _place(capsys, snapshot, "--guest", "1")
    assert code == 0 and out["best"] == "a"


def test_place_evacuate_failed_never_targets_the_failed_node(
    capsys: pytest.CaptureFixture[str], snapshot: str
) -> None:
    code, out = _place(capsys, snapshot, "--evacuate", "a", "--failed")
    assert code == 0 and out["stuck"] == []
    assert {m["target"] for m in out["moves"]} <= {"b", "c"}  # type: ignore[union-attr]
    assert len(out["moves"]) == 2  # type: ignore[arg-type]


def test_place_failed_with_no_other_node_fails(tmp_path: Path) -> None:
    path = tmp_path / "alone.yaml"
    path.write_text(
        "version: 1\n"
        "nodes: {a: {cpu: 8, memory: 32GiB}, b: {cpu: 8, memory: 4GiB}}\n"
        "guests:\n"
        "  - {id: 1, node: a, memory: 8GiB}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "opendrs", "place", str(path), "--guest", "1", "--failed"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "no node can take it" in done.stdout
    assert "node offline" in done.stdout
