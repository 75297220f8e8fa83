"""The planner: hand-checked plans on literal clusters, and safety properties on random ones."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import clusters
from opendrs.engine.constraints import Constraints, committed_for, current_assign
from opendrs.engine.planner import (
    Plan,
    PlannedMove,
    final_placement,
    plan_moves,
    plan_with_retries,
)
from opendrs.engine.strategies.base import Proposal, ProposedMove, cluster_imbalance
from opendrs.engine.usage import tolerance
from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3
STATIC = Settings(mode="static", cpu_overcommit=2.0)


def _steps(plan: Plan) -> list[list[tuple[str, str, str]]]:
    """The plan as steps of (guest, source, target), parking moves marked with a '*'."""
    return [
        [(m.guest + ("*" if m.parking else ""), m.source, m.target) for m in step]
        for step in plan.by_step()
    ]


def _pins(**pins: tuple[str, ...]) -> tuple[NodeAffinity, ...]:
    return tuple(
        NodeAffinity(f"pin-{guest}", (guest,), dict.fromkeys(nodes, 0), strict=True)
        for guest, nodes in pins.items()
    )


# --------------------------------------------------------------------------------------------
# Literal cases


def test_chain_waits_for_room() -> None:
    # b holds 40 of 64 GiB: x (40 GiB) can go there only once y has left.
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB), Node("c", 16, 64 * GiB))
    guests = (
        Guest("x", "a", cpu=2, memory=40 * GiB),
        Guest("y", "b", cpu=2, memory=40 * GiB),
    )
    cluster = Cluster(nodes, guests, settings=STATIC)
    plan = plan_moves(cluster, {"x": "b", "y": "c"})
    assert _steps(plan) == [[("y", "b", "c")], [("x", "a", "b")]]
    assert plan.feasible and plan.unreachable == () and plan.problems == ()
    assert plan.steps == 2
    assert plan.moves[1] == PlannedMove("x", "a", "b", 2)


def test_transit_counts_on_both_nodes() -> None:
    # b has room for x only after y has left; y in transit still counts on b.
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB), Node("c", 16, 64 * GiB))
    guests = (
        Guest("x", "a", cpu=2, memory=30 * GiB),
        Guest("y", "b", cpu=2, memory=40 * GiB),
    )
    plan = plan_moves(Cluster(nodes, guests, settings=STATIC), {"x": "b", "y": "c"})
    assert plan.steps == 2
    # With room for both (x is 24 GiB: 40 + 24 = 64), they run at once.
    guests = (Guest("x", "a", cpu=2, memory=24 * GiB), guests[1])
    plan = plan_moves(Cluster(nodes, guests, settings=STATIC), {"x": "b", "y": "c"})
    assert _steps(plan) == [[("x", "a", "b"), ("y", "b", "c")]]


def _circular_swap(*extra: Node) -> Cluster:
    """proxlb-solver's circular_swap: two 50 GiB guests swap between two 64 GiB nodes."""
    nodes = (
        Node("node-A", 16, 64 * GiB),
        Node("node-B", 16, 64 * GiB),
        Node("node-C", 16, 64 * GiB),
        *extra,
    )
    guests = (
        Guest("vm-a", "node-A", cpu=4, memory=50 * GiB),
        Guest("vm-b", "node-B", cpu=4, memory=50 * GiB),
    )
    rules = Rules(
        node_affinity=_pins(**{"vm-a": ("node-B", "node-C"), "vm-b": ("node-A", "node-C")})
    )
    return Cluster(nodes, guests, rules, STATIC)


def test_swap_between_full_nodes_parks_on_the_third() -> None:
    plan = plan_moves(_circular_swap(), {"vm-a": "node-B", "vm-b": "node-A"})
    assert _steps(plan) == [
        [("vm-a*", "node-A", "node-C")],
        [("vm-b", "node-B", "node-A")],
        [("vm-a", "node-C", "node-B")],
    ]
    assert plan.feasible and plan.problems == ()
    assert plan.as_dict()["moves"][0] == {
        "guest": "vm-a",
        "source": "node-A",
        "target": "node-C",
        "step": 1,
        "parking": True,
    }


