"""``balance``'s last pass (:func:`cheaper_twins`): a moved guest whose place a cheaper guest that
balances alike could take, on the same source node, gives it that place.

The search chooses moves by their effect on the balance; two guests with the same balance load
on one node have the same effect wherever they go, and the search may take either — a guest with
a local disk to copy (its migration cost four times the disk on top of its memory) as readily as
one without. This pass exchanges them afterwards: for each moved guest ``u``, most expensive
first, the cheapest *twin* ``v`` — a guest on ``u``'s source node that has not moved, with the
same balance load (every resource, exactly), a lower migration cost, in no rule (a guest bound by
one can make later repairs harder) and free to move — goes to ``u``'s target in its place, and
``u`` stays home. Every node's load is the same after as before, so the spreads and the number of
moves are too; the migration cost falls. The exchange is made only where it keeps every hard
constraint: ``v`` allowed on the target, ``u`` allowed at home (no hard anti-affinity partner
there now), both nodes within capacity with the two exchanged. Passes repeat until none
exchanges (each lowers the cost: they end). In the history, ``v`` takes over ``u``'s steps (and
``u`` those of ``v``, which left it where it started), so the proposal gives ``v``'s move ``u``'s
reason and place in the order.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .state import BalanceState
from .steps import History


def cheaper_twins(history: History) -> int:
    """Exchange each moved single-guest unit for its cheapest twin left at home (see the module);
    the number of exchanges made."""
    state = history.state
    free = _twin_candidates(state)
    pool = _pool(state, free)
    steps_of = _StepOwners()
    made = 0
    while True:
        found = _one_pass(state, steps_of, free, pool)
        made += found
        if not found:
            steps_of.hand_over(history)
            return made


class _StepOwners:
    """Whose steps each unit takes over as the exchanges are made, handed to the history once at
    the end (the same steps as relabelling it at each exchange, without walking it each time)."""

    def __init__(self) -> None:
        #: unit -> the unit whose recorded steps are now its own.
        self.holds: dict[int, int] = {}

    def exchange(self, u: int, v: int) -> None:
        """``u`` and ``v`` take each other's steps."""
        holds = self.holds
        holds[u], holds[v] = holds.get(v, v), holds.get(u, u)

    def hand_over(self, history: History) -> None:
        """Give each step of the history to the unit that holds it now."""
        now_of = {was: unit for unit, was in self.holds.items() if was != unit}
        if now_of:
            history.steps = [
                replace(step, unit=now_of[step.unit]) if step.unit in now_of else step
                for step in history.steps
            ]


def _twin_candidates(state: BalanceState) -> np.ndarray:
    """(U,) units that may stand in for another: one guest, free to move, in no rule."""
    units = state.units
    alone = np.array([m.size == 1 for m in units.members], dtype=bool)
    return alone & units.movable & ~units.ruled & ~state.broken_at_start & ~state.has_neg


def _pool(state: BalanceState, free: np.ndarray) -> dict[tuple[int, bytes], list[int]]:
    """The units of ``free`` at home, by (node, balance load), cheapest first."""
    units = state.units
    pool: dict[tuple[int, bytes], list[int]] = {}
    home = np.flatnonzero(free & ~state.moved())
    for v in sorted(home.tolist(), key=lambda v: (units.cost[v], units.label[v])):
        pool.setdefault(_key(state, v, int(units.assign[v])), []).append(v)
    return pool


def _key(state: BalanceState, u: int, node: int) -> tuple[int, bytes]:
    return node, np.ascontiguousarray(state.units.demand[u]).tobytes()


def _one_pass(
    state: BalanceState,
    steps_of: _StepOwners,
    free: np.ndarray,
    pool: dict[tuple[int, bytes], list[int]],
) -> int:
    """One pass over the moved units, most expensive first: the exchanges it made."""
    units = state.units
    moved = np.flatnonzero(state.moved() & ~state.broken_at_start)
    made = 0
    for u in sorted(moved.tolist(), key=lambda u: (-units.cost[u], units.label[u])):
        if units.members[u].size != 1:
            continue
        home = int(state.origin[u])
        twins = pool.get(_key(state, u, home), [])
        for k, v in enumerate(twins):
            if units.cost[v] >= units.cost[u]:
                break
            if _may_exchange(state, u, v):
                _exchange(state, u, v)
                steps_of.exchange(u, v)
                del twins[k]
                if free[u]:
                    _insert(state, twins, u)
                made += 1
                break
    return made


def _may_exchange(state: BalanceState, u: int, v: int) -> bool:
    """Whether ``v`` (at ``u``'s home) may go to ``u``'s node, ``u`` staying home, within every
    hard constraint."""
    units = state.units
    home, target = int(state.origin[u]), int(units.assign[u])
    if not (units.static_ok[u, home] and state.cons.usable[home] and state.usable[home]):
        return False
    if not (units.static_ok[v, target] and state.usable[target]):
        return False
    if state.has_neg[u] and state.blocked_by_partners(np.array([u]), np.array([home])).any():
        return False
    shift = units.need[u] - units.need[v]
    room = state.limit + state.tol
    return bool(
        np.all(state.committed[home] + shift <= room[home])
        and np.all(state.committed[target] - shift <= room[target])
    )


def _exchange(state: BalanceState, u: int, v: int) -> None:
    """``u`` home, ``v`` to ``u``'s node (in the history each takes the other's steps:
    :class:`_StepOwners`)."""
    home, target = int(state.origin[u]), int(state.units.assign[u])
    state.move(u, home)
    state.move(v, target)


def _insert(state: BalanceState, twins: list[int], u: int) -> None:
    """Put ``u``, home again, among the ``twins`` at its node, cheapest first."""
    units = state.units
    order = (units.cost[u], units.label[u])
    at = next(
        (k for k, v in enumerate(twins) if (units.cost[v], units.label[v]) > order), len(twins)
    )
    twins.insert(at, u)
