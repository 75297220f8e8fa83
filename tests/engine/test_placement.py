"""Placement of one guest, a new guest and an evacuation: hand-checked answers and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from clusters import clusters
from opendrs.engine.constraints import Constraints, committed_for, current_assign
from opendrs.engine.imbalance import balance_objective
from opendrs.engine.placement import PlacementState, evacuate, place_guest, place_new
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3


def _three(mode: str = "static") -> tuple[Node, ...]:
    return (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB), Node("c", 16, 64 * GiB))


def test_guest_goes_to_the_emptiest_node_ties_by_name() -> None:
    guests = (
        Guest("1", "a", cpu=4, memory=16 * GiB),
        Guest("2", "a", cpu=4, memory=16 * GiB),
        Guest("3", "c", cpu=2, memory=8 * GiB),
    )
    cluster = Cluster(_three(), guests, settings=Settings(mode="static"))
    result = place_guest(cluster, "1")
    assert [s.node for s in result.ranking] == ["b", "c", "a"]
    assert result.ranking[2].current
    assert result.ranking[0].fractions == {"cpu": 0.25, "memory": 0.25}
    # Two equally empty nodes tie: the name decides.
    cluster2 = Cluster(_three(), guests[:2], settings=Settings(mode="static"))
    assert [s.node for s in place_guest(cluster2, "1").ranking] == ["b", "c", "a"]
    # A move that changes nothing ties with staying: the current node wins.
    cluster3 = Cluster(_three(), guests[:1], settings=Settings(mode="static"))
    assert [s.node for s in place_guest(cluster3, "1").ranking] == ["a", "b", "c"]


def test_heterogeneous_nodes_fill_in_proportion() -> None:
    nodes = (Node("big", 32, 128 * GiB), Node("small", 8, 32 * GiB))
    cluster = Cluster(nodes, (), settings=Settings(mode="static"))
    picks = []
    for i in range(10):
        result = place_new(cluster, Guest(str(i), "", cpu=2, memory=8 * GiB))
        picks.append(result.best)
        cluster = Cluster(
            nodes,
            (*cluster.guests, Guest(str(i), result.best, cpu=2, memory=8 * GiB)),
            settings=cluster.settings,
        )
    # 4:1 capacity: the small node takes every fifth guest.
    assert picks.count("big") == 8 and picks.count("small") == 2


def test_new_guest_too_big_everywhere() -> None:
    cluster = Cluster(_three(), (), settings=Settings(mode="static"))
    result = place_new(cluster, Guest("x", "", cpu=4, memory=100 * GiB))
    assert result.ranking == ()
    assert [r.node for r in result.rejected] == ["a", "b", "c"]
    assert all(str(r).startswith("capacity: memory needs 100.0 GiB") for r in result.rejected)


def test_soft_anti_affinity_outweighs_a_small_balance_gain() -> None:
    guests = (
        Guest("1", "a", cpu=4, memory=16 * GiB),
        Guest("big", "a", cpu=8, memory=32 * GiB),
        Guest("2", "b", cpu=1, memory=GiB),
        Guest("3", "c", cpu=2, memory=4 * GiB),
    )
    rules = Rules(guest_affinity=(GuestAffinity("spread", ("1", "2"), positive=False, hard=False),))
    cluster = Cluster(_three(), guests, rules, Settings(mode="static"))
    result = place_guest(cluster, "1")
    assert result.best == "c"
    by_node = {s.node: s for s in result.ranking}
    assert by_node["b"].penalty == 1.0
    assert by_node["b"].balance < by_node["c"].balance


def test_bundle_moves_together_and_blocked_partner_blocks() -> None:
    guests = (
        Guest("1", "a", cpu=2, memory=8 * GiB),
        Guest("2", "a", cpu=2, memory=8 * GiB),
        Guest("3", "a", cpu=2, memory=8 * GiB),
        Guest("4", "b", cpu=2, memory=8 * GiB),
    )
    rules = Rules(guest_affinity=(GuestAffinity("pair", ("1", "2"), positive=True),))
    cluster = Cluster(_three(), guests, rules, Settings(mode="static"))
    result = place_guest(cluster, "2")
    assert result.members == ("1", "2")
    assert result.best == "c"
    locked = Cluster(
        _three(),
        (Guest("1", "a", cpu=2, memory=8 * GiB, lock="backup"), *guests[1:]),
        rules,
        Settings(mode="static"),
    )
    assert place_guest(locked, "2").blocked == "partner 1: locked (backup)"


def test_evacuation_spreads_anti_affine_guests_and_reports_stuck_ones() -> None:
    guests = (
        Guest("dns1", "a", cpu=1, memory=2 * GiB),
        Guest("dns2", "a", cpu=1, memory=2 * GiB),
        Guest("pinned", "a", cpu=1, memory=2 * GiB),
    )
    rules = Rules(
        node_affinity=(NodeAffinity("pin", ("pinned",), {"a": 0}, strict=True),),
        guest_affinity=(GuestAffinity("dns", ("dns1", "dns2"), positive=False),),
    )
    result = evacuate(Cluster(_three(), guests, rules, Settings(mode="static")), "a")
    assert [(m.guest, m.target) for m in result.moves] == [("dns1", "b"), ("dns2", "c")]
    assert result.stuck == (
        (
            "pinned",
            "no node can take it (a: node in maintenance; b, c: strict node affinity (pin))",
        ),
    )


def test_unknown_guest_and_node() -> None:
    cluster = Cluster(_three(), ())
    with pytest.raises(KeyError):
        place_guest(cluster, "nope")
    with pytest.raises(KeyError):
        evacuate(cluster, "nope")


# --------------------------------------------------------------------------------------------
# Properties


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_no_placement_exceeds_capacity_or_breaks_a_hard_rule(cluster: Cluster) -> None:
    cons = Constraints.build(cluster)
    base = current_assign(cluster)
    over_before = cons.capacity.over(committed_for(cons, base)).any(axis=1)
    for guest in cluster.guests[:6]:
        result = place_guest(cluster, guest.id)
        for choice in result.ranking:
            if choice.current:
                continue
            n = cluster.node_index[choice.node]
            assign = base.copy()
            for member in result.members:
                assign[cluster.guest_index[member]] = n
            committed = committed_for(cons, assign)
            assert not cons.capacity.over(committed)[n].any() or over_before[n]
            assert cluster.nodes[n].usable
            for member in result.members:
                j = cluster.guest_index[member]
                assert cons.static_ok()[j, n]
                assert not np.any(assign[cons.hard_neg[j]] == n)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_evacuation_is_safe_and_deterministic(cluster: Cluster) -> None:
    node = cluster.nodes[0].name
    first = evacuate(cluster, node)
    assert first == evacuate(cluster, node)
    cons = Constraints.build(cluster)
    assign = current_assign(cluster)
    before = cons.capacity.over(committed_for(cons, assign)).any(axis=1)
    for move in first.moves:
        assign[cluster.guest_index[move.guest]] = cluster.node_index[move.target]
    after = cons.capacity.over(committed_for(cons, assign)).any(axis=1)
    assert not np.any(after & ~before)
    for move in first.moves:
        j = cluster.guest_index[move.guest]
        n = cluster.node_index[move.target]
        assert move.target != node
        assert not np.any(assign[cons.hard_neg[j]] == n)


@settings(max_examples=60, deadline=None)
@given(clusters())
def test_placement_is_deterministic(cluster: Cluster) -> None:
    guest = cluster.guests[0].id
    assert place_guest(cluster, guest).as_dict() == place_guest(cluster, guest).as_dict()
    state = PlacementState.build(cluster)
    assert state.place(0).as_dict() == place_guest(cluster, guest).as_dict()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_a_node_score_is_the_balance_objective_with_the_guest_there(cluster: Cluster) -> None:
    """The balance a placement scores a node with (σ, from running sums) is the square root of
    the objective's one definition (imbalance.balance_objective) with the guest on that node."""
    state = PlacementState.build(cluster)
    cap = state.loads.capacity
    usable = state.constraints.usable & np.all(cap > 0, axis=1)
    group = np.where(usable, 0, -1)
    for j in range(min(6, len(cluster.guests))):
        members = state.bundle(j)
        _assign, base_load, _committed = state._without(members)
        demand = state.loads.demand[members[state.running[members]]].sum(axis=0)
        scores = state._balance_after(base_load, demand)
        for n in np.nonzero(usable)[0].tolist():
            load = base_load.copy()
            load[n] += demand
            defined = float(balance_objective(load, cap, state.weights, group))
            assert scores[n] ** 2 == pytest.approx(defined, rel=1e-9, abs=1e-12)
