"""One decision's view of the cluster: what every stage reads, computed once.

The policy builds a :class:`CycleView` for each decision, the way a scheduler's cycle state
carries what one stage computed to the next: the observation, the usage balancing decides on,
the usage the capacity checks read, the balance loads, the hard constraints (masks with their
reasons) and the units (a guest, or a bundle kept together by hard affinity). The repair screen
and the repair, the maintenance return, the batch cut, the planner, the margin check and the
explanation of a decision that moves nothing read them here instead of rebuilding them from a
:class:`Cluster`. Strategies get the view too (``propose(view, request, options)``) and read its
balance loads and its constraints, with their request's forbidden placements refused
(:meth:`~opendrs.engine.constraints.Constraints.forbidding`): a strategy checks capacity on the
same usage the planner orders its plan on.

Measured usage reaches the view as arrays (:class:`MeasuredUsage`), which the policy's usage
window yields; the load models are built on them directly. Two usages meet in one view, on
purpose, and only two:

* ``average`` — measured usage averaged over the policy's smoothing window: what balancing sees
  (``loads``), so that only a lasting imbalance is worth a migration;
* ``recent`` — each measured value at the higher of that average and its mean over the hold:
  what every hard capacity check sees (``constraints``: repairs found and made, strategies'
  proposals, plans ordered), so that a rise that lasts the hold counts at once.

Without them (no smoothing, no recent usage) both are the observation's own. ``observed`` is the
cluster as observed — placement, rules, settings, and its own measured values; a strategy reads
it beside the view's models (``loads``, ``usage_loads``, ``constraints``), and a strategy that
figures load its own way from the guests' and nodes' measured values (ProxLB's percentages) reads
them as arrays, ``balancing_usage``. ``cluster`` and ``checked`` are the observation with each
usage written in, made only for what reads usage from a :class:`Cluster` rather than from the
view's models (a peer's emulation, the repair's strategy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from opendrs.engine.constraints import Constraints, RuleCheck, check_rules, current_assign
from opendrs.engine.usage import LoadModel, MeasuredUsage, usage_loads, with_usage
from opendrs.model.cluster import Cluster

Placements = frozenset[tuple[str, str]]


@dataclass(frozen=True, eq=False)
class CycleView:
    """What one decision reads; each part built on first use, then shared.

    ``observed`` is the observation; ``average`` the usage balancing reads and ``recent`` the
    usage capacity is checked on (None: the observation's own, and ``recent`` falls back to
    ``average``); ``forbidden`` holds the (guest, node) placements the policy's guards rule out
    for this decision; ``hot`` is the share of a node's capacity that measured usage may fill in
    the constraints (the policy's hot level; None: all of it). Pure: the same inputs give the
    same view. Raises ValueError when a usage was made for another cluster's guests or nodes.
    """

    observed: Cluster
    average: MeasuredUsage | None = None
    recent: MeasuredUsage | None = None
    forbidden: Placements = field(default_factory=frozenset)
    hot: float | None = None

    def __post_init__(self) -> None:
        for usage in (self.average, self.recent):
            if usage is not None:
                usage.check(self.observed)

    @property
    def checked_usage(self) -> MeasuredUsage | None:
        """The usage capacity is checked on (None: the observation's own)."""
        return self.recent if self.recent is not None else self.average

    @cached_property
    def cluster(self) -> Cluster:
        """``observed`` with the usage balancing reads."""
        if self.average is None:
            return self.observed
        return with_usage(self.observed, self.average)

    @cached_property
    def balancing_usage(self) -> MeasuredUsage:
        """The usage balancing reads, as arrays: ``average``, or the observation's own — what
        the balance loads are built on, for a strategy that models load its own way from the
        guests' and nodes' measured usage (a peer's figures)."""
        return self.average if self.average is not None else MeasuredUsage.of(self.observed)

    @cached_property
    def checked(self) -> Cluster:
        """``observed`` with the usage capacity is checked on."""
        if self.recent is None:
            return self.cluster
        return with_usage(self.observed, self.recent)

    @cached_property
    def loads(self) -> LoadModel:
        """The balance loads (the observation's usage mode and balance source, ``average``)."""
        return LoadModel.build(self.observed, usage=self.average)

    @cached_property
    def usage_loads(self) -> LoadModel:
        """The loads in the usage mode, from ``average`` even where pressure is balanced: what
        the capacity screens read."""
        return usage_loads(self.observed, self.loads, self.average)

    @cached_property
    def rule_check(self) -> RuleCheck:
        """The observation's rules kept and the problems of those dropped (:func:`check_rules`):
        checked once per decision, for every stage that reads the rules."""
        return check_rules(self.observed)

    @cached_property
    def constraints(self) -> Constraints:
        """The hard and soft constraints, capacity on ``checked_usage`` up to the ``hot`` level,
        nothing forbidden; on :attr:`rule_check`."""
        limit = 1.0 if self.hot is None else self.hot
        return Constraints.build(
            self.observed,
            usage=self.checked_usage,
            measured_limit=limit,
            rule_check=self.rule_check,
        )

    @cached_property
    def assign(self) -> np.ndarray:
        """The node index of each guest now (``-1``: unknown); read-only."""
        out = current_assign(self.observed)
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
            view.__dict__["rule_check"] = RuleCheck(constraints.rules, constraints.problems)
        if loads is not None:
            view.__dict__["loads"] = loads
        return view

    def with_rule_check(self, rule_check: RuleCheck | None) -> CycleView:
        """This view on ``rule_check``, :func:`check_rules` of its observation made already (a
        controller's, which warns of the rules dropped): the rules are not checked again. None:
        the view as it is."""
        if rule_check is not None:
            self.__dict__.setdefault("rule_check", rule_check)
        return self

    def guarding(self, recent: MeasuredUsage | None, forbidden: Placements) -> CycleView:
        """This view with capacity checked on ``recent`` and ``forbidden`` ruled out; what was
        built from the observation and ``average`` alone is kept."""
        return self._sharing(CycleView(self.observed, self.average, recent, forbidden, self.hot))

    def without_hot(self) -> CycleView:
        """This view with no hot level: measured usage may fill each node's capacity."""
        return self._sharing(
            CycleView(self.observed, self.average, self.recent, self.forbidden, None)
        )

    def _sharing(self, other: CycleView) -> CycleView:
        """``other`` (of the same observation and ``average``) with what this view built from
        them alone."""
        for name in ("cluster", "balancing_usage", "loads", "usage_loads", "assign", "rule_check"):
            if name in self.__dict__:
                other.__dict__[name] = self.__dict__[name]
        return other


__all__ = ["CycleView", "Placements"]