def test_spare_is_the_node_with_most_headroom_in_every_dimension() -> None:
    nodes = (
        Node("a", 16, 64 * GiB),
        Node("b", 16, 64 * GiB),
        # First by name, but its vCPUs are nearly all committed: proxlb-solver would check RAM only
        # and pick it; opendrs counts every dimension.
        Node("aa-cpu-full", 4, 256 * GiB),
        Node("m-small", 16, 64 * GiB),
        Node("z-roomy", 32, 128 * GiB),
    )
    guests = (
        Guest("1", "a", cpu=4, memory=50 * GiB),
        Guest("2", "b", cpu=4, memory=50 * GiB),
        Guest("busy", "aa-cpu-full", cpu=6, memory=8 * GiB),
    )
    cluster = Cluster(nodes, guests, settings=STATIC)
    plan = plan_moves(cluster, {"1": "b", "2": "a"})
    assert _steps(plan) == [[("1*", "a", "z-roomy")], [("2", "b", "a")], [("1", "z-roomy", "b")]]


def test_unbreakable_cycle() -> None:
    nodes = (Node("node-A", 16, 64 * GiB), Node("node-B", 16, 64 * GiB))
    guests = (
        Guest("vm-a", "node-A", cpu=4, memory=50 * GiB),
        Guest("vm-b", "node-B", cpu=4, memory=50 * GiB),
    )
    plan = plan_moves(Cluster(nodes, guests, settings=STATIC), {"vm-a": "node-B", "vm-b": "node-A"})
    assert not plan.feasible
    assert plan.moves == ()
    assert plan.unreachable == (("vm-a", "node-B"), ("vm-b", "node-A"))
    assert plan.problems == (
        "Cycle guest vm-a (node-A → node-B), guest vm-b (node-B → node-A) cannot be broken: "
        "no spare node can take one of its guests safely",
    )


def test_spare_must_pass_static_constraints() -> None:
    # node-C exists but the pins (which allow where each guest is now) keep both off it.
    cluster = _circular_swap()
    both = ("node-A", "node-B")
    rules = Rules(node_affinity=_pins(**{"vm-a": both, "vm-b": both}))
    cluster = Cluster(cluster.nodes, cluster.guests, rules, STATIC)
    plan = plan_moves(cluster, {"vm-a": "node-B", "vm-b": "node-A"})
    assert not plan.feasible and "cannot be broken" in plan.problems[0]


def test_guest_outside_its_pins_may_wait_outside_them() -> None:
    # Each guest sits outside its pin now: parking it on node-C is no worse (proxlb-solver's
    # affinity_cycle and pve_anti_affinity_swap scenarios).
    cluster = _circular_swap()
    rules = Rules(node_affinity=_pins(**{"vm-a": ("node-B",), "vm-b": ("node-A",)}))
    cluster = Cluster(cluster.nodes, cluster.guests, rules, STATIC)
    plan = plan_moves(cluster, {"vm-a": "node-B", "vm-b": "node-A"})
    assert plan.feasible
    assert any(m.parking and m.target == "node-C" for m in plan.moves)


def test_limits_per_step_and_per_node() -> None:
    nodes = tuple(Node(n, 64, 256 * GiB) for n in ("a", "b", "c", "d"))
    guests = tuple(Guest(str(i), "a", cpu=1, memory=GiB) for i in range(6))
    cluster = Cluster(nodes, guests, settings=STATIC)
    target = {"0": "b", "1": "b", "2": "b", "3": "c", "4": "c", "5": "d"}

    plan = plan_moves(cluster, target, max_parallel=2, max_node_inflow=1)
    assert _steps(plan) == [
        [("0", "a", "b"), ("3", "a", "c")],
        [("1", "a", "b"), ("4", "a", "c")],
        [("2", "a", "b"), ("5", "a", "d")],
    ]
    plan = plan_moves(cluster, target, max_parallel=4, max_node_inflow=2)
    assert [len(s) for s in plan.by_step()] == [4, 2]
    assert all(max(Counter(m.target for m in s).values()) <= 2 for s in plan.by_step())
    # The cluster's settings are the defaults: 4 at once, 1 per node.
    plan = plan_moves(cluster, target)
    assert [len(s) for s in plan.by_step()] == [3, 2, 1]


