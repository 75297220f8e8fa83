"""New guests placed on one observation of a cluster (the daemon's ``POST /api/place``).

What does not depend on the new guest — the rule check, the constraint set, the balance loads,
the capacity committed per node — is built once per observation (:meth:`ObservedPlacement.build`);
each new guest then adds its own rows, and those of the guests it would move with (a hard
affinity), and has the nodes scored. Only those rows are read by its placement: the other
guests' rows are kept as they are, even where the rules it joins (or the rules the check then
drops) would change them. The answer is :func:`~opendrs.engine.placement.place_new`'s, to the
bit. Where a node-affinity rule names the new guest or one it would move with (their rows hang
on every other guest's claims), everything is built again, as ``place_new`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from opendrs.model.cluster import Cluster, Guest
from opendrs.model.rules import Rules

from .constraints import Constraints
from .constraints.rule_checks import RuleCheck, check_rules, positive_components
from .distinct import distinct
from .placement import Placement, PlacementState, newcomer, place_new
from .sparse_rows import appended
from .usage import CapacityModel, LoadModel, loaded_nodes

__all__ = ["ObservedPlacement"]

#: Per (positive, hard) kind of rule: the partner rows of the guests that move with the new one.
PartnerRows = dict[tuple[bool, bool], dict[int, np.ndarray]]


@dataclass(frozen=True)
class ObservedPlacement:
    """One observation of a cluster, ready to place new guests on. Read-only once built: any
    number of threads may :meth:`place` at once."""

    cluster: Cluster
    #: :func:`check_rules` of the cluster's own rules.
    check: RuleCheck
    #: The cluster's placement as it is (never changed: each new guest gets a grown copy).
    state: PlacementState
    #: Every guest id a node-affinity rule of the cluster names (kept by the check or not).
    pinned: frozenset[str]

    @classmethod
    def build(cls, cluster: Cluster) -> ObservedPlacement:
        check = check_rules(cluster)
        state = PlacementState.build(cluster, Constraints.build(cluster, rule_check=check))
        pinned = frozenset(g for r in cluster.rules.node_affinity for g in r.guests)
        return cls(cluster, check, state, pinned)

    def place(self, rules: Rules, guest: Guest) -> Placement:
        """``place_new(replace(self.cluster, rules=rules), guest)``, where ``rules`` are the
        cluster's own with the new guest (by its fresh id) added to some and rules of its own
        (those of a request): the same node-affinity rules."""
        added = newcomer(self.cluster, guest)
        ruled = replace(self.cluster, rules=rules)
        state = None
        if rules.node_affinity == self.cluster.rules.node_affinity:
            check = self.check if rules == self.cluster.rules else check_rules(ruled)
            state = self._grown(check, added)
        if state is None:
            return place_new(ruled, guest)
        return state.place(len(self.cluster.guests), "new")

    def _grown(self, check: RuleCheck, added: Guest) -> PlacementState | None:
        """:meth:`state` with guest ``added`` (on no node) appended, its rows and those of its
        bundle (the guests it moves with under ``check``'s rules) as ``PlacementState.build``
        of the grown cluster gives them. None when a node-affinity rule names one of them, or
        its capacity dimensions are not the cluster's."""
        base, cons = self.state, self.state.constraints
        cluster = replace(self.cluster, rules=check.rules, guests=(*self.cluster.guests, added))
        new = np.array([len(self.cluster.guests)], dtype=np.intp)
        bundle, rows = new, _alone(len(self.cluster.guests))
        if any(added.id in r.guests for r in check.rules.guest_affinity):
            index = {**self.cluster.guest_index, added.id: len(self.cluster.guests)}
            units = _units(check.rules, index)
            bundle = next((u for u in units if u[-1] == new[0]), new)  # the new guest is last
            rows = _partner_rows(check.rules, index, bundle, units)
        if any(cluster.guests[j].id in self.pinned for j in bundle.tolist()):
            return None
        alone = replace(cluster, guests=(added,))
        capacity = _with_demand(cons.capacity, CapacityModel.build(alone))
        if capacity is None:
            return None
        alone_loads = LoadModel.build(alone)
        loads = replace(
            base.loads,
            demand=np.vstack([base.loads.demand, alone_loads.demand]),
            assign=np.concatenate([base.loads.assign, alone_loads.assign]),
            active=np.concatenate([base.loads.active, alone_loads.active]),
        )
        return PlacementState(
            constraints=self._grown_constraints(check, cluster, capacity, bundle, rows),
            loads=loads,
            assign=appended(base.assign, -1),
            node_load=base.node_load.copy(),
            committed=base.committed.copy(),
            running=appended(base.running, bool(loaded_nodes(added))),
            weights=base.weights,
            counted=appended(base.counted, False),
        )

    def _grown_constraints(
        self,
        check: RuleCheck,
        cluster: Cluster,
        capacity: CapacityModel,
        bundle: np.ndarray,
        rows: PartnerRows,
    ) -> Constraints:
        """The constraint set with the new guest (the last of ``cluster``) appended: rows that
        hold everywhere but its architecture's, its ``bundle``'s partner ``rows`` and group."""
        cons = self.state.constraints
        everywhere = np.ones(len(cluster.nodes), dtype=bool)
        arch = np.array([n.arch == cluster.guest_arch(cluster.guests[-1]) for n in cluster.nodes])
        group_of = appended(cons.group_of, -1)
        groups = cons.groups
        if len(bundle) > 1:
            groups = [*groups, bundle]
            group_of[bundle] = len(groups) - 1
        return replace(
            cons,
            cluster=cluster,
            rules=check.rules,
            problems=check.problems,
            capacity=capacity,
            arch_ok=cons.arch_ok.with_row(arch.astype(bool)),
            limits_ok=cons.limits_ok.with_row(everywhere),
            strict_ok=cons.strict_ok.with_row(everywhere),
            preferred=cons.preferred.with_row(everywhere),
            permitted=cons.permitted.with_row(everywhere),
            hard_neg=cons.hard_neg.with_rows(rows[False, True]),
            hard_pos=cons.hard_pos.with_rows(rows[True, True]),
            soft_neg=cons.soft_neg.with_rows(rows[False, False]),
            soft_pos=cons.soft_pos.with_rows(rows[True, False]),
            groups=groups,
            group_of=group_of,
            tier=appended(cons.tier, -1),
            claimed=appended(cons.claimed, -1),
        )


def _alone(new: int) -> PartnerRows:
    """The partner rows of the new guest (index ``new``) when no rule names it: none."""
    return {(p, h): {new: np.zeros(0, dtype=np.intp)} for p in (True, False) for h in (True, False)}


def _units(kept: Rules, index: dict[str, int]) -> list[np.ndarray]:
    """The ``kept`` hard-affinity groups of two or more guests (of ``index``), as sorted
    indices."""
    positive = [r for r in kept.guest_affinity if r.positive and r.hard]
    units = []
    for _rules, members in positive_components(positive):
        idx = np.array(sorted(index[g] for g in members if g in index), dtype=np.intp)
        if len(idx) >= 2:
            units.append(idx)
    return units


def _partner_rows(
    kept: Rules, index: dict[str, int], bundle: np.ndarray, units: list[np.ndarray]
) -> PartnerRows:
    """Per kind of rule, the partner row of each guest of ``bundle`` under the ``kept`` rules,
    as :meth:`Constraints.build` gives it: its hard-affinity group; every guest of each unit
    (``units``, or a guest alone) a hard anti-affinity rule keeps the bundle apart from
    (:func:`~.constraints.masks.hard_negatives`); the partners of its soft rules."""
    inside = set(bundle.tolist())
    unit_of = {j: unit for unit in units for j in unit.tolist()}
    apart: list[int] = []
    soft: dict[tuple[bool, int], list[int]] = {(p, j): [] for p in (True, False) for j in inside}
    for rule in kept.guest_affinity:
        members = [index[g] for g in rule.guests if g in index]
        ours = [j for j in members if j in inside]
        if not ours or (rule.positive and rule.hard):
            continue
        if rule.hard:
            for x in members:
                if x not in inside:
                    apart += unit_of[x].tolist() if x in unit_of else [x]
            continue
        for j in ours:
            soft[rule.positive, j] += members
    kept_apart = distinct(np.array(apart, dtype=np.intp))
    rows: PartnerRows = {(p, h): {} for p in (True, False) for h in (True, False)}
    for j in bundle.tolist():
        rows[False, True][j] = kept_apart
        rows[True, True][j] = bundle[bundle != j]
        for positive in (True, False):
            found = np.array(soft[positive, j], dtype=np.intp)
            rows[positive, False][j] = distinct(found[found != j])
    return rows


def _with_demand(capacity: CapacityModel, alone: CapacityModel) -> CapacityModel | None:
    """``capacity`` with the one guest of ``alone`` appended to its demand; None when that
    guest has a dimension ``capacity`` lacks."""
    column = {dim: d for d, dim in enumerate(capacity.dimensions)}
    if any(dim not in column for dim in alone.dimensions):
        return None
    demand = np.zeros((1, len(capacity.dimensions)))
    moving = np.zeros((1, len(capacity.dimensions)))
    for d, dim in enumerate(alone.dimensions):
        demand[0, column[dim]], moving[0, column[dim]] = alone.demand[0, d], alone.moving[0, d]
    grown = np.vstack([capacity.moving, moving])
    grown.setflags(write=False)
    return replace(capacity, demand=np.vstack([capacity.demand, demand]), moving=grown)
