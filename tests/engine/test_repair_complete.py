"""Complete repairs (issue 12, part 1): what the greedy repair cannot place, the exact model and
the planner's parking moves repair — in ``balance``, in the shared :func:`repair`, in the daemon's
decisions whatever the strategy — and what nothing repairs is named, with what stops it.

The snapshots are in ``tests/repairs.py``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from opendrs.engine.planner import plan_with_retries
from opendrs.engine.policy import (
    Decision,
    PastMigrations,
    PolicyConfig,
    PolicyState,
    decide,
    repair,
)
from opendrs.engine.strategies.balance.options import BalanceOptions
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.strategies.exact_repair import solve_repair
from opendrs.engine.usage import Dimension, DimensionKind
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from repairs import cluster

GiB = 1024**3
NOW = 1_000_000.0


VCPUS = Dimension(DimensionKind.VCPUS)


def _steps(cluster: Cluster, **kw: object) -> list[tuple[int, str, str, str, bool]]:
    plan = repair(cluster, **kw).plan  # type: ignore[arg-type]
    assert plan is not None
    return [(m.step, m.guest, m.source, m.target, m.parking) for m in plan.moves]


def _decide(cluster: Cluster, config: PolicyConfig) -> Decision:
    return decide(cluster, NOW, config, PolicyState(), PastMigrations(), busy=False)


# --------------------------------------------------------------------------------------------
# The three cases, and an overloaded node


def test_two_full_nodes_swap_through_a_parking_move() -> None:
    swap = cluster("swap")
    proposal = propose_balance(swap, BalanceOptions(target_spread=1e6))
    assert not [n for n in proposal.notes if n.startswith("could not repair")]
    assert sorted((m.guest, m.target) for m in proposal.moves) == [("4", "a"), ("5", "b")]
    assert _steps(swap) == [
        (1, "4", "b", "c", True),
        (2, "5", "a", "b", False),
        (3, "4", "c", "a", False),
    ]


def test_maintenance_sheds_the_small_guest_first() -> None:
    assert _steps(cluster("maintenance")) == [(1, "2", "t", "s", False), (2, "1", "m", "t", False)]


def test_an_overloaded_node_is_relieved_by_making_room_elsewhere() -> None:
    assert _steps(cluster("overload")) == [(1, "4", "c", "b", False), (2, "3", "a", "c", False)]


def test_the_default_strategy_plans_the_repair_with_its_balancing() -> None:
    maintenance = cluster("maintenance")

    def propose(forbidden: frozenset[tuple[str, str]]):  # type: ignore[no-untyped-def]
        return propose_balance(maintenance, forbidden=forbidden)

    proposal, plan = plan_with_retries(maintenance, propose)
    assert plan.feasible and plan.steps == 2
    assert {m.guest: m.target for m in plan.moves}["1"] == "t"
    assert proposal.options["repair"]["exact"] == "OPTIMAL"


def test_the_exact_repair_is_the_same_every_time() -> None:
    for name in ("swap", "maintenance", "overload"):
        first, second = repair(cluster(name)), repair(cluster(name))
        assert first.plan == second.plan and first.proposal == second.proposal


# --------------------------------------------------------------------------------------------
# No repair at all


def test_a_repair_without_any_solution_names_the_guest_and_what_stops_it() -> None:
    fixed = repair(cluster("hopeless"))
    assert fixed.plan is not None and not fixed.plan.moves
    assert fixed.stuck == (
        (
            "1",
            "1 is on m, in maintenance; elsewhere: s: hard anti-affinity with 3; "
            "t: capacity: memory needs 6.0 GiB, free 5.0 GiB — no placement repairs it, even "
            "moving other guests",
        ),
    )


def test_a_guest_kept_in_place_by_the_policy_is_named_with_the_policy() -> None:
    fixed = repair(cluster("maintenance"), forbidden=frozenset({("1", "t"), ("1", "s")}))
    assert [g for g, _ in fixed.stuck] == ["1"]
    assert fixed.stuck[0][1] == (
        "1 is on m, in maintenance; elsewhere: t, s: kept off by the policy (cooldown, no "
        "return, minimum uptime, a failed move or a node that ran hot)"
    )


def test_a_node_the_policy_keeps_off_but_no_policy_could_open_names_its_own_reason() -> None:
    """A node in maintenance (offline, of another architecture) takes no guest whatever the
    policy allows: its own reason is named, not the cooldown an operator might lift."""
    both = Cluster(
        (
            Node("a", 4, 8 * GiB, maintenance=True),
            Node("b", 4, 8 * GiB, maintenance=True),
            Node("c", 4, 8 * GiB, online=False),
        ),
        (Guest("1", "a", memory=GiB, uptime=86400),),
    )
    fixed = repair(both, forbidden=frozenset({("1", "b"), ("1", "c")}))
    assert fixed.stuck == (
        ("1", "1 is on a, in maintenance; elsewhere: c: node offline; b: node in maintenance"),
    )


def test_a_guest_too_big_for_any_node_even_empty_says_the_capacity_not_the_policy() -> None:
    """The policy keeps the guest off b, but b could not hold it even empty: the shortfall is
    the reason (in GiB and cores, against the nodes' whole capacity), not a cooldown."""
    too_big = Cluster(
        (Node("a", 4, 8 * GiB, maintenance=True), Node("b", 4, 8 * GiB), Node("c", 4, 8 * GiB)),
        (Guest("1", "a", name="big", cpu=8, memory=12 * GiB, uptime=86400),),
    )
    fixed = repair(too_big, forbidden=frozenset({("1", "b")}))
    [(guest, text)] = fixed.stuck
    assert guest == "1"
    assert text.startswith(
        "big (1) is on a, in maintenance; elsewhere: b, c: capacity, even empty: memory needs "
        "12.0 GiB, has 8.0 GiB; cpu_used needs 8.0 cores, has 4.0 cores"
    )
    assert "policy" not in text


# --------------------------------------------------------------------------------------------
# The daemon's decisions


@pytest.mark.parametrize("strategy", ["balance", "optimal", "pve-topsis"])
def test_the_daemon_repairs_whatever_its_strategy(strategy: str) -> None:
    decision = _decide(cluster("maintenance"), PolicyConfig(strategy=strategy))
    assert decision.act and decision.kind == "repair"
    assert decision.plan is not None
    assert [(m.step, m.guest, m.target) for m in decision.plan.moves] == [
        (1, "2", "s"),
        (2, "1", "t"),
    ]
    assert decision.stuck == ()


def test_a_batch_takes_the_first_steps_of_an_exact_repair_and_the_rest_follows() -> None:
    maintenance = cluster("maintenance")
    first = _decide(maintenance, PolicyConfig(batch=1))
    assert first.plan is not None
    assert [(m.guest, m.target) for m in first.plan.moves] == [("2", "s")]
    assert first.stuck == ()  # the whole plan repairs it: nothing is stuck
    after = maintenance.with_placement({"2": "s"})
    second = _decide(after, PolicyConfig(batch=1))
    assert second.plan is not None
    assert [(m.guest, m.target) for m in second.plan.moves] == [("1", "t")]


def test_an_exact_repair_is_made_whole_or_not_at_all_within_max_moves() -> None:
    proposal = propose_balance(
        cluster("maintenance"), BalanceOptions(target_spread=1e6, max_moves=1)
    )
    assert proposal.moves == ()
    assert proposal.options["repair"]["needs"] == 2
    assert "could not repair: 1" in proposal.notes


def test_a_stuck_repair_is_named_by_the_decision(caplog: pytest.LogCaptureFixture) -> None:
    # decide is pure: it names the stuck guest; the daemon logs it at WARNING (see
    # tests/controller/test_why_not_daemon.py), plan and place print it.
    with caplog.at_level(logging.INFO, logger="opendrs"):
        decision = _decide(cluster("hopeless"), PolicyConfig())
    assert not decision.act
    assert [g for g, _ in decision.stuck] == ["1"]
    assert decision.stuck[0][1].startswith("1 is on m, in maintenance; elsewhere: ")
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert decision.as_dict()["stuck"] == [list(decision.stuck[0])]


# --------------------------------------------------------------------------------------------
# Bigger clusters: a bounded model


def _fragmented(nodes: int, big: int) -> Cluster:
    """Nodes of 64 GiB with seven 8 GiB guests each; ``big`` 16 GiB guests on m, in maintenance:
    each needs a node that first sheds one small guest."""
    names = [Node(f"n{i}", 32, 64 * GiB) for i in range(nodes)]
    guests = [
        Guest(f"g{i}-{k}", f"n{i}", cpu=1, memory=8 * GiB, uptime=86400)
        for i in range(nodes)
        for k in range(7)
    ]
    guests += [Guest(f"big{b}", "m", cpu=2, memory=16 * GiB, uptime=86400) for b in range(big)]
    m = Node("m", 32, 64 * GiB, maintenance=True)
    return Cluster((*names, m), tuple(guests), settings=Settings(mode="static"))


def test_a_big_cluster_is_repaired_by_a_bounded_model() -> None:
    fixed = repair(_fragmented(200, 5))
    assert fixed.proposal is not None and fixed.plan is not None
    info = fixed.proposal.options["repair"]
    assert info["exact"] == "OPTIMAL" and not info["complete"] and info["nodes"] < 50
    assert fixed.stuck == () and len(fixed.plan.moves) == 10
    moved = {m.guest for m in fixed.plan.moves}
    assert {f"big{b}" for b in range(5)} <= moved


def test_the_exact_model_sees_a_shortfall_without_searching() -> None:
    need = np.array([[2.0], [2.0]])
    room = np.array([[1.0], [2.0]])
    domain = [np.array([0, 1]), np.array([0, 1])]
    cost = [np.array([1, 1]), np.array([1, 1])]
    found = solve_repair(need, room, (VCPUS,), domain, cost, [])
    assert found.status == "INFEASIBLE" and found.choice is None and found.deterministic
    # With room, anti-affine units take different nodes, the cheaper way.
    room = np.array([[2.0], [2.0]])
    found = solve_repair(need, room, (VCPUS,), domain, [np.array([0, 5]), np.array([3, 1])], [])
    assert found.status == "OPTIMAL" and found.choice is not None
    assert found.choice.tolist() == [0, 1]
    roomy = np.array([[4.0], [4.0]])
    apart = solve_repair(
        need, roomy, (VCPUS,), domain, [np.array([0, 5]), np.array([0, 5])], [(0, 1)]
    )
    assert apart.choice is not None and sorted(apart.choice.tolist()) == [0, 1]
