"""``balance``'s compaction (:func:`compact`): two moves that one move can stand in for, replaced.

The rounds reach the target a move at a time, and a node often passes load on: a guest goes from
``a`` to ``b`` and another from ``b`` to ``c`` (a *chain*), or two small guests go from ``a`` to
``b`` where one of twice the size would do. Pruning undoes single moves only; this phase undoes
such a pair — both guests back home — and makes one move in their place: a unit of ``a`` (one of
the two included) to ``c``, or to ``b``, adding fewer migrations than the two (a unit that has
moved already adds none), chosen so that every weighted resource stays within its goal, the
objective stays at most ``ceiling``, and every hard constraint holds. Among the units that do,
the fewest migrations added, then the cheapest, then the lowest index: the same input, the same
moves. Pairs are tried most expensive first, in passes until one makes no replacement, each
screened on the loads before anything moves, within a budget of tries per unit moved; a pair tried
in vain is not tried again while its nodes' loads stay the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .state import BalanceState
from .steps import History, Step, StepKind

#: Passes over the moved pairs at most (each replacement saves at least one migration).
COMPACT_PASSES = 8
#: Pairs of moves tried per pass at most (most expensive first), on big clusters.
COMPACT_PAIRS = 4_000
#: Replacements a search tries at most, per unit moved when its first compaction begins.
TRIES_PER_MOVE = 8


@dataclass
class CompactMemo:
    """What a compaction keeps from pass to pass: the pairs (u, v, source, target) tried in
    vain, with their nodes' loads then (not tried again while those are the same), and the tries
    left (:data:`TRIES_PER_MOVE` per unit moved when it began)."""

    left: int
    tried: dict[tuple[int, int, int, int], bytes] = field(default_factory=dict)


def compact(history: History, ceiling: float, target_spread: float) -> int:
    """Replace pairs of moves by one where that keeps the goal (see the module); how many
    migrations that saved. Only when every weighted resource is within its goal; a spread may
    widen up to its goal, and no further than ``target_spread`` or where it is now (a resource
    whose goal is one step on the smallest node keeps the spread the search reached)."""
    memo = CompactMemo(TRIES_PER_MOVE * int(history.state.moved().sum()))
    return passes_within_goal(
        history, target_spread, COMPACT_PASSES, lambda: _one_pass(history, ceiling, memo)
    )


def passes_within_goal(
    history: History, target_spread: float, passes: int, one_pass: Callable[[], int]
) -> int:
    """``one_pass`` (the migrations it saved) at most ``passes`` times, until it saves none,
    with each resource's goal narrowed to no wider than ``target_spread`` or than its spread
    now; the migrations saved. None when a weighted resource is above its goal."""
    state = history.state
    weighted = state.weights > 0
    spreads, goal = state.spreads(), state.goal
    if not np.all(spreads[weighted] <= goal[weighted]):
        return 0
    saved = 0
    state.goal = np.minimum(goal, np.maximum(spreads, target_spread + 1e-12))
    try:
        for _ in range(passes):
            found = one_pass()
            if not found:
                break
            saved += found
    finally:
        state.goal = goal
    return saved


def _pairs(state: BalanceState) -> list[tuple[int, int, int, int]]:
    """(u, v, source, target) for each pair of moved units one move from ``source`` to
    ``target`` might stand in for: both from ``source`` to ``target``, or ``u`` to the node
    ``v`` leaves for ``target``; most expensive pair first (then by u, then by v)."""
    units = state.units
    moved = np.nonzero(state.moved() & ~state.broken_at_start & ~state.broken)[0]
    origin, assign = state.origin[moved], units.assign[moved]
    # The moved units by the node they left: those leaving node n are by_origin[lo[n]:hi[n]].
    by_origin = np.argsort(origin, kind="stable")
    left = origin[by_origin]
    # u to the node v leaves (for another node than u's), or both from one node to one.
    u, v = _leaving(by_origin, left, assign)
    onward = assign[v] != origin[u]
    u1, v1 = u[onward], v[onward]
    u, v = _leaving(by_origin, left, origin)
    alongside = (moved[v] > moved[u]) & (assign[v] == assign[u])
    u2, v2 = u[alongside], v[alongside]
    first = np.concatenate([u1, u2])
    second = np.concatenate([v1, v2])
    target = np.concatenate([assign[v1], assign[u2]])
    cost = units.cost
    ui, vi = moved[first], moved[second]
    order = np.lexsort((vi, ui, -(cost[ui] + cost[vi])))[:COMPACT_PAIRS]
    return list(
        zip(
            ui[order].tolist(),
            vi[order].tolist(),
            origin[first[order]].tolist(),
            target[order].tolist(),
            strict=True,
        )
    )


def _leaving(
    by_origin: np.ndarray, left: np.ndarray, node: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i, j) of moved units (positions) where j left the node ``node[i]``
    (``by_origin``: the positions by the node each left, ``left``: those nodes, sorted)."""
    lo = np.searchsorted(left, node, side="left")
    hi = np.searchsorted(left, node, side="right")
    count = hi - lo
    i = np.repeat(np.arange(node.size), count)
    start = np.repeat(lo - (np.cumsum(count) - count), count)
    return i, by_origin[start + np.arange(i.size)]


