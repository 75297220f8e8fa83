"""``balance``'s shedding plan (:func:`shed_plan`): the fewest units that carry a hot node's excess
in its proportions, moved first by the rounds."""

from __future__ import annotations

import numpy as np

from .kinds import every
from .state import BalanceState

#: Directions the shedding plan tries, from "memory-light" through "both" to "cpu-light".
PLAN_DIRECTIONS = 91
#: A shedding plan that falls short of a node's excess counts each missing typical guest as
#: this many extra migrations (it will take a few moves to make up later).
PLAN_SHORTFALL = 4.0
#: Hot nodes planned at once (bounds the plan's working arrays on big clusters).
PLAN_CHUNK = 64


def shed_plan(state: BalanceState) -> np.ndarray:
    """(U,) units planned to leave the nodes above the band in every weighted resource.

    Per such node, with its excess ``e`` over the mean (per weighted resource) and ``h`` half the
    band: for each of :data:`PLAN_DIRECTIONS` directions, the node's movable units in the order of
    their projection (demand / ``e``) on the direction, each taken unless it would push the total
    beyond ``e + h`` in some resource, until the total reaches ``e − h`` in every one. The
    direction with the fewest units wins, a shortfall counting :data:`PLAN_SHORTFALL` units per
    missing typical unit. Vectorised over directions and over :data:`PLAN_CHUNK` nodes at a time.
    """
    units = state.units
    plan = np.zeros(len(units.assign), dtype=bool)
    counted = state.weights > 0
    if state.usable.sum() < 2 or not counted.any():
        return plan
    excess = (state.node_load - state.mean() * state.cap)[:, counted]  # (N, R')
    half = (state.goal / 2 * state.cap)[:, counted]
    hot = np.nonzero(state.usable & np.all(excess > np.maximum(half, 0.0), axis=1))[0]
    if hot.size == 0:
        return plan
    dims = int(counted.sum())
    if dims == 2:
        angles = np.linspace(-np.pi / 2, np.pi, PLAN_DIRECTIONS)
        directions = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    else:
        directions = np.ones((1, dims))
    candidate = units.movable & ~state.broken & state.usable[units.assign]
    typical = state.typical[counted]
    for chunk in range(0, hot.size, PLAN_CHUNK):
        nodes = hot[chunk : chunk + PLAN_CHUNK]
        members = [np.nonzero(candidate & (units.assign == n))[0] for n in nodes.tolist()]
        width = max((m.size for m in members), default=0)
        if width == 0:
            continue
        index = np.full((len(nodes), width), -1, dtype=np.intp)
        for k, m in enumerate(members):
            index[k, : m.size] = m
        valid = index >= 0
        e = excess[nodes]  # (H, R')
        demand = np.where(valid[:, :, None], units.demand[np.maximum(index, 0)][:, :, counted], 0.0)
        scaled = demand / e[:, None, :]  # (H, M, R')
        low = 1 - half[nodes] / e
        high = 1 + half[nodes] / e
        score = np.where(valid[:, :, None], scaled @ directions.T, -np.inf)  # (H, M, K)
        order = np.argsort(-score, axis=1, kind="stable").transpose(0, 2, 1)  # (H, K, M)
        total, taken = _sweep(order, scaled, valid, low, high)
        short = (np.maximum(low[:, None, :] - total, 0.0) * (e / typical)[:, None, :]).sum(axis=2)
        count = taken.sum(axis=2)
        best = np.argmin(count + PLAN_SHORTFALL * short, axis=1)  # (H,)
        for k in range(len(nodes)):
            chosen = order[k, best[k]][taken[k, best[k]]]
            plan[index[k, chosen]] = True
    return plan


def _sweep(
    order: np.ndarray, scaled: np.ndarray, valid: np.ndarray, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per hot node and direction, the units taken in ``order`` (H, K, M): each one unless it
    would push the total (in excesses, ``scaled`` (H, M, R')) beyond ``high`` in some resource,
    until the total reaches ``low`` in every one. The totals (H, K, R') and the units taken
    (H, K, M)."""
    n_nodes, n_directions, width = order.shape
    rows = np.arange(n_nodes)[:, None]
    total = np.zeros((n_nodes, n_directions, scaled.shape[2]))
    taken = np.zeros(order.shape, dtype=bool)
    active = np.ones((n_nodes, n_directions), dtype=bool)
    for p in range(width):
        item = order[:, :, p]  # (H, K)
        grown = total + scaled[rows, item]
        take = active & valid[rows, item] & every(grown <= high[:, None, :])
        total = np.where(take[:, :, None], grown, total)
        taken[:, :, p] = take
        active &= ~every(total >= low[:, None, :])
        if not active.any():
            break
    return total, taken
