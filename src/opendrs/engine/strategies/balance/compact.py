"""``balance``'s compaction (:func:`compact`): two moves that one move can stand in for, replaced.

The rounds reach the target a move at a time, and a node often passes load on: a guest goes from
``a`` to ``b`` and another from ``b`` to ``c`` (a *chain*), or two small guests go from ``a`` to
``b`` where one of twice the size would do. Pruning undoes single moves only; this phase undoes
such a pair — both guests back home — and makes one move in their place: a unit of ``a`` (one of
the two included) to ``c``, or to ``b``, with fewer guests than the two, chosen so that every
weighted resource stays within its goal, the objective stays at most ``ceiling``, and every hard
constraint holds. Among the units that do, the fewest guests, then the cheapest migration, then
the lowest index: the same input, the same moves. Pairs are tried most expensive first, in passes
until one makes no replacement.
"""

from __future__ import annotations

import numpy as np

from .state import BalanceState
from .steps import History, Step, StepKind

#: Passes over the moved pairs at most (each replacement saves at least one migration).
COMPACT_PASSES = 8
#: Pairs of moves tried per pass at most (most expensive first), on big clusters.
COMPACT_PAIRS = 4_000


def compact(history: History, ceiling: float) -> int:
    """Replace pairs of moves by one where that keeps the goal (see the module); how many
    migrations that saved. Only when every weighted resource is within its goal."""
    state = history.state
    weighted = state.weights > 0
    if not np.all(state.spreads()[weighted] <= state.goal[weighted]):
        return 0
    saved = 0
    for _ in range(COMPACT_PASSES):
        found = _one_pass(history, ceiling)
        if not found:
            break
        saved += found
    return saved


def _pairs(state: BalanceState) -> list[tuple[int, int, int, int]]:
    """(u, v, source, target) for each pair of moved units one move from ``source`` to
    ``target`` might stand in for: both from ``source`` to ``target``, or ``u`` to the node
    ``v`` leaves for ``target``; most expensive pair first."""
    units = state.units
    moved = np.nonzero(state.moved() & ~state.broken_at_start & ~state.broken)[0]
    moved = moved[np.argsort(-units.cost[moved], kind="stable")].tolist()
    origin, assign = state.origin, units.assign
    leaving: dict[int, list[int]] = {}
    for v in moved:
        leaving.setdefault(int(origin[v]), []).append(v)
    out: list[tuple[int, int, int, int]] = []
    for u in moved:
        a, b = int(origin[u]), int(assign[u])
        for v in leaving.get(b, []):
            if int(assign[v]) != a:
                out.append((u, v, a, int(assign[v])))
        for v in leaving.get(a, []):
            if v > u and int(assign[v]) == b:
                out.append((u, v, a, b))
    cost = units.cost
    out.sort(key=lambda p: (-(cost[p[0]] + cost[p[1]]), p[0], p[1]))
    return out[:COMPACT_PAIRS]


def _one_pass(history: History, ceiling: float) -> int:
    """One pass over the pairs; the migrations it saved. A pair whose moves or nodes an earlier
    replacement of the pass changed is left for the next pass."""
    state = history.state
    saved = 0
    units_changed: set[int] = set()
    nodes_changed: set[int] = set()
    for u, v, src, tgt in _pairs(state):
        b, c = int(state.units.assign[u]), int(state.units.assign[v])
        if units_changed & {u, v} or nodes_changed & {src, tgt, b, c}:
            continue
        before = int(state.unit_guests[u] + state.unit_guests[v])
        found = _replace(history, u, v, src, tgt, ceiling)
        if found is not None:
            w, added = found
            saved += before - added
            units_changed.update({u, v, w})
            nodes_changed.update({src, tgt, b, c})
    return saved


def _home_again(state: BalanceState, u: int) -> bool:
    """Whether unit ``u`` may go back where it started now."""
    origin = int(state.origin[u])
    here_ok = state.units.static_ok[u, origin] and state.cons.usable[origin]
    return bool(here_ok and state.allowed_one(u, origin))