def test_no_hard_anti_affinity_pair_meets_in_transit() -> None:
    nodes = tuple(Node(n, 16, 64 * GiB) for n in ("a", "b", "c"))
    guests = (Guest("x", "a", cpu=1, memory=GiB), Guest("y", "b", cpu=1, memory=GiB))
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("x", "y"), positive=False),))
    plan = plan_moves(Cluster(nodes, guests, rules, STATIC), {"x": "b", "y": "c"})
    # x may not arrive on b while y is still leaving it.
    assert _steps(plan) == [[("y", "b", "c")], [("x", "a", "b")]]
    # Without the rule both run at once.
    plan = plan_moves(Cluster(nodes, guests, Rules(), STATIC), {"x": "b", "y": "c"})
    assert plan.steps == 1
    # Two partners heading for the same node: the second can never arrive.
    plan = plan_moves(Cluster(nodes, guests, rules, STATIC), {"x": "c", "y": "c"})
    assert plan.unreachable == (("y", "c"),)
    assert plan.problems == (
        "guest y cannot move to c: its hard anti-affinity partner x goes there too",
    )
    # Named guests are named as the operator knows them; the unreachable moves keep the ids.
    named = tuple(replace(g, name=f"db-{g.id}") for g in guests)
    plan = plan_moves(Cluster(nodes, named, rules, STATIC), {"x": "c", "y": "c"})
    assert plan.unreachable == (("y", "c"),)
    assert plan.problems == (
        "guest db-y (y) cannot move to c: its hard anti-affinity partner db-x (x) goes there too",
    )


def test_anti_affinity_swap_parks_on_a_spare() -> None:
    # Plenty of room, but two partners swapping would meet: one waits on a spare.
    nodes = tuple(Node(n, 16, 100 * GiB) for n in ("A", "B", "C"))
    guests = (Guest("a", "A", cpu=2, memory=8 * GiB), Guest("b", "B", cpu=2, memory=8 * GiB))
    rules = Rules(guest_affinity=(GuestAffinity("apart", ("a", "b"), positive=False),))
    plan = plan_moves(Cluster(nodes, guests, rules, STATIC), {"a": "B", "b": "A"})
    assert _steps(plan) == [[("a*", "A", "C")], [("b", "B", "A")], [("a", "C", "B")]]


def test_overloaded_node_never_receives() -> None:
    # b holds 80 GiB on 64 GiB (say, memory overcommitted by hand); z leaving brings it to the
    # limit, so x can still never come in.
    nodes = tuple(Node(n, 16, 64 * GiB) for n in ("a", "b", "c"))
    guests = (
        Guest("x", "a", cpu=1, memory=4 * GiB),
        Guest("big", "b", cpu=1, memory=64 * GiB),
        Guest("z", "b", cpu=1, memory=16 * GiB),
    )
    plan = plan_moves(Cluster(nodes, guests, settings=STATIC), {"x": "b", "z": "c"})
    assert _steps(plan) == [[("z", "b", "c")]]
    assert plan.unreachable == (("x", "b"),)
    assert plan.problems == (
        "guest x cannot move to b: the target placement leaves no room for it there (memory)",
    )
    # Once moves off it have brought it within its limits, it may receive like any node: b holds
    # 84 GiB, z (20) and w (4) leave it one after the other (one arrival per step on c), and
    # only then is there room for x.
    guests = (
        Guest("x", "a", cpu=1, memory=2 * GiB),
        Guest("big", "b", cpu=1, memory=60 * GiB),
        Guest("z", "b", cpu=1, memory=20 * GiB),
        Guest("w", "b", cpu=1, memory=4 * GiB),
    )
    plan = plan_moves(Cluster(nodes, guests, settings=STATIC), {"x": "b", "z": "c", "w": "c"})
    assert plan.feasible
    assert _steps(plan) == [[("z", "b", "c")], [("w", "b", "c")], [("x", "a", "b")]]


