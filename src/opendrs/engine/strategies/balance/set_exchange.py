"""``balance``'s set exchanges: one unit against a set of units, evaluated as one step.

Where no single move and no exchange of two units lowers the objective enough to pay for itself,
the imbalance left is often one no pair can fix: a node must give a big unit and take back several
small ones (a 128 GiB guest on a 384 GiB node), or must trade memory for CPU while the CPU is
already as even as one vCPU allows (a unit of ``c`` vCPUs and ``m`` GiB against several that
sum to ``c`` vCPUs and less memory). Each move of such a step alone makes the objective worse;
together they make it better.

Between two nodes ``a`` and ``b`` of one architecture group, moving demand ``t`` (a vector over
the resources) from ``a`` to ``b`` changes the objective by ``Σ_r k_r t_r² − 2 g_r t_r`` with
``g_r = w_r (f_ar − f_br)`` and ``k_r = w_r (1/C_ar + 1/C_br)`` (``w_r``: the resource's weight
over the group's capacity; see :meth:`.BalanceState.gains`). The gain is largest for
``t* = g / k`` and falls by ``Σ_r k_r (t_r − t*_r)²`` away from it. A set exchange sends a unit
``x`` from ``a`` to ``b`` and a set ``S`` of units from ``b`` to ``a``: ``t = d_x − Σ_S d``. For
each unit ``x`` on ``a`` the set is chosen greedily — each time the unit of ``b`` that brings
``Σ_S d`` closest to ``d_x − t*`` in that metric, while one does — which is exact in what it
scores: every step lowers the objective of the exchange so far. A set of one is an exchange of
two units, searched here with other partners than :meth:`.BalanceState.best_swap`'s.

The nodes: the ones farthest outside the target band are heads (what the target still asks
for; the objective can be dominated by a resource already as even as its grain allows); each
head's partners are the nodes of its group farthest from it the other way in the resources it
is outside the band of. An exchange is made only if its gain pays for every migration it adds
(the caller's rule), and at most one per node in a round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .hold import keeps_held
from .state import BalanceState

#: Most units a set may hold.
SET_SIZE = 32
#: Partner nodes each head looks at.
SET_PARTNERS = 16
#: Units of a head tried as the single side (the largest, by their weighted demand).
SET_UNITS = 16
#: Pairs of nodes whose best set exchange is kept (see :func:`_kept`).
SET_KEPT = 4096


@dataclass(frozen=True)
class SetExchange:
    """Unit ``unit`` from node ``a`` to node ``b``, and the units ``others`` from ``b`` to ``a``;
    its objective gain and the migrations it adds."""

    score: float
    gain: float
    unit: int
    a: int
    b: int
    others: tuple[int, ...]
    added: int


def heads_and_partners(state: BalanceState, heads: int) -> list[tuple[int, np.ndarray]]:
    """The ``heads`` nodes farthest outside the band (see :meth:`.BalanceState.band_gains`) in
    the resources still above their goal, each with its partner nodes: those of its group
    farthest the other way in the resources it is outside the band of, best first."""
    f = state.kept_fractions()
    mean = state.kept_mean()
    usable = state.usable
    half = state.goal / 2
    above = np.maximum(f - mean - half, 0.0)
    below = np.maximum(mean - half - f, 0.0)
    # Only the resources whose spread is still above its goal: one within it may have nodes
    # outside the band (the band is centred on the mean) that no exchange needs to move.
    counted = (state.steer_weights > 0) & (state.spreads() > state.goal)
    outside = ((above + below) * state.cap / state.typical)[:, counted].sum(axis=1)
    outside = np.where(usable, outside, 0.0)
    order = np.argsort(-outside, kind="stable")[:heads]
    out: list[tuple[int, np.ndarray]] = []
    for a in order.tolist():
        if outside[a] <= 0:
            break
        side = (np.sign(above[a]) - np.sign(below[a])) * counted  # +1 above, -1 below
        toward = ((f[a] - f) * side[None, :] * state.steer_weights[None, :]).sum(axis=1)
        toward = np.where(usable & (state.group == state.group[a]), toward, 0.0)
        toward[a] = 0.0
        partners = np.argsort(-toward, kind="stable")[:SET_PARTNERS]
        out.append((a, partners[toward[partners] > 0]))
    return out


def best_set_exchange(state: BalanceState, a: int, b: int) -> SetExchange | None:
    """The best set exchange between nodes ``a`` and ``b`` (a unit of ``a`` against a set of
    ``b``'s, or of ``b`` against ``a``'s), by gain per migration added; None if none gains."""
    one = _one_way(state, a, b)
    other = _one_way(state, b, a)
    found = [e for e in (one, other) if e is not None]
    return max(found, key=lambda e: (e.score, -e.unit)) if found else None


def _one_way(state: BalanceState, a: int, b: int) -> SetExchange | None:
    """A unit of ``a`` to ``b`` against a set of ``b``'s units to ``a``."""
    units = state.units
    # The movable, whole units on each node, kept until a move touches it.
    xs = state.node_kinds(a).units
    ys = state.node_kinds(b).units
    if xs.size == 0 or ys.size == 0:
        return None
    xs = xs[units.static_ok[xs, b]]
    ys = ys[units.static_ok[ys, a] & ~state.has_neg[ys]]
    if xs.size == 0 or ys.size == 0:
        return None
    f, inv, w = state.kept_fractions(), state.inv_cap, state.steer_wnorm
    g = w * (f[a] - f[b])
    k = w * (inv[a] + inv[b])
    with np.errstate(divide="ignore", invalid="ignore"):
        ideal = np.where(k > 0, g / np.where(k > 0, k, 1.0), 0.0)
    dx = units.demand[xs]
    if xs.size > SET_UNITS:
        # The largest units: a small one is better moved alone or in a pair.
        size = (dx * dx * k).sum(axis=1)
        keep = np.sort(np.argsort(-size, kind="stable")[:SET_UNITS])
        xs, dx = xs[keep], dx[keep]
    dy = units.demand[ys]
    want = dx - ideal[None, :]  # (X, R): what the set should sum to
    # Only units whose set must bring something: else the unit alone is the move.
    keep = np.any(want > 0, axis=1)
    if not keep.any():
        return None
    xs, dx, want = xs[keep], dx[keep], want[keep]
    taken = _greedy_sets(want, dy, k)
    count = taken.sum(axis=1)
    t = dx - taken.astype(np.float64) @ dy  # (X, R) what moves a -> b
    gain = (2 * g * t - k * t * t).sum(axis=1)
    ok = (count >= 1) & (gain > 0)
    if not ok.any():
        return None
    moved_x = state.moved_of(xs)
    moved_y = state.moved_of(ys)
    # Migrations added: each unit's guests, unless it has moved already.
    guests_x, guests_y = state.unit_guests[xs], state.unit_guests[ys]
    added = np.where(moved_x, 0, guests_x) + (taken & ~moved_y[None, :]) @ guests_y
    score = np.where(added > 0, gain / np.maximum(added, 1), 4 * gain)
    score = np.where(ok, score, -np.inf)
    for row in np.argsort(-score, kind="stable").tolist():
        if not np.isfinite(score[row]):
            break
        others = ys[taken[row]]
        if _allowed(state, int(xs[row]), others, a, b):
            return SetExchange(
                float(score[row]),
                float(gain[row]),
                int(xs[row]),
                a,
                b,
                tuple(int(y) for y in others.tolist()),
                int(added[row]),
            )
    return None


