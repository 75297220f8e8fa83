"""The balance repair's rule breakers (:meth:`BalanceState.violating_units`) are found for all
units at once: on random rules, placements and moves they are those a check of one unit after the
other finds — the same units, in the same order."""

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
GUESTS = [f"g{k}" for k in range(10)]


def one_by_one(state: BalanceState) -> list[int]:
    """The units breaking a hard constraint, each unit's partners checked on their own."""
    units = state.units
    assign = units.assign
    here_ok = units.static_ok[np.arange(len(assign)), assign]
    out = np.nonzero((~here_ok | ~state.cons.usable[assign]) & units.movable)[0].tolist()
    for u in np.nonzero(units.movable & state.has_neg)[0].tolist():
        partners = units.neg_guests[u]
        clash = units.unit_of[partners[np.isin(state.where[partners], state.occupied(u))]]
        if any(units.label[u] > units.label[c] or not units.movable[c] for c in clash.tolist()):
            out.append(u)
    out.extend(np.nonzero((units.movable | units.anchored) & state.broken)[0].tolist())
    return list(dict.fromkeys(out))


rule_specs = st.lists(
    st.tuples(
        st.lists(st.sampled_from(GUESTS), min_size=2, max_size=4, unique=True),
        st.booleans(),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(
    rule_specs,
    st.lists(st.sampled_from(NODES), min_size=len(GUESTS), max_size=len(GUESTS)),
    st.sets(st.sampled_from(GUESTS), max_size=3),
    st.lists(st.tuples(st.integers(0, 20), st.sampled_from(NODES)), max_size=6),
)
def test_the_breakers_found_at_once_are_those_found_one_by_one(
    specs: list[tuple[list[str], bool]],
    where: list[str],
    ignored: set[str],
    moves: list[tuple[int, str]],
) -> None:
    rules = Rules(
        guest_affinity=tuple(
            GuestAffinity(f"r{k}", tuple(guests), positive, True)
            for k, (guests, positive) in enumerate(specs)
        ),
        ignored=frozenset(ignored),
    )
    nodes = tuple(Node(n, 64, 64 * GiB) for n in NODES)
    guests = tuple(Guest(g, n, memory=GiB) for g, n in zip(GUESTS, where, strict=True))
    cluster = Cluster(nodes, guests, rules, Settings(mode="static"))
    state = BalanceState(cluster, Constraints.build(cluster))
    assert state.violating_units() == one_by_one(state)
    for u, node in moves:
        if u < len(state.units.members) and state.units.movable[u]:
            state.move(u, cluster.node_index[node])
            assert state.violating_units() == one_by_one(state)