def test_overloaded_target_in_dynamic_mode_never_receives() -> None:
    # Measured memory over the node's RAM: no guest may come in, whatever else it fits.
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB))
    guests = (
        Guest("x", "a", cpu=1, memory=GiB, cpu_used=0.1, memory_used=GiB),
        Guest("hog", "b", cpu=1, memory=32 * GiB, cpu_used=1.0, memory_used=70 * GiB),
    )
    cluster = Cluster(nodes, guests, settings=Settings(mode="dynamic"))
    plan = plan_moves(cluster, {"x": "b"})
    assert plan.moves == () and plan.unreachable == (("x", "b"),)
    assert "memory_used" in plan.problems[0]


def test_stopped_guests_with_local_disks_wait_for_storage() -> None:
    # Memory of b is full with a running guest; stopped guests commit only their local disks,
    # and a disk being copied occupies both pools.
    nodes = tuple(Node(n, 16, 64 * GiB, storage={"local": 150 * GiB}) for n in ("a", "b", "c"))
    guests = (
        Guest("s", "a", state="stopped", cpu=4, memory=32 * GiB, disks=(Disk("local", 100 * GiB),)),
        Guest("t", "b", state="stopped", cpu=4, memory=32 * GiB, disks=(Disk("local", 100 * GiB),)),
        Guest("full", "b", cpu=16, memory=64 * GiB),
    )
    plan = plan_moves(Cluster(nodes, guests, settings=STATIC), {"s": "b", "t": "c"})
    assert _steps(plan) == [[("t", "b", "c")], [("s", "a", "b")]]
    # Shared disks cost nothing on the pools: both move at once.
    shared = tuple(
        Guest(
            g.id,
            g.node,
            state=g.state,
            cpu=g.cpu,
            memory=g.memory,
            disks=(Disk("ceph", 100 * GiB, shared=True),),
        )
        for g in guests[:2]
    )
    plan = plan_moves(Cluster(nodes, (*shared, guests[2]), settings=STATIC), {"s": "b", "t": "c"})
    assert plan.steps == 1


def _bundle_cluster() -> Cluster:
    nodes = tuple(Node(n, 64, 256 * GiB) for n in ("a", "b", "c"))
    guests = (
        Guest("p1", "a", cpu=1, memory=GiB),
        Guest("p2", "a", cpu=1, memory=GiB),
        Guest("p3", "a", cpu=1, memory=GiB),
        Guest("q", "a", cpu=1, memory=GiB),
    )
    rules = Rules(guest_affinity=(GuestAffinity("together", ("p1", "p2", "p3"), positive=True),))
    return Cluster(nodes, guests, rules, STATIC)


def test_bundle_moves_in_one_step() -> None:
    cluster = _bundle_cluster()
    target = {"p1": "b", "p2": "b", "p3": "b", "q": "c"}
    plan = plan_moves(cluster, target, max_parallel=4, max_node_inflow=3)
    assert _steps(plan) == [[("p1", "a", "b"), ("p2", "a", "b"), ("p3", "a", "b"), ("q", "a", "c")]]
    # Three migrations count against max_parallel: q has to wait.
    plan = plan_moves(cluster, target, max_parallel=3, max_node_inflow=3)
    assert _steps(plan) == [
        [("p1", "a", "b"), ("p2", "a", "b"), ("p3", "a", "b")],
        [("q", "a", "c")],
    ]
    assert plan.problems == ()


