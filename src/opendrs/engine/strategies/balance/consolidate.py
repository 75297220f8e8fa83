"""``balance``'s consolidation (:func:`consolidate`): two moves at one node undone, with at most
one move in their place.

The rounds reach a narrow band a move at a time, and many nodes end both receiving and sending:
a node sheds a big guest, overshoots, and takes a small one back from a neighbour, which then
takes another; a guest goes from ``a`` to ``b`` and one of about its size from ``b`` to ``a``.
Pruning undoes single moves, compaction pairs along a chain or in parallel with a stand-in from
the first source. This phase looks at every pair of moves that share a node (as source or as
target): both units back home, when every weighted resource stays within its goal and the
objective at most ``ceiling`` without either (two moves that cancel out); failing that, one unit
moved in their place — any unit of any of the pair's nodes, one of the two included, to another
of them or to one of the :data:`ROOMIEST` nodes farthest below or above the mean — adding fewer
migrations than the two (none for a unit that has moved already), within the goal, the ceiling
and every hard constraint (the allowed moves: capacity, rules, pins). Among the units that do,
the fewest migrations added, then the cheapest, then the lowest unit and node: the same input,
the same moves. Pairs are tried most expensive first, in passes until one saves nothing, within
a budget of tries per unit moved (and :data:`MAX_TRIES` in all, fewer in proportion beyond
:data:`FULL_BUDGET_NODES` nodes, which keeps it cheap at 1,000 nodes; each try screens the
stand-ins on the loads, vectorised over the targets).

The goal is the one compaction keeps (:func:`.compact.compact`): each weighted resource within its
goal and no wider than ``target_spread`` or than it already is.
"""

from __future__ import annotations

import numpy as np

from .compact import home_again, passes_within_goal
from .state import BalanceState
from .steps import History, Step, StepKind

#: Passes over the pairs at most (each replacement saves at least one migration).
CONSOLIDATE_PASSES = 8
#: Pairs of moves tried per pass at most (most expensive first), on big clusters.
CONSOLIDATE_PAIRS = 4_000
#: Pairs a consolidation tries at most, per unit moved when it begins, and in all — on up to
#: FULL_BUDGET_NODES usable nodes; beyond, fewer in proportion (a try costs about one pass
#: over the nodes, so the phase costs about the same at any size).
TRIES_PER_MOVE = 16
MAX_TRIES = 600
FULL_BUDGET_NODES = 64
#: Moved units whose pairs are looked at, most expensive first (on big plans the pairs of all
#: of them would be many more than the tries).
PAIR_UNITS = 400
#: Nodes farthest below the mean a stand-in may go to, beside the pair's own.
ROOMIEST = 16


def consolidate(history: History, ceiling: float, target_spread: float) -> int:
    """Undo pairs of moves at one node, with at most one move in their place, where that keeps
    the goal (see the module); how many migrations that saved. Only when every weighted resource
    is within its goal."""
    state = history.state
    nodes = max(1, int(state.usable.sum()))
    most = MAX_TRIES * min(nodes, FULL_BUDGET_NODES) // nodes
    left = [min(most, TRIES_PER_MOVE * int(state.moved().sum()))]
    return passes_within_goal(
        history, target_spread, CONSOLIDATE_PASSES, lambda: _one_pass(history, ceiling, left)
    )


def _pairs(state: BalanceState) -> list[tuple[int, int]]:
    """(u, v), u < v, for each pair of the :data:`PAIR_UNITS` most expensive moved units that
    share a node (where they started or where they are): most expensive pair first."""
    units = state.units
    moved = np.nonzero(state.moved() & ~state.broken_at_start & ~state.broken)[0]
    moved = moved[np.argsort(-units.cost[moved], kind="stable")][:PAIR_UNITS].tolist()
    touching: dict[int, list[int]] = {}
    for u in moved:
        for n in {int(state.origin[u]), int(units.assign[u])}:
            touching.setdefault(n, []).append(u)
    found: set[tuple[int, int]] = set()
    for members in touching.values():
        found.update((u, v) for i, u in enumerate(members) for v in members[i + 1 :])
    cost = units.cost
    out = sorted(found, key=lambda p: (-(cost[p[0]] + cost[p[1]]), p[0], p[1]))
    return out[:CONSOLIDATE_PAIRS]