def _replace(
    history: History, u: int, v: int, src: int, tgt: int, ceiling: float
) -> tuple[int, int] | None:
    """Units ``u`` and ``v`` back home and one unit of ``src`` to ``tgt`` in their place, if one
    keeps the goal (see the module); the unit moved and the migrations its move adds, or None
    (then nothing changed)."""
    state = history.state
    undone: list[tuple[int, int]] = []
    for x in (u, v):
        if not _home_again(state, x):
            break
        undone.append((x, int(state.units.assign[x])))
        state.move(x, int(state.origin[x]))
    fewer_than = int(state.unit_guests[u] + state.unit_guests[v])
    found = _stand_in(state, src, tgt, fewer_than) if len(undone) == 2 else None
    if found is not None:
        w, added = found
        state.move(w, tgt)
        if state.objective() <= ceiling:
            objective = state.objective()
            for x, where in undone:
                history.add(Step(x, where, int(state.origin[x]), 0.0, objective, StepKind.PRUNED))
            state.move(w, src)
            history.record(w, tgt, StepKind.BALANCE)
            return w, added
        state.move(w, src)
    for x, where in reversed(undone):
        state.move(x, where)
    return None


def _stand_in(state: BalanceState, src: int, tgt: int, fewer_than: int) -> tuple[int, int] | None:
    """The unit of ``src`` whose move to ``tgt`` adds fewer than ``fewer_than`` migrations (a
    unit that has moved already adds none), is allowed, and leaves every weighted resource within
    its goal: the fewest migrations added, then the cheapest, then the lowest index; with the
    migrations it adds. None if there is none."""
    if state.group[src] != state.group[tgt] or state.group[src] < 0:
        return None
    cand = state.units_on(np.array([src], dtype=np.intp))
    added = np.where(state.moved_of(cand), 0, state.unit_guests[cand])
    keep = added < fewer_than
    cand, added = cand[keep], added[keep]
    if cand.size:
        keep = _within_goal(state, cand, src, tgt)
        cand, added = cand[keep], added[keep]
    if cand.size:
        keep = state.allowed(cand, np.array([tgt], dtype=np.intp))[:, 0]
        cand, added = cand[keep], added[keep]
    if cand.size == 0:
        return None
    k = int(np.lexsort((cand, state.units.cost[cand], added))[0])
    return int(cand[k]), int(added[k])


def _within_goal(state: BalanceState, cand: np.ndarray, src: int, tgt: int) -> np.ndarray:
    """(len(cand),) whether moving each unit of ``cand`` from ``src`` to ``tgt`` leaves every
    weighted resource's spread within its goal (``src`` and ``tgt`` in one architecture group)."""
    f = state.kept_fractions()
    weighted = np.nonzero(state.weights > 0)[0]
    group = state.group
    same = np.nonzero(group == group[src])[0]
    others = same[(same != src) & (same != tgt)]
    d = state.units.demand[cand][:, weighted]
    cap = state.cap[:, weighted]
    inv = np.where(cap > 0, 1.0 / np.where(cap > 0, cap, 1.0), 0.0)
    f_src = (state.node_load[src, weighted] - d) * inv[src]
    f_tgt = (state.node_load[tgt, weighted] + d) * inv[tgt]
    high = np.maximum(f_src, f_tgt)
    low = np.minimum(f_src, f_tgt)
    if others.size:
        high = np.maximum(high, f[others][:, weighted].max(axis=0))
        low = np.minimum(low, f[others][:, weighted].min(axis=0))
    rest = np.zeros(len(weighted))
    for g in range(int(group.max(initial=-1)) + 1):
        members = np.nonzero(group == g)[0]
        if g != group[src] and members.size >= 2:
            fg = f[members][:, weighted]
            rest = np.maximum(rest, fg.max(axis=0) - fg.min(axis=0))
    spread = np.maximum(high - low, rest)
    return np.all(spread <= state.goal[weighted], axis=1)
