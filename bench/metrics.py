"""Evaluate any placement — opendrs's or a peer's — with the same opendrs code.

A result is a placement (guest id → node, for the guests that move). It is applied to the cluster
with :meth:`Cluster.with_placement` and measured with :func:`cluster_imbalance` (the cluster's usage
mode; ``static`` — configured sizes — for the generated clusters), :func:`migration_cost` and
:meth:`Constraints.violations` (hard rules and capacity, checked on the final placement).

Lower bounds come from :mod:`opendrs.engine.bounds` when it is importable; the migration bounds are
taken for the spreads the result itself reaches (per resource), so "migrations / bound" says how
many more migrations than necessary a result spent on the balance it got.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from opendrs.engine.constraints import Constraints
from opendrs.engine.strategies import cluster_imbalance, migration_cost
from opendrs.model.cluster import Cluster

GiB = 1024**3


@dataclass(frozen=True)
class Snapshot:
    """Balance figures of one placement."""

    memory_spread: float
    cpu_spread: float
    cv: float

    @classmethod
    def of(cls, cluster: Cluster, assign: np.ndarray | None = None) -> Snapshot:
        im = cluster_imbalance(cluster, assign)
        return cls(
            memory_spread=im.resources["memory"].spread,
            cpu_spread=im.resources["cpu"].spread,
            cv=im.combined.cv,
        )


@dataclass(frozen=True)
class Evaluation:
    """A result measured by opendrs."""

    after: Snapshot
    migrations: int
    cost: int
    moved_bytes: int
    violations: tuple[str, ...]
    #: Lower bounds on migrations and moved bytes for the spreads this result reaches (or None).
    lb_migrations: int | None = None
    lb_moved_bytes: int | None = None
    #: Bytes of local disk the moves copy.
    moved_disk_bytes: int = 0
    #: What the cluster's cost counts a GiB of local disk as (its ``cost_disk_factor``).
    disk_factor: float = 4.0

    @property
    def moved_gib(self) -> float:
        return self.moved_bytes / GiB

    @property
    def cost_gib(self) -> float:
        """The moves' cost in GiB: their memory plus the factor × their local disks."""
        return (self.moved_bytes + self.disk_factor * self.moved_disk_bytes) / GiB


class Evaluator:
    """Evaluates placements on one cluster (constraints and bounds built once)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.constraints = Constraints.build(cluster)
        self.before = Snapshot.of(cluster)
        self._bounds = load_bounds()
        self.lb_spread: float | None = None
        if self._bounds is not None:
            spread = _memory(self._bounds(self.cluster).spread)
            self.lb_spread = spread

    @property
    def bounds_available(self) -> bool:
        return self._bounds is not None

    def assign(self, placement: Mapping[str, str]) -> np.ndarray:
        """Node index of every guest after ``placement``; ValueError on unknown guests or nodes."""
        cluster = self.cluster
        assign = np.array([cluster.node_index.get(g.node, -1) for g in cluster.guests])
        for guest, node in placement.items():
            j = cluster.guest_index.get(guest)
            n = cluster.node_index.get(node)
            if j is None:
                raise ValueError(f"unknown guest {guest!r} in placement")
            if n is None:
                raise ValueError(f"unknown node {node!r} in placement (guest {guest})")
            assign[j] = n
        return assign.astype(np.intp)

    def evaluate(self, placement: Mapping[str, str]) -> Evaluation:
        """Apply ``placement`` and measure it."""
        cluster = self.cluster
        assign = self.assign(placement)
        moved = [g for g in cluster.guests if g.id in placement and placement[g.id] != g.node]
        after_cluster = cluster.with_placement({g.id: placement[g.id] for g in moved})
        after = Snapshot.of(after_cluster)
        lb_migrations = lb_moved = None
        if self._bounds is not None:
            bounds = self._bounds(cluster, {"memory": after.memory_spread, "cpu": after.cpu_spread})
            lb_migrations, lb_moved = int(bounds.migrations), int(bounds.moved_bytes)
        return Evaluation(
            after=after,
            migrations=len(moved),
            cost=sum(migration_cost(g, cluster.settings) for g in moved),
            moved_bytes=sum(g.memory for g in moved),
            violations=tuple(self.constraints.violations(assign)),
            lb_migrations=lb_migrations,
            lb_moved_bytes=lb_moved,
            moved_disk_bytes=sum(g.local_disk_bytes for g in moved),
            disk_factor=float(cluster.settings.cost_disk_factor),
        )


def _memory(spread: Any) -> float:
    """The memory figure of a bound that is per resource (mapping) or a single number."""
    if isinstance(spread, Mapping):
        return float(spread["memory"])
    return float(spread)


BoundsFn = Callable[..., Any]


def load_bounds() -> BoundsFn | None:
    """``opendrs.engine.bounds.lower_bounds`` when it exists, wrapped to take a target spread.

    The returned callable takes ``(cluster, target_spread=None)``; when ``lower_bounds`` does not
    accept a target spread, the target is ignored (bounds for the best spread).
    """
    try:
        from opendrs.engine.bounds import lower_bounds
    except ImportError:
        return None
    takes_target = "target_spread" in inspect.signature(lower_bounds).parameters

    def bounds(cluster: Cluster, target_spread: Mapping[str, float] | None = None) -> Any:
        if takes_target and target_spread is not None:
            return lower_bounds(cluster, target_spread=target_spread)
        return lower_bounds(cluster)

    return bounds


__all__ = ["Evaluation", "Evaluator", "GiB", "Snapshot", "load_bounds"]
