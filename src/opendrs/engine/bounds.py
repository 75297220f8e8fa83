"""Lower bounds: how close to the best possible is a result?

Every plan reports the balance it reaches next to two lower bounds, so an operator can see how far
from optimal it is:

* :func:`spread_lower_bound` — no placement can bring a resource's spread (max − min of the usable
  nodes' load fractions) below this. Guests that may not move stay where they are, so a node's
  fraction is at least its immovable load over its capacity, while the smallest fraction can never
  exceed the cluster mean: ``spread ≥ max_n immovable_n / C_n − mean``.
* :func:`migration_lower_bound` — to reach a given spread, every node above ``mean + spread`` must
  shed its excess and every node below ``mean − spread`` must receive its deficit. Shedding an
  amount takes at least as many guests as the largest movable guests on that node need to add up to
  it; receiving takes at least as many as the largest movable guests of the cluster need. Each
  migration leaves one node and enters one node, so the bound is the larger of the two sums; the
  moved-memory bound is the larger of the memory excesses and deficits. Movable guests on nodes in
  maintenance must all leave.

The bounds are valid for any strategy (they ignore most constraints, which can only make the true
optimum worse), cheap (vectorised), and tight when guests are small relative to nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from opendrs.model.cluster import Cluster

from .constraints import Constraints, movability
from .usage import RESOURCES, LoadModel


@dataclass(frozen=True)
class LowerBounds:
    """Lower bounds for one cluster and one target spread."""

    #: Per resource: no placement has a smaller spread.
    spread: Mapping[str, float]
    #: Per resource: the spread the migration bounds are computed for.
    target_spread: Mapping[str, float]
    #: At least this many migrations are needed to reach ``target_spread``.
    migrations: int
    #: At least this many bytes of memory must move to reach ``target_spread``.
    moved_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {
            "spread": dict(self.spread),
            "target_spread": dict(self.target_spread),
            "migrations": self.migrations,
            "moved_bytes": self.moved_bytes,
        }


def _movable(cluster: Cluster) -> np.ndarray:
    """(G,) guests that may move to rebalance (the others keep their load where it is).

    Guests kept together by hard affinity move as one: if one of them may not move, none may.
    """
    movable = np.array(
        [movability(g, cluster, "balance") is None for g in cluster.guests], dtype=bool
    )
    for group in Constraints.build(cluster).groups:
        if not movable[group].all():
            movable[group] = False
    return movable


def spread_lower_bound(cluster: Cluster, loads: LoadModel | None = None) -> dict[str, float]:
    """Per resource, a spread no placement can beat."""
    loads = loads or LoadModel.build(cluster)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool) & np.all(
        loads.capacity > 0, axis=1
    )
    out = dict.fromkeys(RESOURCES, 0.0)
    if usable.sum() < 2:
        return out
    movable = _movable(cluster)
    total = _redistributable_total(loads, usable, movable)
    cap = loads.capacity[usable]
    mean = total / cap.sum(axis=0)
    fixed_assign = np.where(movable, -1, loads.assign)
    fixed = loads.loads(fixed_assign)[usable]
    floor = fixed / cap
    for i, name in enumerate(RESOURCES):
        out[name] = float(max(0.0, floor[:, i].max() - mean[i]))
    return out


def _redistributable_total(loads: LoadModel, usable: np.ndarray, movable: np.ndarray) -> np.ndarray:
    """(R,) the load the usable nodes share: theirs, plus what can leave unusable nodes."""
    total = loads.loads()[usable].sum(axis=0)
    leaving = movable & loads.active & (loads.assign >= 0)
    leaving &= ~usable[np.maximum(loads.assign, 0)]
    return total + loads.demand[leaving].sum(axis=0)


def _cover_count(sizes_desc: np.ndarray, amount: float) -> int:
    """Fewest items from ``sizes_desc`` (sorted descending) whose sum reaches ``amount``."""
    if amount <= 0:
        return 0
    csum = np.cumsum(sizes_desc)
    k = int(np.searchsorted(csum, amount * (1 - 1e-12), side="left")) + 1
    return min(k, len(sizes_desc)) if len(sizes_desc) else 0


def migration_lower_bound(
    cluster: Cluster,
    target_spread: Mapping[str, float] | Sequence[float] | float,
    loads: LoadModel | None = None,
) -> LowerBounds:
    """Bounds on the migrations and moved memory needed to bring every spread to ``target``."""
    loads = loads or LoadModel.build(cluster)
    if isinstance(target_spread, Mapping):
        target = np.array([float(target_spread.get(r, 0.0)) for r in RESOURCES])
    elif isinstance(target_spread, int | float):
        target = np.full(len(RESOURCES), float(target_spread))
    else:
        target = np.asarray(target_spread, dtype=float)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool) & np.all(
        loads.capacity > 0, axis=1
    )
    spread_lb = spread_lower_bound(cluster, loads)
    movable = _movable(cluster) & loads.active
    node_load = loads.loads()
    cap = loads.capacity
    n_nodes = len(cluster.nodes)
    if usable.sum() < 2:
        # No spread to speak of: only what must leave unusable nodes has to move.
        leaving = movable & (loads.assign >= 0) & ~usable[np.maximum(loads.assign, 0)]
        memory = loads.demand[leaving, RESOURCES.index("memory")].sum()
        return LowerBounds(
            spread=spread_lb,
            target_spread={r: float(target[i]) for i, r in enumerate(RESOURCES)},
            migrations=int(leaving.sum()),
            moved_bytes=int(memory) if loads.mode != "basic" else 0,
        )
    total = _redistributable_total(loads, usable, movable)
    usable_cap = cap[usable].sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(usable_cap > 0, total / np.where(usable_cap > 0, usable_cap, 1.0), 0.0)
    demand = loads.demand
    memory_col = RESOURCES.index("memory")
    out_count = 0
    out_bytes = 0.0
    in_need = np.zeros(len(RESOURCES))
    in_counts: list[int] = []
    all_movable = demand[movable]
    sorted_all = [np.sort(all_movable[:, r])[::-1] for r in range(len(RESOURCES))]
    for n in range(n_nodes):
        on_node = movable & (loads.assign == n)
        if not usable[n]:
            # Everything movable on an unusable node must leave.
            count = int(on_node.sum())
            out_count += count
            out_bytes += float(demand[on_node, memory_col].sum()) if loads.mode != "basic" else 0.0
            continue
        excess = node_load[n] - (mean + target) * cap[n]
        deficit = (mean - target) * cap[n] - node_load[n]
        k = 0
        for r in range(len(RESOURCES)):
            if excess[r] > 0:
                sizes = np.sort(demand[on_node, r])[::-1]
                need = _cover_count(sizes, excess[r])
                k = max(k, need if need else int(on_node.sum()))
        out_count += k
        if excess[memory_col] > 0 and loads.mode != "basic":
            out_bytes += float(excess[memory_col])
        k_in = 0
        for r in range(len(RESOURCES)):
            if deficit[r] > 0:
                k_in = max(k_in, _cover_count(sorted_all[r], deficit[r]))
                in_need[r] += deficit[r]
        in_counts.append(k_in)
    in_bytes = float(in_need[memory_col]) if loads.mode != "basic" else 0.0
    return LowerBounds(
        spread=spread_lb,
        target_spread={r: float(target[i]) for i, r in enumerate(RESOURCES)},
        migrations=int(max(out_count, sum(in_counts))),
        moved_bytes=int(max(out_bytes, in_bytes)),
    )


def lower_bounds(cluster: Cluster, target_spread: Mapping[str, float] | None = None) -> LowerBounds:
    """Both bounds; the migration bound for ``target_spread`` (default: the spread bound)."""
    loads = LoadModel.build(cluster)
    if target_spread is None:
        target_spread = spread_lower_bound(cluster, loads)
    return migration_lower_bound(cluster, target_spread, loads)
