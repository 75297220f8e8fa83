"""The benchmark's generator, evaluation and peer adapters, on tiny clusters (no timings).

The spec conversions are plain data and need no peer; the tests that build the peers' own models
and run them skip cleanly when proxlb-solver or proxlb (the ``bench`` extra) is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from bench.__main__ import peer_missing, strategy_options, time_limit, too_large
from bench.generate import SIZES, generate
from bench.metrics import Evaluator
from bench.peers import proxlb_greedy, proxlb_solver
from bench.report import ratio

from opendrs.engine.constraints import Constraints, committed_for, current_assign
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3


def tiny() -> Cluster:
    """Three nodes, seven guests, every kind of rule the adapters convert."""
    nodes = (
        Node("n1", 16, 64 * GiB),
        Node("n2", 16, 64 * GiB),
        Node("n3", 8, 32 * GiB),
    )
    guests = (
        Guest("101", "n1", cpu=4, memory=16 * GiB, cpu_used=1.0, memory_used=8 * GiB),
        Guest("102", "n1", cpu=2, memory=8 * GiB),
        Guest("103", "n1", cpu=2.5, memory=8 * GiB),
        Guest("104", "n1", cpu=1, memory=4 * GiB),
        Guest("105", "n2", cpu=1, memory=4 * GiB, state="stopped"),
        Guest("106", "n1", cpu=2, memory=8 * GiB),
        Guest("107", "n2", cpu=1, memory=2 * GiB),
    )
    rules = Rules(
        node_affinity=(NodeAffinity("pin-104", ("104",), {"n1": 0, "n3": 0}, strict=True),),
        guest_affinity=(
            GuestAffinity("apart", ("101", "107"), positive=False),
            GuestAffinity("together", ("102", "103"), positive=True),
            GuestAffinity("soft", ("101", "104"), positive=True, hard=False),
        ),
        ignored=frozenset({"106"}),
    )
    return Cluster(nodes, guests, rules, Settings(mode="static", cpu_overcommit=4.0), "tiny")


# ------------------------------------------------------------------------------------------
# Generator


def test_generate_is_deterministic_for_a_seed() -> None:
    for rules in (False, True):
        assert generate("S", seed=7, rules=rules) == generate(SIZES["S"], seed=7, rules=rules)
    assert generate("S", seed=7) != generate("S", seed=8)


@pytest.mark.parametrize("size", ["S", "M", "L"])
@pytest.mark.parametrize("rules", [False, True])
def test_generate_respects_node_capacity_and_rules(size: str, rules: bool) -> None:
    cluster = generate(size, seed=3, rules=rules)
    assert len(cluster.nodes) == SIZES[size].nodes
    assert len(cluster.guests) == SIZES[size].guests
    cons = Constraints.build(cluster)
    assign = current_assign(cluster)
    assert cons.violations(assign) == []
    committed = committed_for(cons, assign)
    memory = [str(d) for d in cons.capacity.dimensions].index("memory")
    assert np.all(committed[:, memory] <= 0.97 * cons.capacity.limit[:, memory] + 1)
    if rules:
        assert cluster.rules.node_affinity and cluster.rules.guest_affinity


# ------------------------------------------------------------------------------------------
# proxlb-solver conversion


def test_solver_spec_converts_capacity_guests_and_rules() -> None:
    spec = proxlb_solver.solver_spec(tiny(), balanciness=4)
    assert spec["balancing"]["method"] == "memory"
    assert spec["balancing"]["balanciness"] == 4
    assert spec["balancing"]["cpu_overcommit"] == 4.0
    assert spec["balancing"]["max_parallel_migrations"] is None
    nodes = {n["name"]: n for n in spec["nodes"]}
    assert nodes["n3"]["cpu_total"] == 8
    assert nodes["n3"]["memory_total"] == 32 * GiB
    assert nodes["n3"]["memory_reserve"] == 0 and nodes["n3"]["cpu_reserve"] == 0
    assert not any(n["maintenance"] for n in nodes.values())
    vms = {v["name"]: v for v in spec["vms"]}
    assert "105" not in vms  # stopped: commits no CPU or memory
    assert vms["103"]["cpu"] == 3  # vCPUs rounded up
    assert vms["101"]["memory"] == 16 * GiB  # configured, not measured
    assert vms["101"]["cpu_usage"] == 1.0
    cons = spec["constraints"]
    assert cons["pin"] == [{"vm": "104", "nodes": ["n1", "n3"]}]
    assert cons["anti_affinity"] == [
        {"name": "apart", "vms": ["101", "107"], "hard": True, "origin": "plb"}
    ]
    hard = [r for r in cons["affinity"] if r["hard"]]
    soft = [r for r in cons["affinity"] if not r["hard"]]
    assert [r["vms"] for r in hard] == [["102", "103"]]
    assert [r["vms"] for r in soft] == [["101", "104"]]
    assert cons["ignore"] == ["106"]
    assert any("not running" in note for note in spec["notes"])


def test_solver_model_and_run() -> None:
    pytest.importorskip("proxlb_solver")
    cluster = tiny()
    model, _notes = proxlb_solver.to_solver_cluster(cluster)
    assert {v.name for v in model.vms} == {"101", "102", "103", "104", "106", "107"}
    result = proxlb_solver.run(cluster, time_limit_s=1.0)
    assert result.info["feasible"] is True
    assert "106" not in result.placement  # ignored
    assert result.placement.get("102") == result.placement.get("103")  # kept together
    ev = Evaluator(cluster).evaluate(result.placement)
    assert ev.violations == ()
    assert ev.after.memory_spread < Evaluator(cluster).before.memory_spread


# ------------------------------------------------------------------------------------------
# ProxLB greedy conversion


def test_proxlb_spec_converts_like_proxlb_collectors() -> None:
    spec = proxlb_greedy.proxlb_spec(tiny(), mode="assigned", balanciness=5)
    balancing = spec["config"]["balancing"]
    assert balancing["mode"] == "assigned" and balancing["balanciness"] == 5
    assert balancing["method"] == "memory" and balancing["enable"] is True
    assert balancing["balance_types"] == ["vm"]  # no restart migrations allowed
    n1 = spec["nodes"]["n1"]["memory"]
    used = 8 + 8 + 8 + 4 + 8  # measured memory of the running guests on n1
    assert n1["total"] == 64 * GiB and n1["assigned"] == 0
    assert n1["used"] == used * GiB
    assert n1["free"] == (64 - used) * GiB
    assert n1["used_percent"] == pytest.approx(used / 64 * 100)
    n2 = spec["nodes"]["n2"]["memory"]
    assert n2["used"] == 2 * GiB  # the stopped guest does not count
    guests = spec["guests"]
    assert "105" not in guests
    assert guests["101"]["cpu"] == {**guests["101"]["cpu"], "total": 4, "used": 0.25}
    assert guests["101"]["memory"]["total"] == 16 * GiB
    assert guests["101"]["memory"]["used"] == 8 * GiB
    assert guests["102"]["affinity_groups"] == guests["103"]["affinity_groups"] == ["together"]
    assert guests["101"]["affinity_groups"] == []  # soft affinity has no equivalent
    assert guests["101"]["anti_affinity_groups"] == ["apart"]
    assert guests["104"]["node_relationships"] == ["n1", "n3"]
    assert guests["104"]["node_relationships_strict"] is True
    assert guests["106"]["ignore"] is True and guests["101"]["ignore"] is False
    assert guests["101"]["node_target"] == guests["101"]["node_current"] == "n1"
    assert any("soft" in note for note in spec["notes"])


def test_proxlb_data_and_run() -> None:
    pytest.importorskip("proxlb")
    cluster = tiny()
    data, _notes = proxlb_greedy.to_proxlb_data(cluster)
    assert set(data.nodes) == {"n1", "n2", "n3"}
    assert str(data.meta.balancing.mode) == "assigned"
    result = proxlb_greedy.run(cluster)
    assert result.placement  # n1 holds 80 % of its memory, the others little
    assert "106" not in result.placement  # ignored guests are never migrated
    assert set(result.placement.values()) <= {"n2", "n3"}
    ev = Evaluator(cluster).evaluate(result.placement)
    assert ev.migrations == len(result.placement)


# ------------------------------------------------------------------------------------------
# Evaluation and runner helpers


def test_evaluator_counts_moves_cost_and_violations() -> None:
    cluster = tiny()
    evaluator = Evaluator(cluster)
    ev = evaluator.evaluate({"102": "n2", "103": "n2"})
    assert ev.migrations == 2
    assert ev.moved_bytes == 16 * GiB
    assert ev.cost == 2 * (8 * GiB // (256 * 1024**2))
    assert ev.violations == ()
    assert evaluator.evaluate({}).migrations == 0
    # n3 has 32 GiB: 101, 102, 103 and 106 (40 GiB) overload it; 102 apart from 103 breaks
    # their affinity.
    bad = evaluator.evaluate({"101": "n3", "102": "n3", "106": "n3", "103": "n3"})
    assert any("over capacity in memory" in v for v in bad.violations)
    split = evaluator.evaluate({"102": "n2"})
    assert any("affinity" in v for v in split.violations)
    with pytest.raises(ValueError, match="unknown node"):
        evaluator.evaluate({"101": "n9"})


def test_runner_helpers() -> None:
    assert ratio(2.0, 4.0) == "0.5×"
    assert ratio(1.0, 0.0) == "—" and ratio(None, 1.0) == "—"
    assert time_limit("S", None) == 5.0 and time_limit("L", 30.0) == 30.0
    assert too_large("proxlb-solver", "L") is None
    assert too_large("proxlb-solver", "XL") is not None
    assert too_large("some-new-strategy", "XXL") is None
    assert strategy_options("pve-bruteforce", "S", None)["margin"] == 0.0


def test_a_missing_peer_is_skipped_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    reason = peer_missing("proxlb-solver")
    assert reason is not None and "not installed" in reason
