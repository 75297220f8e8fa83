"""pve-bruteforce on opendrs's model: Proxmox's auto-rebalance choice, applied repeatedly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from clusters import assert_moves_safe, clusters
from opendrs.engine.strategies import get_strategy, pve
from opendrs.engine.strategies.base import Request
from opendrs.engine.strategies.pve import PveOptions
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3

#: The algorithm as pve-ha-manager's test logs show it: every guest moves (the clusters here are
#: not HA) and the imbalance is the raw CV the logs print. The defaults are tested apart.
LOG = {"scope": "all", "imbalance": "raw"}


def propose_bruteforce(cluster: Cluster, forbidden: object = (), **options: Any) -> pve.Proposal:
    request = Request(forbidden=frozenset(forbidden))  # type: ignore[arg-type]
    return pve.propose_bruteforce(CycleView(cluster), request, PveOptions(**{**LOG, **options}))


def _nodes() -> tuple[Node, ...]:
    return tuple(Node(f"node{i}", 24, 32 * GiB) for i in (1, 2, 3))


def _four_on_node1(**kw: object) -> Cluster:
    guests = tuple(
        Guest(f"vm:{100 + i}", "node1", cpu=2, memory=4 * GiB, cpu_used=1.0, memory_used=4 * GiB)
        for i in range(1, 5)
    )
    return Cluster(_nodes(), guests, **kw)  # type: ignore[arg-type]


def test_four_equal_guests_match_the_proxmox_log() -> None:
    # test-crs-dynamic-auto-rebalance2: 80 vm:101->node2 1.41->0.94; 160 vm:102->node3 0.94->0.35
    proposal = propose_bruteforce(_four_on_node1())
    assert [(m.guest, m.target) for m in proposal.moves] == [
        ("vm:101", "node2"),
        ("vm:102", "node3"),
    ]
    assert [round(m.before, 2) for m in proposal.moves] == [1.41, 0.94]
    assert [round(m.after, 2) for m in proposal.moves] == [0.94, 0.35]
    assert "less than the margin" in proposal.stopped
    assert proposal.after.combined.cv == pytest.approx(0.3535533905932738)


def test_threshold_and_move_limit() -> None:
    assert propose_bruteforce(_four_on_node1(), threshold=2.0).moves == ()
    one = propose_bruteforce(_four_on_node1(), max_moves=1)
    assert len(one.moves) == 1
    assert one.stopped == "move limit 1 reached"


def test_margin_blocks_small_improvements() -> None:
    # The best first move brings 1.414 to 0.935: 34 % better, less than a 50 % margin.
    proposal = propose_bruteforce(_four_on_node1(), margin=0.5)
    assert proposal.moves == ()
    assert proposal.stopped == (
        "best move (vm:101 to node2) would bring 1.414 to 0.935, less than the margin 0.5"
    )


def test_capacity_is_respected() -> None:
    nodes = (Node("node1", 24, 32 * GiB), Node("node2", 24, 3 * GiB), Node("node3", 24, 32 * GiB))
    cluster = Cluster(nodes, _four_on_node1().guests)
    proposal = propose_bruteforce(cluster)
    assert proposal.moves
    assert all(m.target != "node2" for m in proposal.moves)


def test_positive_partners_move_as_one_bundle() -> None:
    rules = Rules(guest_affinity=(GuestAffinity("pair", ("vm:103", "vm:104"), positive=True),))
    proposal = propose_bruteforce(_four_on_node1(rules=rules))
    first = [(m.guest, m.target) for m in proposal.moves[:2]]
    assert ("vm:103", first[0][1]) in first and ("vm:104", first[0][1]) in first


def test_basic_mode_never_rebalances() -> None:
    proposal = propose_bruteforce(_four_on_node1(settings=Settings(mode="basic")))
    assert proposal.moves == ()
    assert "basic mode" in proposal.stopped


def test_registry() -> None:
    with pytest.raises(KeyError, match="unknown strategy 'nope'"):
        get_strategy("nope")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_proposals_are_safe_deterministic_and_never_worse(cluster: Cluster) -> None:
    proposal = propose_bruteforce(cluster, threshold=0.0, margin=0.0)
    assert proposal.as_dict() == propose_bruteforce(cluster, threshold=0.0, margin=0.0).as_dict()
    for move in proposal.moves:
        assert move.after <= move.before
    assert_moves_safe(cluster, proposal.moves)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(max_nodes=5, max_guests=12))
def test_the_best_move_is_the_best_allowed_one(cluster: Cluster) -> None:
    """Scoring every pair at once picks what checking each bundle's allowed targets first would."""
    from opendrs.engine.placement import PlacementState
    from opendrs.engine.pve_selection import (
        combined_loads,
        cv_after_move,
        fraction_shift,
        truncate_imbalance,
    )
    from opendrs.engine.strategies.base import usable_nodes
    from opendrs.engine.strategies.pve import (
        _bundle_demand,
        _choose_bruteforce,
        _Round,
        _targets,
        movable_bundles,
    )

    state = PlacementState.build(cluster)
    cap = state.loads.capacity
    usable = usable_nodes(state)
    combined = combined_loads(state.node_load, cap)
    best = None
    for bundle in movable_bundles(state, cluster):
        targets = _targets(state, bundle)
        if not targets.size:
            continue
        shift = fraction_shift(_bundle_demand(state, bundle.members), cap).mean(axis=1)
        values = cv_after_move(combined, usable, bundle.src, targets, shift)
        source = cluster.nodes[bundle.src].name
        for t, value in zip(targets.tolist(), values.tolist(), strict=True):
            key = (float(truncate_imbalance(value)), bundle.leader, source, cluster.nodes[t].name)
            if best is None or key < best[0]:
                best = (key, bundle.leader, t)
    everyone = np.ones(len(cluster.guests), dtype=bool)
    choice = _choose_bruteforce(state, cap, usable, combined, _Round(everyone, 1.0))
    if best is None:
        assert choice is None
    else:
        assert choice is not None
        assert (choice.leader, choice.target, choice.value) == (best[1], best[2], best[0][0])
