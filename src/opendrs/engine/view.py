"""One decision's view of the cluster: what every stage reads, computed once.

The policy builds a :class:`CycleView` for each decision, the way a scheduler's cycle state
carries what one stage computed to the next: the observation balancing decides on, the usage the
capacity checks read, the balance loads, the hard constraints (masks with their reasons) and the
units (a guest, or a bundle kept together by hard affinity). The repair screen and the repair, the
maintenance return, the batch cut, the planner, the margin check and the explanation of a decision
that moves nothing read them here instead of rebuilding them from a :class:`Cluster`. Strategies
get the view too (``propose(view, request, options)``) and read its balance loads and its
constraints, with their request's forbidden placements refused
(:meth:`~opendrs.engine.constraints.Constraints.forbidding`): a strategy checks capacity on the
same usage the planner orders its plan on.

Two usages meet in one view, on purpose, and only two:

* ``cluster`` — measured usage averaged over the policy's smoothing window: what balancing sees,
  so that only a lasting imbalance is worth a migration;
* ``checked`` — the same guests and placement, each measured value at the higher of that average
  and its mean over the hold: what every hard capacity check sees (repairs found and made,
  strategies' proposals, plans ordered), so that a rise that lasts the hold counts at once.

Without smoothing (or without a recent usage) both are the same cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from opendrs.engine.constraints import Constraints, current_assign
from opendrs.engine.usage import LoadModel, usage_loads
from opendrs.model.cluster import Cluster

Placements = frozenset[tuple[str, str]]


class UsageSource(Protocol):
    """Where the usage capacity is checked on comes from: ``apply(cluster)`` returns the cluster
    with it (the policy's recent usage)."""

    def apply(self, cluster: Cluster) -> Cluster: ...


@dataclass(frozen=True, eq=False)
class CycleView:
    """What one decision reads; each part built on first use, then shared.

    ``recent`` gives the usage capacity is checked on (None: ``cluster``'s own); ``forbidden``
    holds the (guest, node) placements the policy's guards rule out for this decision. Pure: the
    same inputs give the same view.
    """

    cluster: Cluster
    recent: UsageSource | None = None
    forbidden: Placements = field(default_factory=frozenset)

    @cached_property
    def checked(self) -> Cluster:
        """``cluster`` with the usage capacity is checked on."""
        return self.recent.apply(self.cluster) if self.recent is not None else self.cluster

    @cached_property
    def loads(self) -> LoadModel:
        """The balance loads of ``cluster`` (its usage mode, its balance source)."""
        return LoadModel.build(self.cluster)

    @cached_property
    def usage_loads(self) -> LoadModel:
        """The loads of ``cluster`` in its usage mode, from measured usage even where pressure is
        balanced: what the capacity screens read."""
        return usage_loads(self.cluster, self.loads)

    @cached_property
    def constraints(self) -> Constraints:
        """The hard and soft constraints, capacity on ``checked``, nothing forbidden."""
        return Constraints.build(self.checked)

    @cached_property
    def assign(self) -> np.ndarray:
        """The node index of each guest now (``-1``: unknown); read-only."""
        out = current_assign(self.cluster)
        out.setflags(write=False)
        return out

    @classmethod
    def holding(
        cls,
        cluster: Cluster,
        *,
        constraints: Constraints | None = None,
        loads: LoadModel | None = None,
    ) -> CycleView:
        """A view of ``cluster`` that starts from models built already, for a strategy that asks
        another one on the view it was given: ``constraints`` (capacity on the usage the first
        view checks, nothing forbidden) and ``loads`` (``cluster``'s balance loads). What is not
        given is built on first use, from ``cluster``."""
        view = cls(cluster)
        if constraints is not None:
            view.__dict__["constraints"] = constraints
        if loads is not None:
            view.__dict__["loads"] = loads
        return view

    def guarding(self, recent: UsageSource | None, forbidden: Placements) -> CycleView:
        """This view with capacity checked on ``recent`` and ``forbidden`` ruled out; what was
        built from ``cluster`` alone is kept."""
        other = CycleView(self.cluster, recent, forbidden)
        for name in ("loads", "usage_loads", "assign"):
            if name in self.__dict__:
                other.__dict__[name] = self.__dict__[name]
        return other


__all__ = ["CycleView", "Placements", "UsageSource"]
