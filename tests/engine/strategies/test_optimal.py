"""The ``optimal`` strategy: exact answers on small literal clusters, proven by CP-SAT."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from clusters import clusters
from opendrs.engine.constraints import Constraints, current_assign
from opendrs.engine.objective import LOAD_SCALE, SOFT_PENALTY
from opendrs.engine.strategies import DEFAULT_STRATEGY, get_strategy
from opendrs.engine.strategies.base import Request
from opendrs.engine.strategies.optimal import (
    OptimalOptions,
    initial_spread,
    propose_optimal,
    thresholds_exceeded,
)
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Disk, Guest, Node, Pressure, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3
LIMIT = 5.0


def node(name: str, memory: int = 64, cpu: float = 16, **kw: object) -> Node:
    return Node(name, cpu, memory * GiB, **kw)  # type: ignore[arg-type]


def guest(gid: str, where: str, memory: int, cpu: float = 2, **kw: object) -> Guest:
    return Guest(gid, where, cpu=cpu, memory=memory * GiB, **kw)  # type: ignore[arg-type]


def cluster(
    nodes: list[Node], guests: list[Guest], rules: Rules | None = None, **settings: object
) -> Cluster:
    return Cluster(
        tuple(nodes),
        tuple(guests),
        rules or Rules(),
        Settings(**{"mode": "static", **settings}),  # type: ignore[arg-type]
    )


def solve(c: Cluster, forbidden: Iterable[tuple[str, str]] = (), **options: object):
    """``optimal`` on ``c`` with ``options`` (checked as a configuration's are), ``forbidden``
    placements refused."""
    typed = OptimalOptions.parse("optimal", {"time_limit": LIMIT, **options})
    return propose_optimal(CycleView(c), Request(forbidden=frozenset(forbidden)), typed)


def targets(proposal) -> dict[str, str]:
    return {m.guest: m.target for m in proposal.moves}


def final_assign(c: Cluster, proposal) -> np.ndarray:
    return current_assign(c.with_placement(proposal.placement))


def solver(proposal) -> dict:
    return proposal.options["solver"]


# --------------------------------------------------------------------------------------------
# Proven answers


def test_registered() -> None:
    assert get_strategy("optimal").options.defaults()["time_limit"] == 10.0


def test_three_nodes_six_guests_memory() -> None:
    # 56 GiB on n0; sizes are multiples of 4 GiB, so the best split of 56 is 20/20/16: a spread of
    # 4 GiB of 64 at priority 2 = 12.5 % = 1250. n0 keeps 20 GiB, so 36 GiB move: cost 36·4 = 144.
    # Objective at level 5 (w_balance 100, w_stickiness 1): 100·1250 + 144. Of the two ways to keep
    # 20 GiB on n0 (16+4 or 8+8+4), the tie-break moves three guests rather than four.
    c = cluster(
        [node("n0"), node("n1"), node("n2")],
        [guest(f"g{i}", "n0", m) for i, m in enumerate([16, 16, 8, 8, 4, 4])],
    )
    p = solve(c, method="memory", balanciness=5)
    info = solver(p)
    assert info["status"] == "OPTIMAL"
    assert info["objective"] == 100 * 1250 + 144 == info["bound"]
    assert info["gap"] == 0
    assert info["spread"] == 1250
    assert info["migration_cost"] == 144
    assert info["current_objective"] == 100 * 17500
    assert len(p.moves) == 3
    loads = {n: 0 for n in ("n0", "n1", "n2")}
    final = {g.id: g.node for g in c.guests} | targets(p)
    for g in c.guests:
        loads[final[g.id]] += g.memory // GiB
    assert loads["n0"] == 20
    assert sorted(loads.values()) == [16, 20, 20]
    for m in p.moves:
        assert m.metric == "objective"
        assert (m.before, m.after) == (1750000.0, 125144.0)
        assert m.cost in (16 * 4, 4 * 4)  # 256 MiB units
    assert "OPTIMAL" in p.notes[-1] and "bound 125144" in p.notes[-1]
    assert p.after.resources["memory"].spread < p.before.resources["memory"].spread


def test_swap_only_an_exact_solver_finds() -> None:
    # a: 17 + 13 = 30, b: 15 + 11 = 26. No single move helps; swapping 13 and 11 balances 28/28.
    c = cluster(
        [node("a"), node("b")],
        [
            guest("g17", "a", 17),
            guest("g13", "a", 13),
            guest("g15", "b", 15),
            guest("g11", "b", 11),
        ],
    )
    p = solve(c, method="memory", balanciness=5, hint="current")
    assert solver(p)["status"] == "OPTIMAL"
    assert targets(p) == {"g13": "b", "g11": "a"}
    assert solver(p)["spread"] == 0
    assert solver(p)["objective"] == (13 + 11) * 4
    # Started from the current placement (no move at all).
    assert solver(p)["hint_objective"] == solver(p)["current_objective"] == 100 * 1250
    # The default warm start, balance, finds the same exchange in its last phase: one guest's
    # step on the smallest node (11 GiB of 64: 17 pp) is coarser than its 1 pp target, and in
    # whole GiB the memory can be even.
    warm = solve(c, method="memory", balanciness=5)
    assert targets(warm) == {"g13": "b", "g11": "a"}
    assert solver(warm)["hint_objective"] == solver(warm)["objective"] == (13 + 11) * 4


def test_forbidden_placements_are_honoured() -> None:
    c = cluster(
        [node("a"), node("b")],
        [
            guest("g17", "a", 17),
            guest("g13", "a", 13),
            guest("g15", "b", 15),
            guest("g11", "b", 11),
        ],
    )
    p = solve(c, method="memory", balanciness=5, forbidden=[("g13", "b")])
    assert targets(p) == {"g17": "b", "g15": "a"}  # the next best swap
    assert solver(p)["objective"] == (17 + 15) * 4
    p = solve(c, method="memory", balanciness=5, forbidden=[("g13", "b"), ("g17", "b")])
    assert "g13" not in targets(p) and "g17" not in targets(p)


def test_infeasible_capacity_is_reported() -> None:
    c = cluster(
        [node("a", 16), node("b", 16)],
        [guest("x", "a", 12), guest("y", "a", 12), guest("z", "b", 12)],
    )
    p = solve(c)
    assert solver(p)["status"] == "INFEASIBLE"
    assert solver(p)["feasible"] is False
    assert p.moves == ()
    assert p.stopped.startswith("infeasible: no placement satisfies the hard constraints")
    assert "36.0 GiB of memory" in p.stopped and "32.0 GiB of memory" in p.stopped


def test_infeasible_packing_is_explained() -> None:
    # 30 GiB fit in 32 in total, but not one 10 GiB guest more per 16 GiB node.
    c = cluster(
        [node("a", 16), node("b", 16)],
        [guest("x", "a", 10), guest("y", "b", 10), guest("z", "b", 10)],
    )
    p = solve(c)
    assert solver(p)["status"] == "INFEASIBLE"
    assert "memory capacity of a" in p.stopped and "memory capacity of b" in p.stopped


def test_overloaded_node_is_relieved_even_when_conservative() -> None:
    # 60 GiB on a 64 GiB node with an 8 GiB reserve: it must move, whatever the level.
    c = cluster([node("a", reserve_memory=8 * GiB), node("b", 128)], [guest("big", "a", 60)])
    p = solve(c, method="memory", balanciness=1)
    assert solver(p)["status"] == "OPTIMAL"
    assert targets(p) == {"big": "b"}
    assert p.moves[0].reason == "leaves a: over capacity"
    assert solver(p)["current_feasible"] is False


def test_capacity_counts_vcpus_with_overcommit_and_storage_pools() -> None:
    nodes = [
        node("a", cpu=4, storage={"local": 100 * GiB}),
        node("b", cpu=4, storage={"local": 30 * GiB}),
    ]
    guests = [
        guest("cpu", "a", 1, cpu=6),
        guest("cpu2", "a", 1, cpu=6),
        guest("disk", "a", 1, cpu=1, disks=(Disk("local", 40 * GiB),)),
    ]
    c = cluster(nodes, guests, cpu_overcommit=2.0, allow_local_disks=True)
    p = solve(c, balanciness=5)
    final = {g.id: g.node for g in guests} | targets(p)
    # 8 vCPUs per node: the two 6-vCPU guests cannot share; the disk does not fit on b.
    assert final["cpu"] != final["cpu2"]
    assert final["disk"] == "a"
    assert Constraints.build(c).violations(final_assign(c, p)) == []


def test_pins_anti_affinity_affinity_and_maintenance() -> None:
    nodes = [node("a"), node("b"), node("c"), node("d", maintenance=True)]
    guests = [
        guest("web1", "a", 4),
        guest("web2", "a", 4),
        guest("web3", "a", 4),
        guest("db", "a", 8),
        guest("db-cache", "b", 2),
        guest("mon", "d", 2),
    ]
    rules = Rules(
        node_affinity=(NodeAffinity("mon-on-c", ("mon",), {"c": 0}, strict=True),),
        guest_affinity=(
            GuestAffinity("web-apart", ("web1", "web2", "web3"), positive=False),
            GuestAffinity("db-together", ("db", "db-cache"), positive=True),
        ),
    )
    c = cluster(nodes, guests, rules)
    p = solve(c, balanciness=5)
    assert solver(p)["status"] == "OPTIMAL"
    final = {g.id: g.node for g in guests} | targets(p)
    assert final["mon"] == "c"
    assert len({final["web1"], final["web2"], final["web3"]}) == 3
    assert final["db"] == final["db-cache"]
    assert "d" not in final.values()
    assert Constraints.build(c).violations(final_assign(c, p)) == []
    reasons = {m.guest: m.reason for m in p.moves}
    assert reasons["mon"] == "leaves d: maintenance"


def test_implicit_negatives_of_a_bundle() -> None:
    # x and y must share a node; y and z must not: so x and z may not share one either.
    rules = Rules(
        guest_affinity=(
            GuestAffinity("xy", ("x", "y"), positive=True),
            GuestAffinity("yz", ("y", "z"), positive=False),
        )
    )
    c = cluster(
        [node("a"), node("b")], [guest("x", "a", 8), guest("y", "b", 8), guest("z", "b", 8)], rules
    )
    p = solve(c, balanciness=1)
    final = {g.id: g.node for g in c.guests} | targets(p)
    assert final["x"] == final["y"] != final["z"]
    assert len(p.moves) == 1 and p.moves[0].guest == "y"  # the cheapest repair


def test_soft_rules_are_penalties() -> None:
    rules = Rules(
        node_affinity=(NodeAffinity("prefer-b", ("s",), {"b": 1}, strict=False),),
        guest_affinity=(GuestAffinity("apart", ("p", "q"), positive=False, hard=False),),
    )
    c = cluster(
        [node("a"), node("b")], [guest("s", "a", 1), guest("p", "a", 1), guest("q", "a", 1)], rules
    )
    p = solve(c, balanciness=1)
    info = solver(p)
    assert info["current_objective"] == 2 * SOFT_PENALTY
    assert info["soft_penalties"] == 0
    final = {g.id: g.node for g in c.guests} | targets(p)
    assert final["s"] == "b" and final["p"] != final["q"]


def test_immovable_guests_stay() -> None:
    c = cluster(
        [node("a"), node("b")],
        [
            guest("locked", "a", 30, lock="backup"),
            guest("free", "a", 30),
            guest("ct", "a", 2, kind="ct"),
        ],
    )
    p = solve(c, method="memory", balanciness=5)
    assert set(targets(p)) == {"free"}  # containers need restart migration, not allowed here


def test_no_allowed_node_relaxed_or_strict() -> None:
    rules = Rules(node_affinity=(NodeAffinity("pin", ("x",), {"b": 0}, strict=True),))
    c = cluster(
        [node("a"), node("b", maintenance=True)], [guest("x", "b", 4), guest("y", "b", 4)], rules
    )
    relaxed = solve(c)
    assert solver(relaxed)["status"] == "OPTIMAL"
    assert targets(relaxed) == {"y": "a"}
    assert any("no node can take guest x" in n and "stays on b" in n for n in relaxed.notes)
    strict = solve(c, strict=True)
    assert solver(strict)["status"] == "INFEASIBLE"
    assert "no node can take guest x" in strict.stopped


def test_contradictory_rules_dropped_or_infeasible() -> None:
    rules = Rules(
        guest_affinity=(
            GuestAffinity("r1", ("x", "y"), positive=True),
            GuestAffinity("r2", ("y", "z"), positive=True),
            GuestAffinity("apart", ("x", "z"), positive=False),
        )
    )
    c = cluster(
        [node("a"), node("b")], [guest("x", "a", 4), guest("y", "a", 4), guest("z", "b", 4)], rules
    )
    # The merged positive group {x, y, z} and the negative rule contradict each other: all
    # three rules are dropped (Proxmox drops both sides of such a conflict).
    relaxed = solve(c, balanciness=1)
    assert any("Drop rules 'r1', 'r2', 'apart'" in n for n in relaxed.notes)
    assert targets(relaxed) == {}
    strict = solve(c, balanciness=1, strict=True)
    assert solver(strict)["status"] == "INFEASIBLE"
    assert "rules 'r1', 'r2', 'apart'" in strict.stopped


# --------------------------------------------------------------------------------------------
# Balanciness, thresholds and methods


def two_node_drift() -> Cluster:
    # 10 GiB of 100 apart at priority 2: a spread of 20 % (proxlb-solver's doubling).
    return cluster(
        [node("a", 100), node("b", 100)], [guest("big", "a", 30), guest("small", "b", 20)]
    )


def test_balanciness_levels_change_the_answer() -> None:
    c = cluster(
        [node("n0"), node("n1"), node("n2")],
        [guest(f"g{i}", "n0", m) for i, m in enumerate([16, 16, 8, 8, 4, 4])],
    )
    moves = {level: len(solve(c, method="memory", balanciness=level).moves) for level in (1, 2, 5)}
    assert moves[1] == 0
    assert moves[5] == 3
    p2 = solve(c, method="memory", balanciness=2)  # w_stickiness 50 weighs the cost more
    assert solver(p2)["w_balance"] == 1 and solver(p2)["w_stickiness"] == 50
    assert 0 < moves[2] <= moves[5]

    c2 = two_node_drift()
    assert initial_spread(c2, "memory") == pytest.approx(0.2)
    p3 = solve(c2, method="memory", balanciness=3)  # 20 % ≥ 15 %: balancing on
    p2 = solve(c2, method="memory", balanciness=2)  # 20 % < 25 %: off
    assert solver(p3)["w_balance"] == 10
    assert solver(p2)["w_balance"] == 0 and p2.moves == ()
    assert "below the level-2 threshold 25%" in p2.stopped


def test_weights_override_the_level() -> None:
    c = cluster(
        [node("n0"), node("n1"), node("n2")],
        [guest(f"g{i}", "n0", m) for i, m in enumerate([16, 16, 8, 8, 4, 4])],
    )
    sticky = solve(c, method="memory", balanciness=5, w_stickiness=10_000)
    assert (solver(sticky)["w_balance"], solver(sticky)["w_stickiness"]) == (100, 10_000)
    # 24/16/16 costs 100·2500 + 10,000·128 = 1.53 M; 20/20/16 costs 100·1250 + 10,000·144
    # = 1.565 M; staying costs 100·17500 = 1.75 M. So only the two big guests move.
    assert {m.guest for m in sticky.moves} == {"g0", "g1"}
    assert solver(sticky)["objective"] == 100 * 2500 + 10_000 * 128
    # The level's gap threshold still applies (proxlb-solver's rule): level 1 needs 100 %.
    off = solve(two_node_drift(), method="memory", balanciness=1, w_balance=100)
    assert solver(off)["w_balance"] == 0


def test_thresholds_gate_balancing() -> None:
    c = cluster([node("a"), node("b")], [guest("x", "a", 32)])
    assert thresholds_exceeded(c, "memory", {"memory": 80}) == (False, [])
    p = solve(c, method="memory", balanciness=5, memory_threshold=80)
    assert p.moves == () and solver(p)["w_balance"] == 0
    exceeded, which = thresholds_exceeded(c, "memory", {"memory": 40})
    assert exceeded and which == ["a memory 50.0% > 40%"]
    p = solve(c, method="memory", balanciness=5, memory_threshold=40)
    assert solver(p)["w_balance"] == 100


def test_balance_method_uses_cpu_and_memory_of_the_usage_mode() -> None:
    # Memory is balanced, CPU is not: only the default method (cpu and memory) sees it.
    c = cluster(
        [node("a"), node("b")],
        [guest("hot", "a", 8, cpu=8), guest("warm", "a", 8, cpu=4), guest("cold", "b", 16, cpu=1)],
    )
    assert initial_spread(c, "memory") == 0
    assert initial_spread(c, "balance") == pytest.approx(0.5 * (12 - 1) / 16)
    p = solve(c, balanciness=5)
    assert solver(p)["status"] == "OPTIMAL"
    assert targets(p) == {"warm": "b"}  # cpu 8/5 of 16, memory 8/24 of 64
    assert solver(p)["spread"] < solver(p)["current_spread"]
    assert solve(c, method="memory", balanciness=5).moves == ()


def test_psi_method_counts_guest_pressure_with_priority() -> None:
    c = cluster(
        [node("a"), node("b")],
        [
            guest("stall", "a", 4, pressure=Pressure(cpu=15.0), priority=3),
            guest("calm", "a", 4, pressure=Pressure(cpu=2.0)),
        ],
    )
    p = solve(c, method="cpu_psi", balanciness=5)
    # a: (15·3 + 2·2)/100 = 49 % -> moving "stall" leaves 4 % against 45 %.
    assert solver(p)["current_spread"] == 4900
    assert targets(p) == {"stall": "b"}
    assert solver(p)["spread"] == 4100


def test_assigned_usage_and_smart_weights() -> None:
    c = cluster(
        [node("a"), node("b")], [guest("x", "a", 4, cpu=4, cpu_used=0.5), guest("y", "a", 4, cpu=4)]
    )
    used = solve(c, method="cpu", balanciness=5)
    assigned = solve(c, method="cpu", usage="assigned", balanciness=5)
    assert solver(used)["current_spread"] == int(4.5 * 2 * LOAD_SCALE) // 16
    assert solver(assigned)["current_spread"] == 8 * 2 * LOAD_SCALE // 16
    smart = solve(c, method="cpu_smart", balanciness=5, w_cpu_usage=3, w_cpu_psi=0)
    assert solver(smart)["current_spread"] == 3 * solver(used)["current_spread"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"method": "nope"}, "method"),
        ({"balanciness": 6}, "balanciness"),
        ({"usage": "x"}, "usage"),
        ({"w_balance": 1.5}, "w_balance"),
        ({"w_cpu_psi": -1}, "w_cpu_psi"),
        ({"time_limit": 0}, "time_limit"),
        ({"workers": 0}, "workers"),
        ({"memory_threshold": "high"}, "memory_threshold"),
        ({"seed": -1}, "seed"),
        ({"hint": "nonesuch"}, "hint: unknown strategy 'nonesuch'"),
    ],
)
def test_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        solve(two_node_drift(), **options)


# --------------------------------------------------------------------------------------------
# Determinism and the warm start


def test_deterministic() -> None:
    c = cluster(
        [node(f"n{i}", 64 + 32 * (i % 2)) for i in range(3)],
        [guest(f"g{i}", f"n{i % 2}", 2 + (7 * i) % 11, cpu=1 + i % 4) for i in range(10)],
    )
    first = solve(c, balanciness=4)
    assert solver(first)["status"] == "OPTIMAL" and first.moves
    second = solve(c, balanciness=4)
    assert first.moves == second.moves
    assert first.stopped == second.stopped
    assert solver(first)["objective"] == solver(second)["objective"]


def test_hint_current_and_result_never_worse_than_hint() -> None:
    c = cluster(
        [node("a"), node("b"), node("c")],
        [guest(f"g{i}", "a", 2 + i) for i in range(8)],
    )
    p = solve(c, method="memory", balanciness=4, hint="current")
    assert solver(p)["hint"] == "current"
    default = solve(c, method="memory", balanciness=4)
    assert solver(default)["hint"] == DEFAULT_STRATEGY
    assert solver(default)["objective"] <= solver(default)["hint_objective"]
    assert solver(p)["objective"] == solver(default)["objective"]


# --------------------------------------------------------------------------------------------
# Property: any answer keeps every hard constraint and is never worse than the hint


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(clusters(max_nodes=4, max_guests=10))
def test_answers_keep_hard_constraints(c: Cluster) -> None:
    p = propose_optimal(CycleView(c), Request(), OptimalOptions(time_limit=1.0, balanciness=5))
    info = solver(p)
    if not info["feasible"]:
        assert p.moves == ()
        assert info["status"] in ("INFEASIBLE", "UNKNOWN")
        return
    cons = Constraints.build(c)
    before = set(cons.violations(current_assign(c)))
    after = set(cons.violations(final_assign(c, p)))
    assert after <= before, after - before
    if info["hint_objective"] is not None:
        assert info["objective"] <= info["hint_objective"]
    if info["current_feasible"]:
        assert info["objective"] <= info["current_objective"]
    if info["status"] == "OPTIMAL":
        assert info["bound"] == info["objective"]