def _one_pass(history: History, ceiling: float, memo: CompactMemo) -> int:
    """One pass over the pairs, within the tries left; the migrations it saved. A pair with a
    unit an earlier replacement of the pass moved is left for the next pass; one tried in vain
    before is tried again only once the loads of its nodes have changed since (a pair that would
    do only because other nodes changed is missed: fewer tries, the same answer for the same
    input)."""
    state = history.state
    saved = 0
    units_changed: set[int] = set()
    for u, v, src, tgt in _pairs(state):
        if units_changed & {u, v}:
            continue
        b, c = int(state.units.assign[u]), int(state.units.assign[v])
        nodes = np.array([src, tgt, b, c], dtype=np.intp)
        if memo.tried.get((u, v, src, tgt)) == state.node_load[nodes].tobytes():
            continue
        if not memo.left:
            break
        memo.left -= 1
        before = int(state.unit_guests[u] + state.unit_guests[v])
        found = _replace(history, u, v, src, tgt, ceiling)
        if found is None:
            memo.tried[u, v, src, tgt] = state.node_load[nodes].tobytes()
            continue
        w, added = found
        saved += before - added
        units_changed.update({u, v, w})
    return saved


def home_again(state: BalanceState, units: tuple[int, ...]) -> list[tuple[int, int]]:
    """``units`` moved back where they started, in order, as long as each may go (see
    :func:`_home_again`); (unit, where it was) for each one moved."""
    undone: list[tuple[int, int]] = []
    for x in units:
        if not _home_again(state, x):
            break
        undone.append((x, int(state.units.assign[x])))
        state.move(x, int(state.origin[x]))
    return undone


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
    fewer_than = int(state.unit_guests[u] + state.unit_guests[v])
    if not _may_stand_in(state, u, v, src, tgt, fewer_than):
        return None
    undone = home_again(state, (u, v))
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


def _may_stand_in(state: BalanceState, u: int, v: int, src: int, tgt: int, fewer_than: int) -> bool:
    """Whether some unit of ``src`` adding fewer than ``fewer_than`` migrations (see
    :func:`_stand_in`) would keep every weighted resource within its goal from ``src`` to
    ``tgt`` with ``u`` and ``v`` back home: a screen on the loads alone, before anything moves
    (rules and capacity are checked after)."""
    if state.group[src] != state.group[tgt] or state.group[src] < 0:
        return False
    loads: dict[int, np.ndarray] = {}
    for x in (u, v):
        d = state.units.demand[x]
        for n, sign in ((int(state.units.assign[x]), -1.0), (int(state.origin[x]), 1.0)):
            loads[n] = loads.get(n, state.node_load[n]) + sign * d
    for n in (src, tgt):
        loads.setdefault(n, state.node_load[n])
    home = np.array([x for x in (u, v) if int(state.origin[x]) == src], dtype=np.intp)
    cand = state.units_at(src)
    added = np.r_[state.added_migrations(cand, np.full(cand.size, tgt)), state.unit_guests[home]]
    cand = np.concatenate([cand, home])[added < fewer_than]
    return bool(cand.size and _within_goal(state, cand, src, tgt, loads).any())


def _stand_in(state: BalanceState, src: int, tgt: int, fewer_than: int) -> tuple[int, int] | None:
    """The unit of ``src`` whose move to ``tgt`` adds fewer than ``fewer_than`` migrations (its
    guests; none for a unit that has moved already, fewer for one going back home), is allowed
    and leaves every weighted resource within its goal: the fewest migrations added, then the
    cheapest, then the lowest index; with the migrations it adds. None if there is none."""
    cand = state.units_at(src)
    added = state.added_migrations(cand, np.full(cand.size, tgt))
    keep = added < fewer_than
    if keep.any():
        loads = {n: state.node_load[n] for n in (src, tgt)}
        keep[keep] = _within_goal(state, cand[keep], src, tgt, loads)
    if keep.any():
        keep[keep] = state.allowed(cand[keep], np.array([tgt], dtype=np.intp))[:, 0]
    cand, added = cand[keep], added[keep]
    if cand.size == 0:
        return None
    cost = np.where(state.moved_of(cand), 0.0, state.units.cost[cand])
    k = int(np.lexsort((cand, cost, added))[0])
    return int(cand[k]), int(added[k])


def _within_goal(
    state: BalanceState, cand: np.ndarray, src: int, tgt: int, loads: dict[int, np.ndarray]
) -> np.ndarray:
    """(len(cand),) whether moving each unit of ``cand`` from ``src`` to ``tgt`` leaves every
    weighted resource's spread within its goal, with the nodes of ``loads`` (``src`` and ``tgt``
    among them) at those loads and the others as they are (``src`` and ``tgt`` in one
    architecture group)."""
    f = state.kept_fractions()
    weighted = np.nonzero(state.weights > 0)[0]
    group = state.group
    inv = state.inv_cap[:, weighted]
    d = state.units.demand[cand][:, weighted]
    f_src = (loads[src][weighted] - d) * inv[src]
    f_tgt = (loads[tgt][weighted] + d) * inv[tgt]
    high, low = np.maximum(f_src, f_tgt), np.minimum(f_src, f_tgt)
    same = group == group[src]
    same[list(loads)] = False
    fixed = [loads[n][weighted] * inv[n] for n in loads if n not in (src, tgt)]
    rows = np.vstack([f[same][:, weighted], *fixed]) if fixed else f[same][:, weighted]
    if rows.shape[0]:
        high = np.maximum(high, rows.max(axis=0))
        low = np.minimum(low, rows.min(axis=0))
    spread = high - low
    for g in range(int(group.max(initial=-1)) + 1):
        members = np.nonzero(group == g)[0]
        if g != group[src] and members.size >= 2:
            fg = f[members][:, weighted]
            spread = np.maximum(spread, fg.max(axis=0) - fg.min(axis=0))
    return np.all(spread <= state.goal[weighted], axis=1)
