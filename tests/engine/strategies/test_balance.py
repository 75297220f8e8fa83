"""balance: opendrs's own strategy, on hand-checked literal clusters and random ones."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from random import Random

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from clusters import assert_moves_safe, clusters
from opendrs.engine.bounds import migration_lower_bound
from opendrs.engine.constraints import Constraints, committed_for, current_assign
from opendrs.engine.imbalance import balance_objective, resource_weights
from opendrs.engine.strategies import get_strategy
from opendrs.engine.strategies.balance.options import BalanceOptions
from opendrs.engine.strategies.balance.picks import IdleWindows, pick
from opendrs.engine.strategies.balance.state import BalanceState
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.strategies.base import Request
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.model.snapshot import load_demo

GiB = 1024**3
MEMORY_ONLY = Settings(mode="static", weight_cpu=0.0, weight_memory=1.0, cpu_overcommit=8.0)


def _two(*guests: Guest, settings: Settings = MEMORY_ONLY, rules: Rules | None = None) -> Cluster:
    nodes = (Node("a", 16, 16 * GiB), Node("b", 16, 16 * GiB))
    return Cluster(nodes, guests, rules or Rules(), settings)


def test_fewest_moves_to_equal_memory() -> None:
    # 4+4+2+2 GiB on a: 12 GiB to split 6/6. The first move's ideal size is 6 GiB, so a 4 GiB
    # guest goes (a 8, b 4); then the ideal size is 2 GiB: a 2 GiB guest goes (6/6). Two moves.
    cluster = _two(
        Guest("1", "a", cpu=1, memory=4 * GiB),
        Guest("2", "a", cpu=1, memory=4 * GiB),
        Guest("3", "a", cpu=1, memory=2 * GiB),
        Guest("4", "a", cpu=1, memory=2 * GiB),
    )
    proposal = propose_balance(cluster)
    assert [(m.guest, m.target) for m in proposal.net_moves()] == [("1", "b"), ("3", "b")]
    assert proposal.after.resources["memory"].spread == 0.0
    assert proposal.stopped.startswith("balanced")


def test_no_moves_while_balanced() -> None:
    cluster = _two(Guest("1", "a", memory=4 * GiB), Guest("2", "b", memory=4 * GiB))
    proposal = propose_balance(cluster)
    assert proposal.moves == ()
    assert proposal.stopped.startswith("balanced")


def test_no_overshoot_with_one_big_guest() -> None:
    # Moving the only 8 GiB guest would just swap the roles of a and b: no move.
    cluster = _two(Guest("1", "a", memory=8 * GiB), Guest("2", "b", memory=2 * GiB))
    proposal = propose_balance(cluster)
    assert proposal.moves == ()


def test_swap_when_no_single_move_helps() -> None:
    # a: two (3 cpu, 1 GiB) guests = (6, 2); b: two (1 cpu, 3 GiB) = (2, 6). Any single move
    # raises Σ dev² from 16 to 20; swapping one of each makes both nodes (4, 4).
    settings = Settings(mode="static", cpu_overcommit=1.0)
    nodes = (Node("a", 16, 16 * GiB), Node("b", 16, 16 * GiB))
    guests = (
        Guest("c1", "a", cpu=3, memory=GiB),
        Guest("c2", "a", cpu=3, memory=GiB),
        Guest("m1", "b", cpu=1, memory=3 * GiB),
        Guest("m2", "b", cpu=1, memory=3 * GiB),
    )
    # The vCPU commitments' goal one vCPU on the smallest node, not the default 100 pp.
    tight = BalanceOptions(cpu_commit_spread=0.0)
    proposal = propose_balance(Cluster(nodes, guests, Rules(), settings), tight)
    assert sorted((m.guest, m.target) for m in proposal.net_moves()) == [("c1", "b"), ("m1", "a")]
    assert all("swap" in m.reason for m in proposal.moves)
    assert proposal.after.combined.spread == 0.0
    assert (
        propose_balance(
            Cluster(nodes, guests, Rules(), settings), replace(tight, swaps=False)
        ).moves
        == ()
    )


def test_set_exchange_when_no_move_or_pair_helps() -> None:
    # CPU is even (8 of 16 on every node) and a has 2 GiB more memory than the mean (6 GiB).
    # Every guest has 2 or more CPUs, so any single move unbalances the CPU more than it
    # balances the memory, and so does any exchange of two guests; a1 (4 cpu, 2 GiB) against
    # y1 and y4 of b (2 + 2 cpu, 1 + 0.5 GiB) moves 0.5 GiB and no CPU.
    settings = Settings(mode="static", cpu_overcommit=1.0)
    nodes = tuple(Node(name, 16, 16 * GiB) for name in ("a", "b", "c"))
    guests = (
        Guest("x", "a", cpu=4, memory=6 * GiB),
        Guest("a1", "a", cpu=4, memory=2 * GiB),
        Guest("y1", "b", cpu=2, memory=GiB),
        Guest("y2", "b", cpu=2, memory=GiB),
        Guest("y3", "b", cpu=2, memory=3 * GiB // 2),
        Guest("y4", "b", cpu=2, memory=GiB // 2),
        *(Guest(f"c{i}", "c", cpu=1, memory=3 * GiB // 4) for i in range(8)),
    )
    cluster = Cluster(nodes, guests, Rules(), settings)
    # The vCPU commitments' goal one vCPU on the smallest node, not the default 100 pp.
    proposal = propose_balance(cluster, BalanceOptions(cpu_commit_spread=0.0))
    assert sorted((m.guest, m.target) for m in proposal.net_moves()) == [
        ("a1", "b"),
        ("y1", "a"),
        ("y4", "a"),
    ]
    assert all(m.reason == "balance (set exchange)" for m in proposal.moves)
    assert proposal.after.resources["cpu"].spread == 0.0
    assert proposal.after.resources["memory"].spread < proposal.before.resources["memory"].spread
    assert propose_balance(cluster, BalanceOptions(swaps=False, cpu_commit_spread=0.0)).moves == ()


def test_sheds_the_mix_of_the_excess() -> None:
    # a: two (6 cpu, 8 GiB) guests and six (2 cpu, 1 GiB): (24, 22); b is empty: a must shed
    # (12 cpu, 11 GiB). The two big ones carry the cpu but 16 GiB; one big and three small ones
    # carry exactly the excess: four moves, the fewest possible (the lower bound says so too).
    nodes = (Node("a", 16, 32 * GiB), Node("b", 16, 32 * GiB))
    guests = tuple(Guest(f"B{i}", "a", cpu=6, memory=8 * GiB) for i in range(2)) + tuple(
        Guest(f"S{i}", "a", cpu=2, memory=GiB) for i in range(6)
    )
    cluster = Cluster(nodes, guests, Rules(), Settings(mode="static", cpu_overcommit=4.0))
    proposal = propose_balance(cluster)
    assert sorted(m.guest for m in proposal.net_moves()) == ["B0", "S0", "S1", "S2"]
    assert proposal.after.combined.spread == 0.0
    assert migration_lower_bound(cluster, 0.0).migrations == 4


def _subnormal_demand() -> Cluster:
    """The only movable guest uses 1e-308 cores (a subnormal float), beside a locked 8-core one.

    Found by a 20,000-example run: the band distance, counted in typical guests of 1e-308
    cores, overflowed to infinity (and a gain to inf − inf).
    """
    nodes = (Node("n0", 16, 16 * GiB), Node("n1", 16, 16 * GiB))
    guests = (
        Guest("100", "n0", cpu=1, memory=GiB, cpu_used=1e-308, memory_used=GiB, uptime=3600),
        Guest("101", "n0", cpu=8, memory=GiB, cpu_used=8.0, memory_used=GiB, lock="backup"),
    )
    return Cluster(nodes, guests, Rules(), Settings(mode="dynamic"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.floats(0.0, 0.2))
@example(_subnormal_demand(), 0.0)
def test_band_gains_are_the_band_distance_removed(cluster: Cluster, goal: float) -> None:
    state = BalanceState(cluster, Constraints.build(cluster))
    state.goal = np.full(len(RESOURCES), goal)
    # Moves between usable nodes of one architecture (which keep its mean, and so the band,
    # where it is).
    units = state.units_on(np.nonzero(state.usable)[0])[:6]
    nodes = np.arange(len(cluster.nodes))
    gains = state.band_gains(units, nodes)
    # Computed only at some moves (as a round does where few may be made): the same bits.
    rows, cols = np.nonzero(np.arange(gains.size).reshape(gains.shape) % 3 != 1)
    assert np.array_equal(state.band_gains(units, nodes, (rows, cols)), gains[rows, cols])

    def distance() -> float:
        mean = state.mean()
        low, high = (mean - goal / 2) * state.cap, (mean + goal / 2) * state.cap
        load = state.node_load
        out = np.maximum(load - high, 0) + np.maximum(low - load, 0)
        out = np.where(state.usable[:, None], out, 0.0)
        return float((out.sum(axis=0) * (state.weights > 0) / state.typical).sum())

    for row, u in enumerate(units.tolist()):
        home = int(state.units.assign[u])
        for n in nodes.tolist():
            if n == home or not state.usable[n] or state.group[n] != state.group[home]:
                continue
            before = distance()
            state.move(u, n)
            after = distance()
            state.move(u, home)
            scale = 1.0 + abs(before)
            assert gains[row, n] == pytest.approx(before - after, rel=1e-9, abs=1e-9 * scale)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.randoms(use_true_random=False))
def test_a_move_tried_without_moving_is_as_a_move_made_and_undone(
    cluster: Cluster, rng: Random
) -> None:
    # What pruning does with a move it tries: the spreads it would give, and the loads after
    # going there and back, the same bits as two moves (sums of usage can round).
    state = BalanceState(cluster, Constraints.build(cluster))
    moves = state.units_on(np.nonzero(state.usable)[0])
    targets = np.nonzero(state.usable)[0]
    if moves.size == 0:
        return
    other = BalanceState(cluster, Constraints.build(cluster))
    for _ in range(8):
        u, t = int(rng.choice(moves.tolist())), int(rng.choice(targets.tolist()))
        home = int(state.units.assign[u])
        if t == home:
            continue
        predicted = state.spreads_moved(u, t)
        state.there_and_back(u, t)
        other.move(u, t)
        assert np.array_equal(predicted, other.spreads())
        other.move(u, home)
        assert np.array_equal(state.node_load, other.node_load)
        assert np.array_equal(state.committed, other.committed)
        assert np.array_equal(state.fractions(), other.fractions())
        assert state.objective() == other.objective()
        # Moves made in both, so that the next tries start from a changed placement.
        state.move(u, t)
        other.move(u, t)


def test_repairs_before_balancing() -> None:
    nodes = (
        Node("a", 16, 16 * GiB),
        Node("b", 16, 16 * GiB),
        Node("m", 16, 16 * GiB, maintenance=True),
    )
    guests = (
        Guest("evac", "m", memory=GiB),
        Guest("x", "a", memory=GiB),
        Guest("y", "a", memory=GiB),
        Guest("pinned", "a", memory=GiB),
    )
    rules = Rules(
        node_affinity=(NodeAffinity("pin", ("pinned",), {"b": 0}, strict=True),),
        guest_affinity=(GuestAffinity("apart", ("x", "y"), positive=False),),
    )
    proposal = propose_balance(Cluster(nodes, guests, rules, MEMORY_ONLY))
    reasons = {m.guest: m.reason for m in proposal.moves}
    assert reasons["evac"].startswith("repair") and reasons["pinned"].startswith("repair")
    assert reasons["y"].startswith("repair")  # the larger id of the clashing pair moves
    final = {g.id: g.node for g in guests} | proposal.placement
    assert final["pinned"] == "b" and final["evac"] != "m" and final["x"] != final["y"]


def test_a_clash_with_a_guest_that_cannot_move_is_repaired_by_the_other() -> None:
    # x and y are kept apart and share a; y (the larger id, which would move) is locked: x moves.
    guests = (
        Guest("x", "a", memory=GiB),
        Guest("y", "a", memory=GiB, lock="backup"),
    )
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("x", "y"), positive=False),))
    proposal = propose_balance(_two(*guests, rules=rules), BalanceOptions(target_spread=1e6))
    assert [(m.guest, m.target) for m in proposal.net_moves()] == [("x", "b")]
    assert proposal.moves[0].reason.startswith("repair")


def test_overloaded_node_is_relieved() -> None:
    nodes = (Node("a", 16, 8 * GiB), Node("b", 16, 16 * GiB))
    guests = (Guest("1", "a", memory=6 * GiB), Guest("2", "a", memory=4 * GiB))
    cluster = Cluster(nodes, guests, Rules(), MEMORY_ONLY)
    proposal = propose_balance(cluster)
    cons = Constraints.build(cluster)
    assign = current_assign(cluster)
    assert cons.capacity.over(committed_for(cons, assign)).any()
    for move in proposal.net_moves():
        assign[cons.cluster.guest_index[move.guest]] = cons.cluster.node_index[move.target]
    assert not cons.capacity.over(committed_for(cons, assign)).any()


def test_an_overload_is_repaired_with_the_smallest_guest_that_covers_it() -> None:
    # a: 6 + 3 + 1 + 1 GiB on 10 GiB, 1 GiB over; b has 9 GiB free, repairs only. The smallest
    # guest that covers the excess alone is a 1 GiB one: one small migration, not the 6 GiB one.
    nodes = (Node("a", 16, 10 * GiB), Node("b", 16, 16 * GiB))
    guests = (
        Guest("big", "a", memory=6 * GiB),
        Guest("mid", "a", memory=3 * GiB),
        Guest("s1", "a", memory=GiB),
        Guest("s2", "a", memory=GiB),
        Guest("full", "b", memory=7 * GiB),
    )
    cluster = Cluster(nodes, guests, Rules(), MEMORY_ONLY)
    proposal = propose_balance(cluster, BalanceOptions(target_spread=1e6))
    assert [(m.guest, m.target) for m in proposal.net_moves()] == [("s1", "b")]
    # When the guest that would do it may go nowhere (here: forbidden), the next one is tried,
    # and nothing is reported stuck.
    nodes = (Node("a", 16, 8 * GiB), Node("b", 16, 16 * GiB), Node("c", 16, 16 * GiB))
    guests = (
        Guest("big", "a", memory=6 * GiB),
        Guest("mid", "a", memory=3 * GiB),
        Guest("fill-b", "b", memory=14 * GiB),
        Guest("fill-c", "c", memory=10 * GiB),
    )
    proposal = propose_balance(
        Cluster(nodes, guests, Rules(), MEMORY_ONLY),
        BalanceOptions(target_spread=1e6),
        forbidden=[("mid", "b"), ("mid", "c")],
    )
    assert [(m.guest, m.target) for m in proposal.net_moves()] == [("big", "c")]
    assert not any(n.startswith("could not repair") for n in proposal.notes)


def test_guests_that_can_go_nowhere_are_not_searched_again_and_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a is 6 GiB over its 64 GiB. 60 one-GiB guests may go nowhere (forbidden on b); six 1 GiB
    # guests may go to b. Each repair move searches for a target once, for a guest that has one;
    # the stuck ones are screened together, not searched one by one before every move.
    from opendrs.engine.strategies.balance import repair

    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB))
    stuck = [Guest(f"s{i:02d}", "a", memory=GiB) for i in range(60)]
    free = [Guest(f"f{i}", "a", memory=GiB) for i in range(10)]
    cluster = Cluster(nodes, (*stuck, *free), Rules(), MEMORY_ONLY)
    calls = 0
    real_pick = repair.pick

    def counting_pick(*args: object, **kwargs: object) -> object:
        nonlocal calls
        if kwargs.get("forced"):
            calls += 1
        return real_pick(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(repair, "pick", counting_pick)
    proposal = propose_balance(
        cluster, BalanceOptions(target_spread=1e6), forbidden=[(g.id, "b") for g in stuck]
    )
    moved = {m.guest for m in proposal.net_moves()}
    assert len(moved) == 6 and moved <= {g.id for g in free}
    assert calls == 6
    assert not any(n.startswith("could not repair") for n in proposal.notes)


def test_forbidden_and_bundles() -> None:
    nodes = (Node("a", 16, 16 * GiB), Node("b", 16, 16 * GiB), Node("c", 16, 16 * GiB))
    guests = (
        Guest("1", "a", memory=4 * GiB),
        Guest("2", "a", memory=4 * GiB),
        Guest("3", "a", memory=4 * GiB),
    )
    rules = Rules(guest_affinity=(GuestAffinity("pair", ("1", "2"), positive=True),))
    cluster = Cluster(nodes, guests, rules, MEMORY_ONLY)
    proposal = propose_balance(cluster)
    final = {g.id: g.node for g in guests} | proposal.placement
    assert final["1"] == final["2"]
    forbidden = propose_balance(cluster, forbidden=[("3", "b")])
    assert ("3", "b") not in {(m.guest, m.target) for m in forbidden.net_moves()}


def _split_pair(**node_kw: object) -> Cluster:
    """Bundle {p, q} split over a and b (p on a, q on b); x (on c) kept apart from p."""
    nodes = tuple(Node(n, 16, 16 * GiB, **node_kw) for n in "abcd")  # type: ignore[arg-type]
    guests = (
        Guest("p", "a", memory=2 * GiB),
        Guest("q", "b", memory=2 * GiB),
        Guest("x", "c", memory=GiB),
    )
    rules = Rules(
        guest_affinity=(
            GuestAffinity("together", ("p", "q"), positive=True),
            GuestAffinity("apart", ("p", "x"), positive=False),
        )
    )
    return Cluster(nodes, guests, rules, MEMORY_ONLY)


def test_a_broken_bundle_keeps_its_partners_off_every_node_it_is_on() -> None:
    # x is kept apart from p, so from the whole bundle {p, q}: while the bundle is split over a
    # and b, x may go to neither; once it is gathered on d, only d is closed to x.
    cluster = _split_pair()
    state = BalanceState(cluster, Constraints.build(cluster))
    bundle, x = (state.units.unit_of[cluster.guest_index[g]] for g in ("p", "x"))
    nodes = np.arange(4)
    assert state.broken[bundle] and not state.broken[x]
    assert state.allowed(np.array([x]), nodes)[0].tolist() == [False, False, False, True]
    # The bundle itself may be gathered on a (where p is) or b (where q is), not on c (x).
    assert state.allowed(np.array([bundle]), nodes)[0].tolist() == [True, True, False, True]
    state.move(bundle, 3)
    assert not state.broken[bundle]
    assert state.allowed(np.array([x]), nodes)[0].tolist() == [True, True, False, False]


def test_an_evacuated_partner_avoids_every_node_of_a_broken_bundle() -> None:
    # x must leave c (maintenance). The bundle {p, q} it is kept apart from is split over a and
    # b; d is busy, so b would be the better target — but q is there.
    nodes = (
        Node("a", 16, 16 * GiB),
        Node("b", 16, 16 * GiB),
        Node("c", 16, 16 * GiB, maintenance=True),
        Node("d", 16, 16 * GiB),
    )
    guests = (
        Guest("p", "a", memory=2 * GiB),
        Guest("q", "b", memory=2 * GiB),
        Guest("x", "c", memory=GiB),
        Guest("busy", "d", memory=12 * GiB),
    )
    rules = Rules(
        guest_affinity=(
            GuestAffinity("together", ("p", "q"), positive=True),
            GuestAffinity("apart", ("p", "x"), positive=False),
        )
    )
    cluster = Cluster(nodes, guests, rules, MEMORY_ONLY)
    proposal = propose_balance(cluster, BalanceOptions(target_spread=1e6))
    assert_moves_safe(cluster, proposal.net_moves())
    assert (proposal.moves[0].guest, proposal.moves[0].target) == ("x", "d")


def test_a_partner_sharing_a_node_with_a_split_member_is_repaired() -> None:
    # x shares b with q, the split-off member of x's partner bundle {p, q}: a clash to repair,
    # though the bundle is reckoned on a (where p is). Gathering the bundle on a (q moves) also
    # ends the clash; x must not move next to p or q.
    cluster = _split_pair()
    cluster = Cluster(
        cluster.nodes,
        tuple(replace(g, node="b") if g.id == "x" else g for g in cluster.guests),
        cluster.rules,
        cluster.settings,
    )
    state = BalanceState(cluster, Constraints.build(cluster))
    unit = state.units.unit_of[cluster.guest_index["x"]]
    assert unit in state.violating_units()
    proposal = propose_balance(cluster, BalanceOptions(target_spread=1e6))
    assert_moves_safe(cluster, proposal.net_moves())
    final = {g.id: g.node for g in cluster.guests} | proposal.placement
    assert final["p"] == final["q"] != final["x"]


def test_a_broken_bundle_is_gathered_where_it_needs_room_for_the_rest_only() -> None:
    # a has room for q (2 GiB) but not for the whole bundle (4 GiB): gathering on a moves q
    # alone. Nodes b and c are full: a is the only place.
    nodes = (
        Node("a", 16, 5 * GiB),
        Node("b", 16, 4 * GiB),
        Node("c", 16, 2 * GiB),
    )
    guests = (
        Guest("p", "a", memory=2 * GiB),
        Guest("q", "b", memory=2 * GiB),
        Guest("fill", "b", memory=2 * GiB),
        Guest("fill-c", "c", memory=2 * GiB),
    )
    rules = Rules(guest_affinity=(GuestAffinity("together", ("p", "q"), positive=True),))
    cluster = Cluster(nodes, guests, rules, MEMORY_ONLY)
    proposal = propose_balance(cluster, BalanceOptions(target_spread=1e6))
    assert [(m.guest, m.source, m.target) for m in proposal.net_moves()] == [("q", "b", "a")]
    assert proposal.moves[0].reason.startswith("repair")
    assert_moves_safe(cluster, proposal.net_moves())


def test_a_gathered_bundle_is_not_pruned_apart() -> None:
    # Gathering {p, q} is a repair: pruning must not undo it, even when the cluster is as
    # balanced without it.
    cluster = _split_pair()
    proposal = propose_balance(cluster, BalanceOptions(target_spread=1e6))
    final = {g.id: g.node for g in cluster.guests} | proposal.placement
    assert final["p"] == final["q"]
    assert len(proposal.net_moves()) == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_moves_keep_the_state_exact(cluster: Cluster) -> None:
    # For movable units (broken bundles first) and each allowed target: the loads and
    # commitments after the move are those of the placement it leaves (every member of a broken
    # bundle leaves its own node), and the objective gain is the objective's fall — for units
    # on usable nodes: one leaving an unusable node moves the mean, which gains() leaves out.
    cons = Constraints.build(cluster)
    probe = BalanceState(cluster, cons)
    order = np.lexsort((np.arange(len(probe.broken)), ~probe.broken))
    units = [u for u in order.tolist() if probe.units.movable[u]][:6]
    nodes = np.arange(len(cluster.nodes))
    for u in units:
        allowed = probe.allowed(np.array([u]), nodes)[0]
        for t in np.nonzero(allowed)[0].tolist():
            state = BalanceState(cluster, cons)
            gain = state.gains(np.array([u]), np.array([t]))[0, 0]
            before = state.objective()
            state.move(u, t)
            after = state.objective()
            if state.usable[probe.where[probe.units.members[u]]].all():
                assert gain == pytest.approx(before - after, rel=1e-9, abs=1e-12)
            assert np.allclose(state.node_load, state.loads.loads(state.where))
            assert np.allclose(state.committed, committed_for(cons, state.where))
            assert state.moved()[u] and not state.broken[u]


def test_registered_and_default() -> None:
    info = get_strategy("balance")
    assert info.options.names() == (
        "target_spread",
        "margin",
        "max_moves",
        "wide",
        "swaps",
        "hold",
        "cpu_commit_spread",
        "cpu_commit_moves",
    )
    cluster = load_demo()
    assert info.propose(cluster).as_dict() == propose_balance(cluster).as_dict()
    # What the policy asks (its target, its batch) yields to an option set explicitly.
    asked = Request(target_spread=0.5, max_moves=1)
    assert info.propose(cluster, asked).as_dict() == (
        propose_balance(cluster, BalanceOptions(target_spread=0.5, max_moves=1)).as_dict()
    )
    mixed = info.propose(cluster, asked, {"max_moves": 2})
    assert (
        mixed.as_dict()
        == propose_balance(cluster, BalanceOptions(target_spread=0.5, max_moves=2)).as_dict()
    )


def _broken_bundle() -> Cluster:
    """A hard-affinity bundle {100, 110} split over n0 and n2, and 101 kept apart from 100.

    Found by a 25,000-example run: repairing 101's clash with 100 (both on n0) moved 101 next to
    110 on n2, the affinity partner of its anti-affinity partner (the bundle was seen only where
    its first member is). Two online nodes, both over capacity; nineteen 1 GiB guests on n0.
    """
    nodes = tuple(Node(f"n{i}", 2, 4 * GiB, online=i in (0, 2)) for i in range(6))
    guests = tuple(
        Guest(str(100 + j), "n2" if j == 10 else "n0", memory=GiB, uptime=3600) for j in range(20)
    )
    rules = Rules(
        guest_affinity=(
            GuestAffinity("g0", ("100", "110"), positive=True, hard=True),
            GuestAffinity("g1", ("100", "101"), positive=False, hard=True),
        )
    )
    return Cluster(nodes, guests, rules, Settings(mode="basic", cpu_overcommit=1.0))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
@example(_broken_bundle())
def test_balance_is_safe_deterministic_and_never_worse(cluster: Cluster) -> None:
    proposal = propose_balance(cluster)
    assert proposal.as_dict() == propose_balance(cluster).as_dict()
    assign = assert_moves_safe(cluster, proposal.net_moves())
    # Balancing moves never make the objective worse (repairs may: they are not optional).
    if proposal.moves and all(m.reason.startswith("balance") for m in proposal.moves):
        assert _objective(cluster, assign) <= _objective(cluster, current_assign(cluster)) + 1e-12


def _objective(cluster: Cluster, assign: np.ndarray) -> float:
    """The objective of the usable nodes' loads under ``assign`` (one mean for them all)."""
    loads = LoadModel.build(cluster)
    usable = np.array([n.usable for n in cluster.nodes]) & np.all(loads.capacity > 0, axis=1)
    weights = resource_weights(cluster.settings)
    group = np.where(usable, 0, -1)
    return float(balance_objective(loads.loads(assign), loads.capacity, weights, group))


