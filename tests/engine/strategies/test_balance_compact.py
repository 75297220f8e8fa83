"""balance's compaction (``strategies/balance/compact.py``): two moves one move can stand in for."""

from __future__ import annotations

import numpy as np

from opendrs.engine.constraints import Constraints
from opendrs.engine.strategies.balance.compact import compact
from opendrs.engine.strategies.balance.state import BalanceState
from opendrs.engine.strategies.balance.steps import History, StepKind
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3
MEMORY_ONLY = Settings(mode="static", weight_cpu=0.0, weight_memory=1.0, cpu_overcommit=8.0)
GOAL = 0.01


def _history(nodes: int, guests: list[tuple[str, str, int]], rules: Rules | None = None) -> History:
    """A search on ``nodes`` 64 GiB nodes n0, n1, …, with ``guests`` (id, node, GiB)."""
    cluster = Cluster(
        tuple(Node(f"n{k}", 16, 64 * GiB) for k in range(nodes)),
        tuple(Guest(g, n, memory=m * GiB) for g, n, m in guests),
        rules or Rules(),
        MEMORY_ONLY,
    )
    state = BalanceState(cluster, Constraints.build(cluster))
    state.goal = np.full(len(state.goal), GOAL + 1e-12)
    return History(state)


def _moves(history: History) -> dict[str, str]:
    """Each moved guest's node now."""
    state = history.state
    return {
        state.units.label[u]: state.cluster.nodes[int(state.units.assign[u])].name
        for u in np.nonzero(state.moved())[0].tolist()
    }


def _unit(history: History, guest: str) -> int:
    return history.state.units.label.index(guest)


def test_a_chain_of_two_moves_becomes_one_move_past_the_middle_node() -> None:
    # n0 40 GiB, n1 32, n2 24: 8 GiB must go from n0 to n2; the search passed it on via n1.
    history = _history(
        3, [("g", "n0", 8), ("a", "n0", 32), ("h", "n1", 8), ("b", "n1", 24), ("c", "n2", 24)]
    )
    ceiling = history.state.objective()
    history.record(_unit(history, "g"), 1, StepKind.BALANCE)
    history.record(_unit(history, "h"), 2, StepKind.BALANCE)
    assert compact(history, ceiling, GOAL) == 1
    assert _moves(history) == {"g": "n2"}
    assert history.state.spreads()[1] <= GOAL
    assert [s.kind for s in history.steps[2:]] == [StepKind.PRUNED] * 2 + [StepKind.BALANCE]


def test_two_small_moves_become_one_of_their_size() -> None:
    # n0 40 GiB, n1 24: 8 GiB must move; the search moved two guests of 4.
    history = _history(
        2, [("s1", "n0", 4), ("s2", "n0", 4), ("big", "n0", 8), ("f", "n0", 24), ("e", "n1", 24)]
    )
    ceiling = history.state.objective()
    history.record_all([(_unit(history, "s1"), 1), (_unit(history, "s2"), 1)], StepKind.BALANCE)
    assert compact(history, ceiling, GOAL) == 1
    assert _moves(history) == {"big": "n1"}


def test_no_stand_in_that_a_rule_forbids_and_no_change_then() -> None:
    apart = GuestAffinity("apart", ("big", "other"), positive=False)
    history = _history(
        2,
        [
            *[("s1", "n0", 4), ("s2", "n0", 4), ("big", "n0", 8), ("f", "n0", 24)],
            *[("other", "n1", 4), ("e", "n1", 20)],
        ],
        Rules(guest_affinity=(apart,)),
    )
    ceiling = history.state.objective()
    history.record_all([(_unit(history, "s1"), 1), (_unit(history, "s2"), 1)], StepKind.BALANCE)
    load = history.state.node_load.copy()
    assert compact(history, ceiling, GOAL) == 0
    assert _moves(history) == {"s1": "n1", "s2": "n1"}
    assert np.array_equal(history.state.node_load, load) and len(history) == 2


def test_nothing_is_compacted_while_a_spread_is_above_its_goal() -> None:
    history = _history(
        2, [("s1", "n0", 4), ("s2", "n0", 4), ("big", "n0", 8), ("f", "n0", 40), ("e", "n1", 24)]
    )
    ceiling = history.state.objective()
    history.record_all([(_unit(history, "s1"), 1), (_unit(history, "s2"), 1)], StepKind.BALANCE)
    assert compact(history, ceiling, GOAL) == 0 and len(history) == 2


def test_a_spread_widens_up_to_the_target_only_whatever_the_goal() -> None:
    # The only stand-in (9 GiB for two of 4) leaves 31 and 33 GiB: 3.1 pp, within a 5 pp goal
    # (as one step on the smallest node can be) but not within a 1 pp target.
    guests = [("s1", "n0", 4), ("s2", "n0", 4), ("big", "n0", 9), ("f", "n0", 23), ("e", "n1", 24)]
    for target, saved in ((GOAL, 0), (0.05, 1)):
        history = _history(2, guests)
        history.state.goal[:] = 0.05 + 1e-12
        ceiling = history.state.objective()
        history.record_all([(_unit(history, "s1"), 1), (_unit(history, "s2"), 1)], StepKind.BALANCE)
        assert compact(history, ceiling, target) == saved
        assert history.state.goal[1] == 0.05 + 1e-12