def test_bundle_over_a_limit_runs_alone() -> None:
    # Three guests that must arrive together, one arrival per node and step allowed: the bundle
    # goes first (the busiest target), alone, and says so.
    plan = plan_moves(_bundle_cluster(), {"p1": "b", "p2": "b", "p3": "b", "q": "c"})
    assert plan.feasible
    assert _steps(plan) == [
        [("p1", "a", "b"), ("p2", "a", "b"), ("p3", "a", "b")],
        [("q", "a", "c")],
    ]
    assert plan.problems == (
        "bundle p1, p2, p3 moves 3 guests together, more than max_node_inflow=1: "
        "it runs alone in step 1",
    )


def test_nothing_to_do_and_bad_input() -> None:
    nodes = (Node("a", 4, 8 * GiB), Node("b", 4, 8 * GiB))
    cluster = Cluster(nodes, (Guest("1", "a", cpu=1, memory=GiB),), settings=STATIC)
    plan = plan_moves(cluster, {"1": "a"})
    assert plan == Plan((), True, (), ())
    assert plan.steps == 0 and plan.as_dict() == {
        "feasible": True,
        "steps": 0,
        "moves": [],
        "unreachable": [],
        "problems": [],
    }
    with pytest.raises(ValueError, match="unknown guest '2'"):
        plan_moves(cluster, {"2": "a"})
    with pytest.raises(ValueError, match="guest '1': unknown node 'zz'"):
        plan_moves(cluster, {"1": "zz"})
    with pytest.raises(ValueError, match="max_parallel"):
        plan_moves(cluster, {"1": "b"}, max_parallel=0)


def test_static_constraints_of_the_target() -> None:
    nodes = (
        Node("a", 4, 8 * GiB),
        Node("arm", 4, 8 * GiB, arch="aarch64"),
        Node("m", 4, 8 * GiB, maintenance=True),
        Node("p", 4, 8 * GiB),
    )
    guests = (Guest("1", "a", cpu=1, memory=GiB), Guest("2", "a", cpu=1, memory=GiB))
    rules = Rules(node_affinity=_pins(**{"2": ("a",)}))
    cluster = Cluster(nodes, guests, rules, STATIC)
    plan = plan_moves(cluster, {"1": "arm"})
    assert plan.unreachable == (("1", "arm"),)
    assert plan.problems == (
        "guest 1 cannot move to arm: architecture aarch64, guest needs x86_64",
    )
    plan = plan_moves(cluster, {"1": "m", "2": "p"})
    assert plan.unreachable == (("1", "m"), ("2", "p"))
    assert plan.problems == (
        "guest 1 cannot move to m: node in maintenance",
        "guest 2 cannot move to p: strict node affinity (pin-2)",
    )


def test_already_migrating_guest_is_not_moved_again() -> None:
    nodes = tuple(Node(n, 4, 8 * GiB) for n in ("a", "b", "c"))
    guests = (Guest("1", "a", cpu=1, memory=GiB, migrating_to="b"),)
    plan = plan_moves(Cluster(nodes, guests, settings=STATIC), {"1": "c"})
    assert plan.unreachable == (("1", "c"),)
    assert plan.problems == ("guest 1 is already migrating to b; it is not moved again",)


def test_plan_is_deterministic_whatever_the_mapping_order() -> None:
    cluster = _bundle_cluster()
    target = {"q": "c", "p3": "b", "p1": "b", "p2": "b"}
    assert plan_moves(cluster, target) == plan_moves(cluster, dict(sorted(target.items())))


# --------------------------------------------------------------------------------------------
# plan_with_retries


def _retry_cluster() -> Cluster:
    # A swap between two full nodes with no spare (c is too small to park 50 GiB): unreachable.
    nodes = (Node("A", 16, 64 * GiB), Node("B", 16, 64 * GiB), Node("C", 16, 16 * GiB))
    guests = (
        Guest("vm-a", "A", cpu=4, memory=50 * GiB),
        Guest("vm-b", "B", cpu=4, memory=50 * GiB),
        Guest("vm-c", "A", cpu=1, memory=4 * GiB),
    )
    return Cluster(nodes, guests, settings=STATIC)


