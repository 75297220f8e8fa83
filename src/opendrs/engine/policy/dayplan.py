"""A balancing proposal for the whole day (:func:`day_proposal`): with ``policy.daily_profile``,
the guests to move are chosen on their usage at every hour of the day at once, so that guests
whose peaks do not coincide end up together.

The objective is the capacity-weighted variance of the node load fractions summed over the
hours of the day — ``J = Σ_h Σ_r w_r · Σ_n C_nr (f_nhr − f̄_hr)² / Σ_n C_nr`` on the usable
nodes —, zero only when every node carries the same share of the cluster's load at every hour.
Moving a guest with demand ``d_hr`` from node ``a`` to ``b`` changes it by
``Σ_h Σ_r w_r (d_hr²(1/C_ar + 1/C_br) − 2 d_hr (f_ahr − f_bhr)) / Σ_n C_nr`` (the ``balance``
strategy's move gain, per hour). Moves are made greedily, the largest decrease first, each guest
at most once, each target passing every hard constraint (capacity on the usage the policy checks,
rules, forbidden placements) where the guests stand after the moves before it; the search stops
when every hour's spread is at most the target, when the best allowed move lowers ``J`` by less
than :data:`LEAST_GAIN` of what is left, or at ``most`` moves. Guests bundled by hard affinity
stay where they are (the strategy moves bundles; this search moves single guests).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from opendrs.engine.constraints import Constraints, committed_for, movability
from opendrs.engine.imbalance import normalise_weights
from opendrs.engine.policy.profile import day_metric, hour_loads
from opendrs.engine.sparse_rows import RowMask
from opendrs.engine.strategies.base import (
    Proposal,
    ProposedMove,
    Stop,
    cluster_imbalance,
    migration_cost,
)
from opendrs.engine.usage import LoadModel, MeasuredUsage, safe_divide
from opendrs.model.cluster import Cluster

#: A move is made only if it lowers the day's objective by at least this share of it.
LEAST_GAIN = 0.02
#: Candidates tried against the hard constraints per move, best first.
TRIES = 64
STRATEGY = "daily-profile"


def _movable(cluster: Cluster, cons: Constraints, loads: LoadModel) -> np.ndarray:
    """Indices of the guests the search may move: loading their node, free to move, alone."""
    out = [
        j
        for j, guest in enumerate(cluster.guests)
        if loads.active[j]
        and loads.assign[j] >= 0
        and cons.unit_of(j) < 0
        and movability(guest, cluster) is None
    ]
    return np.array(out, dtype=np.intp)


class _Day:
    """The search's state: the placement and each node's load at each hour."""

    def __init__(self, cluster: Cluster, loads: LoadModel, hours: Sequence[MeasuredUsage]):
        self.assign = loads.assign.copy()
        self.capacity = loads.capacity
        self.usable = np.array([n.usable for n in cluster.nodes], dtype=bool) & np.all(
            loads.capacity > 0, axis=1
        )
        each = [hour_loads(loads, u) for u in hours]
        self.demand = np.stack([h.demand for h in each])  # (H, G, R)
        self.load = np.stack([h.loads() for h in each])  # (H, N, R)
        settings = cluster.settings
        total = self.capacity[self.usable].sum(axis=0)
        weights = normalise_weights([settings.weight_cpu, settings.weight_memory], 2)
        self.scale = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0)  # (R,)

    def objective(self) -> float:
        f = safe_divide(self.load[:, self.usable], self.capacity[self.usable])
        c = self.capacity[self.usable]
        mean = (f * c).sum(axis=1, keepdims=True) / np.maximum(c.sum(axis=0), 1e-300)
        return float(((f - mean) ** 2 * c * self.scale).sum())

    def gains(self, guests: np.ndarray) -> np.ndarray:
        """(len(guests), N): how much moving each guest to each node lowers the objective
        (−inf to its own node and to nodes that take no part)."""
        f = safe_divide(self.load, self.capacity)  # (H, N, R)
        f = np.where(np.isfinite(f), f, 0.0)
        d = self.demand[:, guests] * self.scale  # (H, M, R), weighted
        raw = self.demand[:, guests]
        a = self.assign[guests]
        inv = safe_divide(np.ones_like(self.capacity), self.capacity)  # (N, R)
        inv = np.where(np.isfinite(inv), inv, 0.0)
        from_a = (d * f[:, a]).sum(axis=(0, 2))  # (M,)
        to_b = np.einsum("hmr,hnr->mn", d, f)
        square = (d * raw).sum(axis=0)  # (M, R)
        gain = 2.0 * (from_a[:, None] - to_b) - (square * inv[a]).sum(axis=1)[:, None]
        gain -= square @ inv.T
        gain[np.arange(len(guests)), a] = -np.inf
        gain[:, ~self.usable] = -np.inf
        return gain

    def move(self, j: int, target: int) -> None:
        source = int(self.assign[j])
        self.load[:, source] -= self.demand[:, j]
        self.load[:, target] += self.demand[:, j]
        self.assign[j] = target


def day_proposal(
    cluster: Cluster,
    loads: LoadModel,
    cons: Constraints,
    hours: Sequence[MeasuredUsage],
    *,
    metric: str,
    target: float,
    most: int | None,
) -> Proposal:
    """The moves that balance ``cluster`` over the day's ``hours`` (see the module docstring):
    ``loads`` its balance :class:`LoadModel`, ``cons`` the constraints every target must pass
    (forbidden placements refused), ``metric`` the policy's metric, measured at every hour, that
    ``target`` stops at, ``most`` the most moves (None: no limit). Pure and deterministic."""
    day = _Day(cluster, loads, hours)
    before_metric = day_metric(cluster, metric, loads, hours)
    start = loads.assign.copy()
    moved: set[int] = set()
    moves: list[ProposedMove] = []
    stopped = "no move lowers the day's imbalance enough"
    stop = Stop("no_day_move_pays")
    metric_now = before_metric
    static = cons.static_ok()
    guests = _movable(cluster, cons, loads)
    while True:
        if metric_now <= target:
            stopped = f"every hour's {metric} at or below the target"
            stop = Stop("day_balanced", {"metric": metric})
            break
        if most is not None and len(moves) >= most:
            stopped, stop = f"move limit {most}", Stop("move_limit", {"max_moves": most})
            break
        found = _best_move(day, cons, static, guests, moved)
        if found is None:
            break
        j, n = found
        source = cluster.nodes[int(day.assign[j])].name
        day.move(j, n)
        moved.add(j)
        after = day_metric(cluster, metric, loads, hours, day.assign)
        guest = cluster.guests[j]
        moves.append(
            ProposedMove(
                guest=guest.id,
                source=source,
                target=cluster.nodes[n].name,
                metric=f"day {metric}",
                before=metric_now,
                after=after,
                cost=migration_cost(guest, cluster.settings),
                reason="balances the day's hours (daily profile)",
            )
        )
        metric_now = after
    return Proposal(
        strategy=STRATEGY,
        moves=tuple(moves),
        before=cluster_imbalance(cluster, start, loads),
        after=cluster_imbalance(cluster, day.assign, loads),
        stopped=stopped,
        stop=stop,
    )


def _best_move(
    day: _Day, cons: Constraints, static: RowMask, guests: np.ndarray, moved: set[int]
) -> tuple[int, int] | None:
    """The allowed (guest, node) move that lowers the objective most, if it lowers it by at
    least :data:`LEAST_GAIN` of it."""
    free = np.array([j for j in guests.tolist() if j not in moved], dtype=np.intp)
    if not free.size:
        return None
    gain = day.gains(free)
    for row, j in enumerate(free.tolist()):
        gain[row, ~static[j]] = -np.inf
    least = LEAST_GAIN * day.objective()
    order = np.argsort(-gain, axis=None, kind="stable")[:TRIES]
    committed = committed_for(cons, day.assign)
    limit = cons.capacity.limit
    for flat in order.tolist():
        row, n = divmod(flat, gain.shape[1])
        if not gain[row, n] > least:
            return None
        j = int(free[row])
        own = np.zeros_like(committed)
        own[int(day.assign[j])] = cons.guest_demand(j)
        if cons.allowed(j, day.assign, limit - committed + own)[n]:
            return j, n
    return None


__all__ = ["LEAST_GAIN", "day_proposal"]