def _one_pass(history: History, ceiling: float, left: list[int]) -> int:
    """One pass over the pairs while tries are left (``left[0]``, spent here); the migrations it
    saved. A pair with a unit an earlier replacement of the pass moved waits for the next."""
    state = history.state
    saved = 0
    changed: set[int] = set()
    for u, v in _pairs(state):
        if changed & {u, v} or not (state.is_moved(u) and state.is_moved(v)):
            continue
        if left[0] <= 0:
            break
        left[0] -= 1
        found = _replace(history, u, v, ceiling)
        if found is not None:
            w, fewer = found
            saved += fewer
            changed.update({u, v, w})
    return saved


def _replace(history: History, u: int, v: int, ceiling: float) -> tuple[int, int] | None:
    """Units ``u`` and ``v`` back home and at most one move in their place, if that keeps the
    goal (see the module); the unit moved (-1: none) and the migrations saved, or None (then
    nothing changed)."""
    state = history.state
    nodes = sorted(
        {int(state.origin[u]), int(state.units.assign[u])}
        | {int(state.origin[v]), int(state.units.assign[v])}
    )
    two = int(state.unit_guests[u] + state.unit_guests[v])
    undone = home_again(state, (u, v))
    if len(undone) == 2:
        if _within_goal(state) and state.objective() <= ceiling:
            _record_undone(history, undone)
            return -1, two
        found = _stand_in(state, nodes, two)
        if found is not None:
            w, t, added = found
            src = int(state.units.assign[w])
            state.move(w, t)
            # The stand-in's screen is a float estimate: the spreads are checked exactly.
            if _within_goal(state) and state.objective() <= ceiling:
                _record_undone(history, undone)
                state.move(w, src)
                history.record(w, t, StepKind.BALANCE)
                return w, two - added
            state.move(w, src)
    for x, where in reversed(undone):
        state.move(x, where)
    return None


def _within_goal(state: BalanceState) -> bool:
    """Whether every weighted resource's spread is within its goal, as ``state`` measures it."""
    weighted = state.weights > 0
    return bool(np.all(state.spreads()[weighted] <= state.goal[weighted]))


def _record_undone(history: History, undone: list[tuple[int, int]]) -> None:
    """Record the units of ``undone`` (unit, where it was) as moved back home (pruned)."""
    state = history.state
    objective = state.objective()
    for x, where in undone:
        history.add(Step(x, where, int(state.origin[x]), 0.0, objective, StepKind.PRUNED))


def _stand_in(
    state: BalanceState, nodes: list[int], fewer_than: int
) -> tuple[int, int, int] | None:
    """The move of a unit of one of ``nodes`` to another of them or to one of the nodes farthest
    from the mean (:meth:`_Extremes.targets`) that adds fewer than ``fewer_than`` migrations, is
    allowed and leaves every weighted resource within its goal: the fewest migrations added, then
    the cheapest, then the lowest unit, then the lowest node; (unit, target, migrations added),
    or None. ``nodes`` are in one architecture group: no other group's spread changes."""
    g = int(state.group[nodes[0]])
    if g < 0 or any(int(state.group[n]) != g for n in nodes):
        return None
    screen = _Extremes(state, g)
    targets = np.array(screen.targets(nodes), dtype=np.intp)
    best: tuple[int, float, int, int] | None = None
    for src in nodes:
        cand = state.units_at(src)
        cand = cand[screen.may_leave(state, cand, src)]
        if cand.size == 0:
            continue
        added = np.where(
            state.moved_of(cand)[:, None],
            np.where(
                (state.origin[cand][:, None] == targets[None, :])
                & ~state.broken_at_start[cand][:, None],
                -state.unit_guests[cand][:, None],
                0,
            ),
            state.unit_guests[cand][:, None],
        )  # (c, t) as state.added_migrations
        keep = (added < fewer_than) & (targets != src)[None, :]
        keep &= screen.within_goal(state, cand, src, targets)
        rows, cols = np.nonzero(keep)
        if rows.size == 0:
            continue
        ok = state.allowed(cand[np.unique(rows)], targets)
        ok_rows = np.searchsorted(np.unique(rows), rows)
        hit = ok[ok_rows, cols]
        rows, cols = rows[hit], cols[hit]
        if rows.size == 0:
            continue
        c, a, t = cand[rows], added[rows, cols], targets[cols]
        cost = np.where(state.moved_of(c), 0.0, state.units.cost[c])
        k = int(np.lexsort((t, c, cost, a))[0])
        key = (int(a[k]), float(cost[k]), int(c[k]), int(t[k]))
        if best is None or key < best:
            best = key
    if best is None:
        return None
    added, _, w, tgt = best
    return w, tgt, added