def _proposal(cluster: Cluster, moves: list[tuple[str, str]]) -> Proposal:
    metrics = cluster_imbalance(cluster)
    proposed = tuple(ProposedMove(g, cluster.guest(g).node, n, "cv", 0.0, 0.0, 1) for g, n in moves)
    return Proposal("wishes", proposed, metrics, metrics, "done")


def _wishful(cluster: Cluster, calls: list[frozenset[tuple[str, str]]]):
    """A strategy: each guest goes to the first node of its wish list that is not forbidden."""
    wishes = {"vm-a": ["B"], "vm-b": ["A"], "vm-c": ["C"]}

    def propose(forbidden: frozenset[tuple[str, str]]) -> Proposal:
        calls.append(forbidden)
        static = Constraints.build(cluster, forbidden).static_ok()
        moves = []
        for guest, nodes in wishes.items():
            j = cluster.guest_index[guest]
            for node in nodes:
                if static[j, cluster.node_index[node]]:
                    moves.append((guest, node))
                    break
        return _proposal(cluster, moves)

    return propose


def test_plan_with_retries_asks_again_without_the_unreachable_placements() -> None:
    cluster = _retry_cluster()
    calls: list[frozenset[tuple[str, str]]] = []
    proposal, plan = plan_with_retries(cluster, _wishful(cluster, calls))
    assert calls == [frozenset(), frozenset({("vm-a", "B"), ("vm-b", "A")})]
    assert [(m.guest, m.target) for m in proposal.moves] == [("vm-c", "C")]
    assert plan.feasible and _steps(plan) == [[("vm-c", "A", "C")]]


def test_plan_with_retries_gives_up_and_keeps_the_safe_part() -> None:
    cluster = _retry_cluster()
    calls: list[frozenset[tuple[str, str]]] = []

    def stubborn(forbidden: frozenset[tuple[str, str]]) -> Proposal:
        calls.append(forbidden)
        return _proposal(cluster, [("vm-a", "B"), ("vm-b", "A"), ("vm-c", "C")])

    proposal, plan = plan_with_retries(cluster, stubborn, max_retries=3)
    # The second proposal ignores what is forbidden: no point in asking a third time.
    assert len(calls) == 2
    assert len(proposal.moves) == 3
    assert not plan.feasible
    assert _steps(plan) == [[("vm-c", "A", "C")]]
    assert plan.unreachable == (("vm-a", "B"), ("vm-b", "A"))
    assert plan.problems[-1] == (
        "Dropped placements vm-a → B, vm-b → A (proposed again although forbidden); "
        "the plan moves only the reachable rest."
    )

    calls.clear()
    _, plan = plan_with_retries(cluster, stubborn, max_retries=0)
    assert len(calls) == 1 and "after 1 proposal)" in plan.problems[-1]


# --------------------------------------------------------------------------------------------
# Properties


def _bundled(cons: Constraints, moves: tuple[PlannedMove, ...]) -> bool:
    """Whether all moves are one bundle going to one node (allowed to exceed the limits)."""
    idx = cons.cluster.guest_index
    groups = {int(cons.group_of[idx[m.guest]]) for m in moves}
    return len(groups) == 1 and -1 not in groups and len({m.target for m in moves}) == 1