def _greedy_sets(want: np.ndarray, dy: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(X, Y) for each row of ``want`` (X, R), the units (rows of ``dy``) whose demands sum
    closest to it in the metric ``k``: each time the unit that brings the sum closest, while one
    brings it closer, at most :data:`SET_SIZE`."""
    taken = np.zeros((want.shape[0], dy.shape[0]), dtype=bool)
    residual = want.copy()
    own = (dy * dy * k).sum(axis=1)  # (Y,)
    for _ in range(SET_SIZE):
        value = 2 * (residual * k) @ dy.T  # − own: the fall of ||residual − d_y||²_k
        value -= own[None, :]
        value[taken] = -np.inf
        pick = np.argmax(value, axis=1)
        better = value[np.arange(want.shape[0]), pick] > 0
        if not better.any():
            break
        rows = np.nonzero(better)[0]
        taken[rows, pick[rows]] = True
        residual[rows] -= dy[pick[rows]]
    return taken


def _allowed(state: BalanceState, x: int, others: np.ndarray, a: int, b: int) -> bool:
    """Whether the exchange keeps every hard constraint — capacity on both nodes after it, no
    hard anti-affinity partner of ``x`` on ``b`` (the set's units have none), every held
    resource within its goal (:mod:`.hold`) — and the headroom in what the guests use
    (:func:`keeps_headroom`)."""
    units = state.units
    room = state.limit - state.committed + state.tol
    into_b = units.need[x] - units.need[others].sum(axis=0)
    if np.any(into_b > room[b]) or np.any(-into_b > room[a]):
        return False
    if not keeps_headroom(state, a, b, into_b):
        return False
    if state.has_neg[x] and state.blocked_at(np.array([x]), np.array([b]))[0]:
        return False
    moved = units.demand[x] - units.demand[others].sum(axis=0)
    if not keeps_held(state, np.array([a]), np.array([b]), moved[None, :])[0]:
        return False
    return bool(state.usable[a] and state.usable[b])


def set_round(
    state: BalanceState, heads: int, pays: Callable[[SetExchange], bool], room: int
) -> list[SetExchange]:
    """The set exchanges of one round: each head's best that pays for itself, best score first,
    on disjoint nodes, adding at most ``room`` migrations in all."""
    offers: list[SetExchange] = []
    for a, partners in heads_and_partners(state, heads):
        found = [e for b in partners.tolist() if (e := _kept(state, a, b)) and pays(e)]
        if found:
            offers.append(max(found, key=lambda e: (e.score, -e.b)))
    offers.sort(key=lambda e: (-e.score, e.a, e.b))
    busy: set[int] = set()
    out: list[SetExchange] = []
    for e in offers:
        size = 1 + len(e.others)
        if e.a in busy or e.b in busy or size > room:
            continue
        busy.update((e.a, e.b))
        room -= size
        out.append(e)
    return out


def _kept(state: BalanceState, a: int, b: int) -> SetExchange | None:
    """:func:`best_set_exchange` of ``a`` and ``b``, kept while neither node changes: it depends
    only on their loads, commitments and units (a move within a group keeps its mean)."""
    kinds = (state.node_kinds(a), state.node_kinds(b))
    kept = state.set_exchanges.get((a, b))
    if kept is not None and kept[0] is kinds[0] and kept[1] is kinds[1]:
        return kept[2]
    if len(state.set_exchanges) > SET_KEPT:
        state.set_exchanges.clear()
    found = best_set_exchange(state, a, b)
    state.set_exchanges[(a, b)] = (kinds[0], kinds[1], found)
    return found


def keeps_headroom(state: BalanceState, a: int, b: int, into_b: np.ndarray) -> bool:
    """Whether the tighter of the two nodes keeps at least the share of its limit it had free, in
    every dimension of measured use (``cpu_used``, ``memory_used``). The balance loads can be a
    smoothed usage that lags behind the use that capacity is judged on (a guest that has just
    grown); a set exchange is a big step taken on those loads, and must not fill a node up with
    what its guests really use. Without measured use (configured sizes) it always holds."""
    dims = [d for d, dim in enumerate(state.cons.capacity.dimensions) if dim.kind.measured]
    if not dims:
        return True
    limit = state.limit[[a, b]][:, dims]
    free = limit - state.committed[[a, b]][:, dims]
    after = free + np.outer([1.0, -1.0], into_b[dims])
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(limit > 0, free / np.where(limit > 0, limit, 1.0), np.inf)
        share_after = np.where(limit > 0, after / np.where(limit > 0, limit, 1.0), np.inf)
    return bool(share_after.min() >= share.min() - 1e-12)