class _Extremes:
    """One architecture group's usable nodes at their loads now, for screening moves between two
    of them: per weighted resource the three highest and three lowest fractions (the extremes
    of the nodes a move leaves alone are among them), and the nodes farthest from the mean."""

    def __init__(self, state: BalanceState, group: int) -> None:
        self.weighted = np.nonzero(state.weights > 0)[0]
        members = np.nonzero(state.group == group)[0]
        f = state.kept_fractions()[members][:, self.weighted]
        order = np.argsort(f, axis=0, kind="stable")
        self.low_nodes, self.high_nodes = members[order[:3]], members[order[::-1][:3]]
        self.low = np.take_along_axis(f, order[:3], axis=0)
        self.high = np.take_along_axis(f, order[::-1][:3], axis=0)
        below = (f - state.kept_mean()[members][:, self.weighted]).sum(axis=1)
        by_room = members[np.argsort(below, kind="stable")]
        self.ends = {int(n) for n in np.r_[by_room[:ROOMIEST], by_room[::-1][:ROOMIEST]]}

    def targets(self, nodes: list[int]) -> list[int]:
        """Where a stand-in may go: the pair's ``nodes`` and the :data:`ROOMIEST` nodes farthest
        below the mean and above it (the weighted resources' deviations added up)."""
        return sorted(self.ends.union(nodes))

    def may_leave(self, state: BalanceState, cand: np.ndarray, src: int) -> np.ndarray:
        """(len(cand),) whether ``src`` without each unit of ``cand`` is within the goal of the
        second highest and second lowest of the other nodes (one of them may be the target, the
        other stays): what every stand-in from ``src`` needs, on the loads alone."""
        w = self.weighted
        f_src = (state.node_load[src, w] - state.units.demand[cand][:, w]) * state.inv_cap[src, w]
        high = _second(self.high, self.high_nodes, src, -np.inf)
        low = _second(self.low, self.low_nodes, src, np.inf)
        goal = state.goal[w]
        return np.all((f_src >= high - goal) & (f_src <= low + goal), axis=1)

    def within_goal(
        self, state: BalanceState, cand: np.ndarray, src: int, targets: np.ndarray
    ) -> np.ndarray:
        """(len(cand), len(targets)) whether moving each unit of ``cand`` from ``src`` to each
        target leaves the group's spread of every weighted resource within its goal."""
        w = self.weighted
        d = state.units.demand[cand][:, w]  # (c, W)
        f_src = ((state.node_load[src, w] - d) * state.inv_cap[src, w])[:, None, :]
        f_tgt = (state.node_load[targets][:, w][None] + d[:, None]) * state.inv_cap[targets][:, w]
        high = np.maximum(
            np.maximum(f_src, f_tgt), _other(self.high, self.high_nodes, src, targets, -np.inf)
        )
        low = np.minimum(
            np.minimum(f_src, f_tgt), _other(self.low, self.low_nodes, src, targets, np.inf)
        )
        return np.all(high - low <= state.goal[w], axis=2)


def _other(
    values: np.ndarray, nodes: np.ndarray, src: int, targets: np.ndarray, fill: float
) -> np.ndarray:
    """(len(targets), R) per target and column, the first of ``values`` (k, R) whose node is
    neither ``src`` nor the target: the extreme of the other nodes (``fill`` where the group has
    no other node)."""
    free = (nodes != src)[None, :, :] & (nodes[None, :, :] != targets[:, None, None])  # (t, k, R)
    first = np.argmax(free, axis=1)  # (t, R): the first free row, 0 where none is
    picked = np.take_along_axis(values[None].repeat(len(targets), axis=0), first[:, None], 1)
    some = free.any(axis=1)
    return np.where(some, picked[:, 0], fill)


def _second(values: np.ndarray, nodes: np.ndarray, src: int, fill: float) -> np.ndarray:
    """(R,) per column, the second of ``values`` (k, R) whose node is not ``src`` (``fill``
    where there is none)."""
    out = np.full(values.shape[1], fill)
    for r in range(values.shape[1]):
        others = values[nodes[:, r] != src, r]
        if others.size >= 2:
            out[r] = others[1]
    return out