def _check_plan(
    cluster: Cluster, target: dict[str, str], plan: Plan, parallel: int, inflow: int
) -> None:
    """Replay ``plan`` step by step and check the safety model independently of the planner."""
    cons = Constraints.build(cluster)
    cap = cons.capacity
    bound = cap.limit + tolerance(cap.limit)
    gidx, nidx = cluster.guest_index, cluster.node_index
    pos = current_assign(cluster)
    start = pos.copy()
    static = cons.usable[None, :] & cons.arch_ok.dense() & cons.strict_ok.dense()
    committed = cap.committed()
    for number, step in enumerate(plan.by_step(), start=1):
        assert step, "empty step"
        assert all(m.step == number for m in step)
        assert len({m.guest for m in step}) == len(step), "a guest moves twice in one step"
        per_node = Counter(m.target for m in step)
        if len(step) > parallel or max(per_node.values()) > inflow:
            assert _bundled(cons, step), f"step {number} over the limits"
        during = committed.copy()
        occupied: dict[int, set[int]] = {j: {int(pos[j])} for j in range(len(cluster.guests))}
        for m in step:
            j, t = gidx[m.guest], nidx[m.target]
            assert nidx[m.source] == pos[j], "a move starts where the guest is not"
            assert static[j, t], f"{m.guest} may not run on {m.target}"
            during[t] += cons.guest_demand(j)
            occupied[j].add(t)
        for t in per_node:
            n = nidx[t]
            assert np.all(during[n] <= bound[n]), f"step {number}: {t} over capacity"
        for j, partners in enumerate(cons.hard_neg):
            for p in partners.tolist():
                if p == j:
                    continue  # contradictory rules can list a guest as its own partner
                for n in occupied[j] & occupied[p]:
                    assert start[j] == start[p] == n, (
                        f"step {number}: {cluster.guests[j].id} meets {cluster.guests[p].id}"
                    )
        for m in step:
            pos[gidx[m.guest]] = nidx[m.target]
        committed = committed_for(cons, pos)
    # Where everyone ends.
    unreachable = dict(plan.unreachable)
    for guest, node in target.items():
        final = cluster.nodes[pos[gidx[guest]]].name
        if guest in unreachable:
            assert unreachable[guest] == node
            assert final == cluster.guest(guest).node or any(
                f"stays on {final}" in p for p in plan.problems
            )
        else:
            assert final == node
    assert plan.feasible == (not plan.unreachable)
    moved = {m.guest for m in plan.moves}
    assert moved <= set(target)
    # A bundle's members going to one node arrive in one step.
    arrival = {m.guest: (m.step, m.target) for m in plan.moves if not m.parking}
    for group in cons.groups:
        ids = [cluster.guests[j].id for j in group.tolist()]
        by_target: dict[str, set[int]] = {}
        for g in ids:
            if g in arrival and target.get(g) == arrival[g][1]:
                by_target.setdefault(arrival[g][1], set()).add(arrival[g][0])
        assert all(len(steps) == 1 for steps in by_target.values())


@st.composite
def planning_cases(draw: st.DrawFn) -> tuple[Cluster, dict[str, str], int, int]:
    cluster = draw(clusters(max_nodes=5, max_guests=16))
    static = Constraints.build(cluster).static_ok()
    target: dict[str, str] = {}
    for j, guest in enumerate(cluster.guests):
        allowed = [cluster.nodes[n].name for n in np.nonzero(static[j])[0].tolist()]
        if allowed and draw(st.integers(0, 3)) > 0:
            target[guest.id] = draw(st.sampled_from(allowed))
    return cluster, target, draw(st.integers(1, 4)), draw(st.integers(1, 3))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_cases())
def test_every_step_is_safe_and_feasible_plans_arrive(
    case: tuple[Cluster, dict[str, str], int, int],
) -> None:
    cluster, target, parallel, inflow = case
    plan = plan_moves(cluster, target, max_parallel=parallel, max_node_inflow=inflow)
    _check_plan(cluster, target, plan, parallel, inflow)
    again = plan_moves(
        cluster, dict(reversed(list(target.items()))), max_parallel=parallel, max_node_inflow=inflow
    )
    assert again == plan


