"""bench.twins: the local-disk moves of a placement that leave a cheaper twin behind."""

from __future__ import annotations

import json

import pytest
from bench.twins import main, twin_figures

from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings
from opendrs.model.rules import NodeAffinity, Rules

GiB = 1024**3


def _cluster(rules: Rules | None = None) -> Cluster:
    nodes = tuple(Node(n, 16, 32 * GiB, storage={"local": 500 * GiB}) for n in "abc")
    guests = (
        Guest("100", "a", cpu=4, memory=8 * GiB, disks=(Disk("local", 100 * GiB),)),
        Guest("101", "a", cpu=4, memory=8 * GiB),
        Guest("102", "a", cpu=4, memory=8 * GiB),
        Guest("103", "a", cpu=2, memory=8 * GiB),
    )
    settings = Settings(mode="static", allow_local_disks=True)
    return Cluster(nodes, guests, rules or Rules(), settings)


def test_a_local_disk_move_with_a_twin_at_home() -> None:
    # 100 (32 + 4 × 400 units) moves where 102 (32 units) could have gone.
    figures = twin_figures(_cluster(), {"100": "b", "101": "c"})
    assert (figures.local_disk_moves, figures.with_twin) == (1, 1)
    assert figures.with_twin_share == 1.0
    assert figures.twin_cost_share == pytest.approx(1632 / (1632 + 32))
    assert figures.avoidable_cost_share == pytest.approx(1600 / (1632 + 32))


def test_no_twin_when_it_moves_differs_or_has_a_rule() -> None:
    assert twin_figures(_cluster(), {"100": "b", "101": "c", "102": "c"}).with_twin == 0
    pin = NodeAffinity("pin", ("101", "102"), {"a": 0}, strict=True)
    figures = twin_figures(_cluster(Rules(node_affinity=(pin,))), {"100": "b"})
    assert (figures.local_disk_moves, figures.with_twin) == (1, 0)  # 103: another vCPU count


def test_the_command_prints_one_line_per_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--generator", "mixed", "--sizes", "S", "--seeds", "1", "--rules", "both"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["rules"] for line in lines] == [False, True]
    assert all(line["with_twin"] == 0 and line["moves"] > 0 for line in lines)