def _generate() -> Callable[..., Cluster]:
    """The benchmarks' cluster generator (the checkout's ``bench`` package)."""
    root = str(Path(__file__).resolve().parents[3])
    if root not in sys.path:  # however pytest is started
        sys.path.insert(0, root)
    from bench.generate import generate

    return generate


@pytest.mark.parametrize("rules", [False, True])
def test_bench_cluster_reaches_the_target(rules: bool) -> None:
    # S (8 nodes, 200 guests, seed 1): with rules the shaped search ends at 1.1 pp, where no
    # move or exchange pays for itself; the plain search reaches the target.
    proposal = propose_balance(_generate()("S", rules=rules))
    assert proposal.stopped.startswith("balanced")
    assert proposal.after.resources["memory"].spread <= 0.01


@pytest.mark.parametrize("rules", [False, True])
def test_bench_cluster_needs_few_more_migrations_than_the_bound(rules: bool) -> None:
    # M (16 nodes, 1,000 guests, seed 1): 1.30-1.31× the fewest migrations any placement needs
    # for the spreads reached (choosing moves by objective gain alone spent 1.8-1.9×).
    cluster = _generate()("M", rules=rules)
    proposal = propose_balance(cluster)
    assert proposal.stopped.startswith("balanced")
    after = {r: m.spread for r, m in proposal.after.resources.items()}
    bound = migration_lower_bound(cluster, after).migrations
    assert len(proposal.net_moves()) <= 1.4 * bound


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clusters(),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=8),
)
def test_the_incremental_objective_is_the_defined_one_after_random_moves(
    cluster: Cluster, picks: list[tuple[int, int]]
) -> None:
    """balance keeps its objective up to date move by move and scores a move by the exact change
    it makes (gains); after any sequence of allowed moves both agree with the objective computed
    afresh from the placement by its one definition (imbalance.balance_objective), and the moves
    made all at once (move_all) give the values made one by one, bit for bit."""
    cons = Constraints.build(cluster)
    state, batch = BalanceState(cluster, cons), BalanceState(cluster, cons)
    loads, weights = state.loads, resource_weights(cluster.settings)

    def defined() -> float:
        fresh = loads.loads(state.where)
        return float(balance_objective(fresh, loads.capacity, weights, state.group))

    assert state.objective() == pytest.approx(defined(), rel=1e-9, abs=1e-12)
    movable = np.nonzero(state.units.movable)[0]
    nodes = np.arange(len(cluster.nodes))
    made: list[tuple[int, int]] = []
    for a, b in picks if movable.size else []:
        u = int(movable[a % movable.size])
        allowed = state.allowed(np.array([u]), nodes)[0]
        if not state.broken[u]:
            allowed[state.units.assign[u]] = False  # a move, not a stay
        targets = np.nonzero(allowed)[0]
        if targets.size == 0:
            continue
        t = int(targets[b % targets.size])
        gain = state.gains(np.array([u]), np.array([t]))[0, 0]
        from_usable = bool(state.usable[state.occupied(u)].all())
        before = defined()
        state.move(u, t)
        made.append((u, t))
        after = defined()
        assert state.objective() == pytest.approx(after, rel=1e-9, abs=1e-12)
        if from_usable:  # leaving an unusable node moves the mean, which gains() leaves out
            assert gain == pytest.approx(before - after, rel=1e-9, abs=1e-12)
    replay = BalanceState(cluster, cons)
    for (u, t), (_src, value) in zip(made, batch.move_all(made), strict=True):
        replay.move(u, t)
        assert value == replay.objective()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.randoms(use_true_random=False), st.booleans())
