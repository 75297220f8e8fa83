"""``balance``'s held resources: a resource already within its goal does not steer the search, it
is held there.

Each round of :func:`.rounds.balance_rounds` the weighted resources whose spread is within their
goal (``state.goal``) are *held*: they get no weight in what chooses the moves — the objective
gain, the band distance, the exchanges, the shedding plan and the price a move must pay
(:meth:`.state.BalanceState.steer`) — and no move or exchange may take a held resource's spread
above its goal, a hard check as capacity is. The resources outside their goal keep their weight.
Without it, a resource balanced already (the vCPU commitments, whose goal is one vCPU on the
smallest node) steers every move choice on its own and the search makes many small moves to keep
it finer than it has to be.

The check is exact: for a move of ``t`` from node ``a`` to node ``b`` (an exchange: what moves net),
the spread after it is ``max(rest, f_a', f_b') − min(rest, f_a', f_b')`` where ``rest`` are the
other nodes of the architecture group, whose extremes come from each group's three highest and
three lowest fractions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from opendrs.engine.usage import RESOURCES

if TYPE_CHECKING:
    from .state import BalanceState

#: Highest (and lowest) fractions kept per group: enough to skip the two nodes of a move.
EXTREMES = 3


def group_extremes(state: BalanceState, r: int) -> tuple[np.ndarray, ...]:
    """(N, 3) per node, the highest fractions of resource ``r`` in its architecture group and
    their nodes, then the lowest and theirs (padded with ∓inf and node -1; a node that is not
    usable, or alone in its group, has none). Kept until a move changes a node's load."""
    key = (r, int(state.version.sum()))
    kept = state.extremes.get(key)
    if kept is None:
        if len(state.extremes) > 8:
            state.extremes.clear()
        kept = state.extremes[key] = _group_extremes(state, r)
    return kept


def _group_extremes(state: BalanceState, r: int) -> tuple[np.ndarray, ...]:
    """:func:`group_extremes`, computed."""
    n_nodes = len(state.cluster.nodes)
    top_v = np.full((n_nodes, EXTREMES), -np.inf)
    low_v = np.full((n_nodes, EXTREMES), np.inf)
    top_i = np.full((n_nodes, EXTREMES), -1, dtype=np.intp)
    low_i = np.full((n_nodes, EXTREMES), -1, dtype=np.intp)
    f = state.kept_fractions()[:, r]
    for g in range(int(state.group.max(initial=-1)) + 1):
        idx = np.nonzero(state.group == g)[0]
        if idx.size < 2:
            continue
        order = idx[np.argsort(-f[idx], kind="stable")]
        k = min(EXTREMES, idx.size)
        top_v[idx, :k], top_i[idx, :k] = f[order[:k]], order[:k]
        low_v[idx, :k], low_i[idx, :k] = f[order[::-1][:k]], order[::-1][:k]
    return top_v, top_i, low_v, low_i


