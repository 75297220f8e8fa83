"""``balance``'s shedding plan (:func:`shed_plan`): the fewest migrations that carry a hot node's
excess in its proportions, moved first by the rounds."""

from __future__ import annotations

import numpy as np

from .kinds import every
from .state import BalanceState

#: Directions the shedding plan tries, from "memory-light" through "both" to "cpu-light".
PLAN_DIRECTIONS = 91
#: A shedding plan that falls short of a node's excess counts each missing typical guest as
#: this many extra migrations (it will take a few moves to make up later).
PLAN_SHORTFALL = 4.0
#: A hot node's plan may instead be the fewest migrations among one to three of its units whose
#: total lands in the band, searched exactly where its units are of at most this many kinds.
EXACT_KINDS = 40
#: Hot nodes planned at once (bounds the plan's working arrays on big clusters).
PLAN_CHUNK = 64


def shed_plan(state: BalanceState) -> np.ndarray:
    """(U,) units planned to leave the nodes above the band in every weighted resource.

    Per such node, with its excess ``e`` over the mean (per weighted resource) and ``h`` half the
    band: for each of :data:`PLAN_DIRECTIONS` directions, the node's movable units in the order of
    their projection (demand / ``e``) on the direction per guest, each taken unless it would push
    the total beyond ``e + h`` in some resource, until the total reaches ``e − h`` in every one.
    The direction with the fewest migrations (a bundle's guests each count) wins, a shortfall
    counting :data:`PLAN_SHORTFALL` migrations per missing typical unit; one to three units whose
    total lies within ``e ± h`` with fewer migrations still (:func:`_fewest_within`) replace it.
    Vectorised over directions and over :data:`PLAN_CHUNK` nodes at a time.
    """
    units = state.units
    plan = np.zeros(len(units.assign), dtype=bool)
    counted = state.steer_weights > 0
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
    for chunk in range(0, hot.size, PLAN_CHUNK):
        nodes = hot[chunk : chunk + PLAN_CHUNK]
        members = [np.nonzero(candidate & (units.assign == n))[0] for n in nodes.tolist()]
        for chosen in _plan_chunk(state, members, excess[nodes], half[nodes], directions):
            plan[chosen] = True
    return plan


def _plan_chunk(
    state: BalanceState,
    members: list[np.ndarray],
    e: np.ndarray,
    half: np.ndarray,
    directions: np.ndarray,
) -> list[np.ndarray]:
    """The units planned to leave each of a chunk of hot nodes (``members``: their candidate
    units; ``e``, ``half``: their excesses and half bands, (H, R')): the sweep's best direction,
    or the fewest migrations of :func:`_fewest_within` where that needs fewer."""
    counted = state.steer_weights > 0
    width = max((m.size for m in members), default=0)
    if width == 0:
        return []
    index = np.full((len(members), width), -1, dtype=np.intp)
    for k, m in enumerate(members):
        index[k, : m.size] = m
    valid = index >= 0
    demand = np.where(
        valid[:, :, None], state.units.demand[np.maximum(index, 0)][:, :, counted], 0.0
    )
    scaled = demand / e[:, None, :]  # (H, M, R')
    low, high = 1 - half / e, 1 + half / e
    # Migrations, not units: a bundle of k guests counts k, and carries per guest.
    guests = np.where(valid, state.unit_guests[np.maximum(index, 0)], 1)  # (H, M)
    score = np.where(valid[:, :, None], scaled @ directions.T / guests[:, :, None], -np.inf)
    order = np.argsort(-score, axis=1, kind="stable").transpose(0, 2, 1)  # (H, K, M)
    total, taken = _sweep(order, scaled, valid, low, high)
    typical = state.typical[counted]
    short = (np.maximum(low[:, None, :] - total, 0.0) * (e / typical)[:, None, :]).sum(axis=2)
    count = (taken * guests[np.arange(len(members))[:, None, None], order]).sum(axis=2)
    swept = count + PLAN_SHORTFALL * short
    best = np.argmin(swept, axis=1)  # (H,)
    out = []
    for k, m in enumerate(members):
        chosen = order[k, best[k]][taken[k, best[k]]]
        few = _fewest_within(scaled[k, : m.size], guests[k, : m.size], low[k], high[k])
        if few is not None and int(guests[k, few].sum()) < swept[k, best[k]]:
            chosen = few
        out.append(index[k, chosen])
    return out


def _fewest_within(
    scaled: np.ndarray, guests: np.ndarray, low: np.ndarray, high: np.ndarray
) -> np.ndarray | None:
    """Positions of one to three of a node's units (``scaled``: their demands in excesses,
    (M, R'); ``guests``: their guests) whose total lies in ``[low, high]`` in every resource,
    the fewest migrations first, then the total nearest the excess; None if none does, or if
    the units are of more than :data:`EXACT_KINDS` kinds (demand and guests)."""
    kinds, kind_of, count = np.unique(
        np.column_stack([scaled, guests]), axis=0, return_inverse=True, return_counts=True
    )
    n_kinds = len(kinds)
    if n_kinds == 0 or n_kinds > EXACT_KINDS:
        return None
    # A last kind "none" (no demand, no guest) makes singles and pairs triples (a <= b <= c).
    demand = np.vstack([kinds[:, :-1], np.zeros(scaled.shape[1])])
    weight = np.r_[kinds[:, -1], 0.0]
    count = np.r_[count, 3]
    grid = np.meshgrid(*[np.arange(n_kinds + 1)] * 3, indexing="ij")
    a, b, c = (axis.ravel() for axis in grid)
    keep = (a <= b) & (b <= c) & (a < n_kinds)
    # A kind taken twice or three times must have that many units.
    keep &= np.where(a == c, count[a] >= 3, np.where(a == b, count[a] >= 2, True))
    keep &= np.where((b == c) & (a != b), count[b] >= 2, True)
    a, b, c = a[keep], b[keep], c[keep]
    total = demand[a] + demand[b] + demand[c]
    fits = every((total >= low) & (total <= high))
    if not fits.any():
        return None
    migrations = np.where(fits, weight[a] + weight[b] + weight[c], np.inf)
    best = int(np.lexsort((((total - 1.0) ** 2).sum(axis=1), migrations))[0])
    used = np.bincount([a[best], b[best], c[best]], minlength=n_kinds + 1)[:n_kinds]
    return np.concatenate(
        [np.nonzero(kind_of.ravel() == kind)[0][:n] for kind, n in enumerate(used.tolist()) if n]
    )


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
