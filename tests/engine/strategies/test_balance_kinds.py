"""The exchanges' kinds (:meth:`BalanceState.pair_kinds`): units kept apart from others share
the kind of units alike, and the exchange found (:meth:`BalanceState.best_swap`) is the one
found with each of them a kind of its own (:meth:`BalanceState.unit_kinds`), on random loads,
hard anti-affinity rules and placements."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.engine.constraints import Constraints
from opendrs.engine.strategies.balance.state import BalanceState
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3
NODES = ("a", "b", "c", "d")
GUESTS = [f"g{k}" for k in range(12)]


def _state(
    apart: list[list[str]], where: list[str], sizes: list[int], together: bool
) -> BalanceState:
    rules = Rules(
        guest_affinity=tuple(
            GuestAffinity(f"r{k}", tuple(guests), False, True) for k, guests in enumerate(apart)
        )
        + ((GuestAffinity("t", ("g0", "g1"), True, True),) if together else ())
    )
    nodes = tuple(Node(n, 16, 64 * GiB) for n in NODES)
    guests = tuple(
        Guest(g, n, cpu=size, memory=size * GiB)
        for g, n, size in zip(GUESTS, where, sizes, strict=True)
    )
    cluster = Cluster(nodes, guests, rules, Settings(mode="static"))
    return BalanceState(cluster, Constraints.build(cluster))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(GUESTS), min_size=2, max_size=4, unique=True),
        min_size=1,
        max_size=4,
    ),
    st.lists(st.sampled_from(NODES), min_size=len(GUESTS), max_size=len(GUESTS)),
    st.lists(st.sampled_from([1, 2, 4]), min_size=len(GUESTS), max_size=len(GUESTS)),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 11), st.sampled_from(NODES)), max_size=3),
)
def test_exchanges_on_shared_kinds_are_those_on_a_kind_per_unit_kept_apart(
    apart: list[list[str]],
    where: list[str],
    sizes: list[int],
    together: bool,
    moves: list[tuple[int, str]],
) -> None:
    shared = _state(apart, where, sizes, together)
    alone = _state(apart, where, sizes, together)
    alone.pair_kinds = alone.unit_kinds  # type: ignore[method-assign]
    assert shared.pair_kinds()[1] <= shared.unit_kinds()[1]
    for state in (shared, alone):
        for u, node in moves:
            if u < len(state.units.members) and state.units.movable[u]:
                state.move(u, state.cluster.node_index[node])
    everywhere = np.arange(len(NODES))
    for a in range(len(NODES)):
        assert shared.best_swap(a, everywhere) == alone.best_swap(a, everywhere)


def test_units_kept_apart_share_a_kind_in_the_exchanges_only() -> None:
    state = _state([["g0", "g1"], ["g2", "g3"]], ["a"] * 6 + ["b"] * 6, [2] * 12, False)
    kind, _ = state.unit_kinds()
    pair, _ = state.pair_kinds()
    apart = state.units.unit_of[np.arange(4)]
    assert len(set(kind[apart].tolist())) == 4  # each its own for the moves (picks)
    assert len(set(pair[apart].tolist())) == 1  # one with the others alike for the exchanges
    assert pair[apart[0]] == pair[state.units.unit_of[5]]


def _every_pair(state: BalanceState, a: int, nodes: list[int]) -> tuple | None:
    """The best exchange of node ``a`` with ``nodes`` found unit pair by unit pair: every pair
    of units scored, the allowed one of the best score, the lower units first among equals."""
    others = [n for n in nodes if n != a and state.usable[n]]
    if not state.usable[a] or not others:
        return None
    xs = state.units_at(a)
    os = np.concatenate([state.units_at(n) for n in others])
    if xs.size == 0 or os.size == 0:
        return None
    gain = state._swap_gains(a, xs, os).T  # a row per unit on a
    rows, cols = np.nonzero(gain > 0)
    score = state._swap_scores(a, xs, os, (rows, cols, gain[rows, cols]))
    allowed = state.swap_check(a, xs, os)(rows, cols)
    ranked = sorted(
        (-s, int(xs[r]), int(os[c]), float(gain[r, c]))
        for s, r, c, ok in zip(score.tolist(), rows, cols, allowed.tolist(), strict=True)
        if ok
    )
    if not ranked:
        return None
    minus, x, o, g = ranked[0]
    return -minus, g, x, o


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(GUESTS[3:]), min_size=2, max_size=4, unique=True), max_size=3
    ),
    st.lists(st.sampled_from(NODES), min_size=len(GUESTS), max_size=len(GUESTS)),
    st.lists(st.sampled_from([1, 2, 4, 8, 12]), min_size=len(GUESTS), max_size=len(GUESTS)),
    st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=3)),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.tuples(st.integers(0, 11), st.sampled_from(NODES)), max_size=4),
)
def test_the_exchange_found_by_kinds_is_the_best_of_every_unit_pair(
    apart: list[list[str]],
    where: list[str],
    sizes: list[int],
    asked: list[tuple[int, list[int]]],
    moves: list[tuple[int, str]],
) -> None:
    """Asked again and again between moves (the kept parts of the tables reused), the exchange
    found is the one every pair of units gives, with hard rules and node limits in the way."""
    state = _state(apart, where, sizes, together=True)
    for step, (a, partners) in enumerate(asked):
        nodes = sorted(set(partners))
        found = state.best_swap(a, np.array(nodes))
        assert found == _every_pair(state, a, nodes)
        if step < len(moves):
            u, node = moves[step]
            if u < len(state.units.members) and state.units.movable[u] and not state.broken[u]:
                state.move(u, state.cluster.node_index[node])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(NODES), min_size=len(GUESTS), max_size=len(GUESTS)),
    st.lists(st.sampled_from([1, 2, 4, 8, 12]), min_size=len(GUESTS), max_size=len(GUESTS)),
    st.lists(st.tuples(st.integers(0, 11), st.sampled_from(NODES)), max_size=3),
    st.sampled_from([0.0, 0.5, 0.999, 1.0, 2.0]),
)
def test_an_exchange_asked_above_a_score_is_the_best_one_if_it_scores_above(
    where: list[str], sizes: list[int], moves: list[tuple[int, str]], share: float
) -> None:
    """Asked for an exchange scoring above a floor (some share of the best exchange's score),
    the search finds the best exchange when it scores above the floor, else none."""
    state = _state([["g3", "g4"]], where, sizes, together=True)
    for u, node in moves:
        if u < len(state.units.members) and state.units.movable[u] and not state.broken[u]:
            state.move(u, state.cluster.node_index[node])
    everywhere = np.arange(len(NODES))
    for a in range(len(NODES)):
        best = state.best_swap(a, everywhere)
        floor = best[0] * share if best is not None else share
        expected = best if best is not None and best[0] > floor else None
        assert state.best_swap(a, everywhere, floor) == expected