@st.composite
def tight_swaps(draw: st.DrawFn) -> tuple[Cluster, dict[str, str], int, int]:
    """Full nodes whose guests trade places, a few spares of random size: cycles to break."""
    n_full = draw(st.integers(2, 4))
    sizes = [draw(st.sampled_from([8, 16, 24])) for _ in range(n_full)]
    nodes = [Node(f"f{i}", 64, 32 * GiB) for i in range(n_full)]
    nodes += [
        Node(f"s{i}", draw(st.sampled_from([2, 64])), draw(st.sampled_from([8, 16, 32])) * GiB)
        for i in range(draw(st.integers(0, 2)))
    ]
    guests = []
    for i, size in enumerate(sizes):
        for k in range(32 // size):
            guests.append(Guest(f"g{i}{k}", f"f{i}", cpu=1, memory=size * GiB))
    target = {
        g.id: draw(st.sampled_from([n.name for n in nodes[:n_full]]))
        for g in guests
        if draw(st.booleans())
    }
    cluster = Cluster(tuple(nodes), tuple(guests), settings=STATIC)
    return cluster, target, draw(st.integers(1, 4)), draw(st.integers(1, 2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tight_swaps())
def test_cycles_between_full_nodes_are_broken_safely(
    case: tuple[Cluster, dict[str, str], int, int],
) -> None:
    cluster, target, parallel, inflow = case
    plan = plan_moves(cluster, target, max_parallel=parallel, max_node_inflow=inflow)
    _check_plan(cluster, target, plan, parallel, inflow)
    # A guest is parked at most once, and every parked guest moves on.
    parked = Counter(m.guest for m in plan.moves if m.parking)
    assert all(count == 1 for count in parked.values())
    for guest in parked:
        moves = [m for m in plan.moves if m.guest == guest]
        assert len(moves) == 2 or any(f"{guest} stays on" in p for p in plan.problems)


@st.composite
def trades(draw: st.DrawFn) -> tuple[Cluster, dict[str, str], int, int]:
    """Guests trade places (a permutation of the current placement) under random hard rules."""
    n_nodes = draw(st.integers(2, 5))
    nodes = [
        Node(
            f"n{i}",
            draw(st.sampled_from([4, 8, 16])),
            draw(st.sampled_from([16, 24, 32])) * GiB,
            storage={"local": draw(st.sampled_from([0, 40, 100])) * GiB},
        )
        for i in range(n_nodes)
    ]
    nodes += [
        Node(f"s{i}", 16, draw(st.sampled_from([8, 32])) * GiB, storage={"local": 100 * GiB})
        for i in range(draw(st.integers(0, 2)))
    ]
    guests = [
        Guest(
            f"g{j:02d}",
            f"n{draw(st.integers(0, n_nodes - 1))}",
            cpu=draw(st.sampled_from([1, 2, 4])),
            memory=draw(st.sampled_from([4, 8])) * GiB,
            state=draw(st.sampled_from(["running", "running", "stopped"])),
            disks=draw(st.sampled_from([(), (), (Disk("local", 20 * GiB),)])),
        )
        for j in range(draw(st.integers(2, 24)))
    ]
    order = draw(st.permutations(range(len(guests))))
    target = {g.id: guests[order[k]].node for k, g in enumerate(guests)}
    ids = [g.id for g in guests]
    rules = tuple(
        GuestAffinity(
            f"r{k}",
            tuple(draw(st.lists(st.sampled_from(ids), min_size=2, max_size=3, unique=True))),
            positive=draw(st.booleans()),
        )
        for k in range(draw(st.integers(0, 4)))
    )
    settings_ = Settings(mode="static", cpu_overcommit=draw(st.sampled_from([1.0, 2.0])))
    cluster = Cluster(tuple(nodes), tuple(guests), Rules(guest_affinity=rules), settings_)
    return cluster, target, draw(st.integers(1, 5)), draw(st.integers(1, 3))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trades())
def test_trades_under_rules_are_safe(case: tuple[Cluster, dict[str, str], int, int]) -> None:
    cluster, target, parallel, inflow = case
    plan = plan_moves(cluster, target, max_parallel=parallel, max_node_inflow=inflow)
    _check_plan(cluster, target, plan, parallel, inflow)


def test_final_placement_the_last_move_wins() -> None:
    moves = [
        PlannedMove("1", "a", "c", 1, parking=True),
        PlannedMove("2", "b", "a", 1),
        PlannedMove("1", "c", "b", 2),
    ]
    assert final_placement(moves) == {"1": "b", "2": "a"}
    assert list(final_placement(moves)) == ["1", "2"]