def test_a_window_found_idle_is_searched_again_only_where_moves_changed_it(
    cluster: Cluster, rnd: Random, shaped: bool
) -> None:
    state = BalanceState(cluster, Constraints.build(cluster))
    state.goal = np.full(len(RESOURCES), 0.01)
    nodes = list(range(len(cluster.nodes)))
    idle = IdleWindows(state)
    windows = {
        w: tuple(np.array(sorted(rnd.sample(nodes, rnd.randint(1, len(nodes))))) for _ in "st")
        for w in (1, 2)
    }

    def search(w: int) -> tuple[list[tuple[float, int, int]], list[tuple[float, int, int]]]:
        sources, targets = windows[w]
        cand = state.units_on(sources)
        whole = pick(state, cand, targets, forced=False, shaped=shaped, limit=8)
        return idle.pick(cand, sources, targets, w, 8, shaped), whole

    for w, (sources, targets) in windows.items():
        if not search(w)[1]:
            idle.record(sources, targets, w)
    for _ in range(4):
        movable = state.units_on(np.array(nodes))
        if movable.size == 0:
            break
        u = int(rnd.choice(movable.tolist()))
        allowed = [n for n in nodes if state.allowed_one(u, n)]
        if not allowed:
            continue
        state.move(u, rnd.choice(allowed))
        for w in windows:
            found, whole = search(w)
            assert found == whole
