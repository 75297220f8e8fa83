"""balance's consolidation (``strategies/balance/consolidate.py``): two moves at one node undone,
with at most one move in their place."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tests.engine.strategies.test_balance_compact import GOAL, _history, _moves, _unit

from opendrs.engine.strategies.balance.compact import compact
from opendrs.engine.strategies.balance.consolidate import consolidate
from opendrs.engine.strategies.balance.steps import History, StepKind
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules


def test_a_swap_of_guests_of_one_size_is_undone() -> None:
    # n0 and n1 balanced; the search swapped two 8 GiB guests on the way: neither is needed,
    # and compaction (chains and parallel pairs) leaves a swap alone.
    guests = [("a", "n0", 8), ("f", "n0", 24), ("b", "n1", 8), ("e", "n1", 24)]
    for phase, saved in ((compact, 0), (consolidate, 2)):
        history = _history(2, guests)
        ceiling = history.state.objective()
        history.record_all([(_unit(history, "a"), 1), (_unit(history, "b"), 0)], StepKind.SWAP)
        assert phase(history, ceiling, GOAL) == saved
    assert _moves(history) == {}
    assert [s.kind for s in history.steps[2:]] == [StepKind.PRUNED] * 2


def test_a_big_guest_out_and_a_small_one_back_become_one_move_of_the_difference() -> None:
    # n0 36 GiB, n1 28: 4 GiB must go from n0 to n1; the search sent 8 over and took 4 back.
    guests = [("big", "n0", 8), ("half", "n0", 4), ("f", "n0", 24), ("back", "n1", 4)]
    guests.append(("e", "n1", 24))
    history = _history(2, guests)
    ceiling = history.state.objective()
    history.record_all([(_unit(history, "big"), 1), (_unit(history, "back"), 0)], StepKind.SWAP)
    assert consolidate(history, ceiling, GOAL) == 1
    assert _moves(history) == {"half": "n1"} and history.state.spreads()[1] <= GOAL
    assert [s.kind for s in history.steps[2:]] == [StepKind.PRUNED] * 2 + [StepKind.BALANCE]


def test_no_stand_in_that_a_rule_forbids_and_no_change_then() -> None:
    apart = GuestAffinity("apart", ("half", "other"), positive=False)
    guests = [("big", "n0", 8), ("half", "n0", 4), ("f", "n0", 24), ("back", "n1", 4)]
    guests += [("other", "n1", 1), ("e", "n1", 23)]
    history = _history(2, guests, Rules(guest_affinity=(apart,)))
    ceiling = history.state.objective()
    history.record(_unit(history, "big"), 1, StepKind.BALANCE)
    history.record(_unit(history, "back"), 0, StepKind.BALANCE)
    load = history.state.node_load.copy()
    assert consolidate(history, ceiling, GOAL) == 0
    assert _moves(history) == {"big": "n1", "back": "n0"}
    assert np.array_equal(history.state.node_load, load) and len(history) == 2


def test_nothing_is_consolidated_while_a_spread_is_above_its_goal() -> None:
    guests = [("a", "n0", 8), ("f", "n0", 40), ("b", "n1", 8), ("e", "n1", 24)]
    history = _history(2, guests)
    ceiling = history.state.objective()
    history.record_all([(_unit(history, "a"), 1), (_unit(history, "b"), 0)], StepKind.SWAP)
    assert consolidate(history, ceiling, GOAL) == 0 and len(history) == 2


@st.composite
def _searches(draw: st.DrawFn) -> tuple[History, float]:
    """A small cluster with rules and pins, and a random history of allowed moves on it, with the
    objective before them (as the search's ceiling)."""
    nodes = draw(st.integers(2, 4))
    sizes = draw(st.lists(st.integers(1, 24), min_size=nodes, max_size=14))
    homes = draw(st.lists(st.integers(0, nodes - 1), min_size=len(sizes), max_size=len(sizes)))
    guests = [(f"g{k}", f"n{h}", m) for k, (h, m) in enumerate(zip(homes, sizes, strict=True))]
    apart = [k for k in range(len(guests) - 1) if homes[k] != homes[k + 1]][:1]
    rules = Rules(
        node_affinity=(NodeAffinity("pin", ("g0",), {guests[0][1]: 1}, strict=True),),
        guest_affinity=tuple(
            GuestAffinity(f"apart{k}", (f"g{k}", f"g{k + 1}"), positive=False) for k in apart
        ),
    )
    history = _history(nodes, guests, rules)
    state = history.state
    ceiling = state.objective()
    for u, t in draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, nodes - 1)))):
        u %= len(state.units.label)
        if state.allowed_one(u, t) and int(state.units.assign[u]) != t:
            history.record(u, t, StepKind.BALANCE)
    return history, ceiling


@settings(max_examples=150, deadline=None)
@given(_searches(), st.sampled_from([0.01, 0.05, 0.2, 0.6]))
def test_consolidation_keeps_every_guard(search: tuple[History, float], goal: float) -> None:
    history, ceiling = search
    state = history.state
    state.goal = np.full(len(state.goal), goal + 1e-12)
    before_spread = state.spreads()
    before_moves = int(state.moved().sum())
    before_objective = state.objective()
    # A start over capacity is the repair's to mend, not this phase's.
    assume(state.cons.violations(state.where.copy()) == [])
    saved = consolidate(history, max(ceiling, before_objective), goal)
    assert saved >= 0 and int(state.moved().sum()) <= before_moves - (saved > 0)
    assert state.cons.violations(state.where.copy()) == []
    within = before_spread[1] <= goal + 1e-12
    if within:
        # Within the goal, and no wider than the target or than it was.
        assert state.spreads()[1] <= max(before_spread[1], goal) + 1e-9
        assert state.objective() <= max(ceiling, before_objective) + 1e-12
    else:
        assert saved == 0 and int(state.moved().sum()) == before_moves