def _first_other(values: np.ndarray, nodes: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(k,) the first of each row of ``values`` whose node is neither ``a`` nor ``b`` (the pad
    value where none is)."""
    other = (nodes != a[:, None]) & (nodes != b[:, None]) & (nodes >= 0)
    first = np.argmax(other, axis=1)
    picked = values[np.arange(len(a)), first]
    return np.where(other.any(axis=1), picked, values[:, -1])


def _others(
    state: BalanceState, r: int, a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k,) each, for a move from ``a[k]`` to ``b[k]``: the highest and the lowest fraction of
    resource ``r`` among the other nodes of ``b``'s group, and whether ``b`` is in no group or
    alone in its own (then there is no spread to keep)."""
    top_v, top_i, low_v, low_i = group_extremes(state, r)
    rest_max = _first_other(top_v[b], top_i[b], a, b)
    rest_min = _first_other(low_v[b], low_i[b], a, b)
    alone = (state.group[b] < 0) | (top_i[b, 1] < 0)
    return rest_max, rest_min, alone


def keeps_held(state: BalanceState, a: np.ndarray, b: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """(k,) whether moving ``shift[k]`` (demand, (k, R)) from node ``a[k]`` to node ``b[k]`` keeps
    every held resource's spread within its goal. ``a`` is a node of ``b``'s architecture group
    (guests never move between architectures) or one that is not usable (its load does not
    count in the spread); ``b`` is usable wherever the answer matters."""
    ok = np.ones(len(a), dtype=bool)
    if len(a) == 0:
        return ok
    f, inv = state.kept_fractions(), state.inv_cap
    for r in np.nonzero(state.held)[0].tolist():
        rest_max, rest_min, alone = _others(state, r, a, b)
        f_b = f[b, r] + shift[:, r] * inv[b, r]
        f_a = np.where(state.group[a] == state.group[b], f[a, r] - shift[:, r] * inv[a, r], f_b)
        high = np.maximum(np.maximum(rest_max, f_a), f_b)
        low = np.minimum(np.minimum(rest_min, f_a), f_b)
        ok &= (high - low <= state.goal[r]) | alone
    return ok


def keeps_held_moves(
    state: BalanceState, units: np.ndarray, targets: np.ndarray, asked: np.ndarray | None = None
) -> np.ndarray:
    """(len(units), len(targets)) :func:`keeps_held` of moving each whole unit to each target,
    only where ``asked`` (the same shape; default: everywhere) — True elsewhere; a broken
    bundle, which leaves several nodes, against the spreads the move leaves.

    A demand ``d ≥ 0`` moved from ``a`` to ``b`` keeps a spread within ``g`` exactly when ``b``
    stays within ``g`` of the others' lowest, ``a`` within ``g`` of the others' highest, and
    ``b`` within ``g`` of ``a``: three most demands per pair of nodes, which the units on the
    same node share."""
    if asked is None:
        asked = np.ones((len(units), len(targets)), dtype=bool)
    src = state.units.assign[units]
    sources, at = np.unique(src, return_inverse=True)
    most = _most_demand(state, sources, targets)  # (R, S, T)
    demand = state.units.demand[units]
    ok = np.ones(asked.shape, dtype=bool)
    for r in np.nonzero(state.held)[0].tolist():
        ok &= demand[:, r : r + 1] <= most[r][at]
    ok |= ~asked
    for row, col in zip(*np.nonzero(asked & state.broken[units][:, None]), strict=True):
        ok[row, col] = keeps_held_after(state, [(int(units[row]), int(targets[col]))])
    return ok


def _most_demand(state: BalanceState, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(R, S, T) for each held resource, the most of it a move from each of ``sources`` to each
    of ``targets`` may carry and keep its spread within its goal (inf where any)."""
    f, inv = state.kept_fractions(), state.inv_cap
    a = np.repeat(sources, len(targets))
    b = np.tile(targets, len(sources))
    same = state.group[a] == state.group[b]
    out = np.full((len(RESOURCES), len(sources), len(targets)), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        for r in np.nonzero(state.held)[0].tolist():
            rest_max, rest_min, alone = _others(state, r, a, b)
            g = state.goal[r]
            most = np.where(inv[b, r] > 0, (g + rest_min - f[b, r]) / inv[b, r], np.inf)
            from_a = np.where(inv[a, r] > 0, (g - rest_max + f[a, r]) / inv[a, r], np.inf)
            both = (g + f[a, r] - f[b, r]) / (inv[a, r] + inv[b, r])
            most = np.minimum(most, np.where(same, np.minimum(from_a, both), np.inf))
            out[r] = np.where(alone, np.inf, most).reshape(len(sources), len(targets))
    return out


def keeps_held_after(state: BalanceState, moves: list[tuple[int, int]]) -> bool:
    """Whether the moves (unit, target), made in order from the state now, leave every held
    resource's spread within its goal (the loads they leave, not moving anything)."""
    held = state.held
    if not held.any() or not moves:
        return True
    load = state.node_load.copy()
    where = state.where.copy()
    units = state.units
    for u, t in moves:
        idx = units.members[u]
        np.subtract.at(load, where[idx], units.guest_demand[idx])
        load[t] += units.demand[u]
        where[idx] = t
    f = np.where(state.cap > 0, load / np.where(state.cap > 0, state.cap, 1.0), 0.0)
    return bool(np.all(state.spreads_of(f)[held] <= state.goal[held]))
