"""New guests placed on one observation of a cluster (the daemon's ``POST /api/place``).

What does not depend on the new guest — the rule check, the constraint set, the balance loads,
the capacity committed per node — is built once per observation (:meth:`ObservedPlacement.build`);
each new guest then only adds its own row to them and has the nodes scored. The answer is
:func:`~opendrs.engine.placement.place_new`'s, to the bit. Where existing guests' rows would
change too — the new guest joins a hard affinity (guests that would move with it), a rule of
the cluster already names its id, or the rules it joins change which rules the check keeps —
everything is built again, as ``place_new`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from opendrs.model.cluster import Cluster, Guest
from opendrs.model.rules import Rules

from .constraints import Constraints
from .constraints.rule_checks import RuleCheck, check_rules
from .distinct import distinct
from .placement import Placement, PlacementState, newcomer, place_new
from .sparse_rows import appended
from .usage import CapacityModel, LoadModel, loaded_nodes

__all__ = ["ObservedPlacement"]


@dataclass(frozen=True)
class ObservedPlacement:
    """One observation of a cluster, ready to place new guests on. Read-only once built: any
    number of threads may :meth:`place` at once."""

    cluster: Cluster
    #: :func:`check_rules` of the cluster's own rules.
    check: RuleCheck
    #: The cluster's placement as it is (never changed: each new guest gets a grown copy).
    state: PlacementState
    #: Every guest id a rule of the cluster names (a new guest with one of them is built again).
    named: frozenset[str]

    @classmethod
    def build(cls, cluster: Cluster) -> ObservedPlacement:
        check = check_rules(cluster)
        state = PlacementState.build(cluster, Constraints.build(cluster, rule_check=check))
        rules = (*cluster.rules.node_affinity, *cluster.rules.guest_affinity)
        return cls(cluster, check, state, frozenset(g for r in rules for g in r.guests))

    def place(self, rules: Rules, guest: Guest) -> Placement:
        """``place_new(replace(self.cluster, rules=rules), guest)``, where ``rules`` are the
        cluster's own with the new guest (by its fresh id) added to some and rules of its own
        (those of a request)."""
        added = newcomer(self.cluster, guest)
        ruled = replace(self.cluster, rules=rules)
        check = self._kept(ruled, added.id)
        state = self._grown(check, added) if check is not None else None
        if state is None:
            return place_new(ruled, guest)
        return state.place(len(self.cluster.guests), "new")

    def _kept(self, ruled: Cluster, gid: str) -> RuleCheck | None:
        """The rule check of ``ruled`` when it keeps what the cluster's own check keeps (and
        the rules only ``ruled`` has), and ``gid`` is in no hard affinity; else None."""
        own, rules = self.cluster.rules, ruled.rules
        if gid in self.named or rules.node_affinity != own.node_affinity:
            return None
        if rules == own:
            return self.check
        check = check_rules(ruled)
        added = {r.name for r in rules.guest_affinity} - {r.name for r in own.guest_affinity}
        was = {r.name for r in self.check.rules.guest_affinity} | added
        if {r.name for r in check.rules.guest_affinity} != was:
            return None
        if check.rules.node_affinity != self.check.rules.node_affinity:
            return None
        if any(gid in r.guests for r in check.rules.guest_affinity if r.positive and r.hard):
            return None
        return check

    def _grown(self, check: RuleCheck, added: Guest) -> PlacementState | None:
        """:meth:`state` with guest ``added`` (on no node) appended, its rows as
        ``PlacementState.build`` of the grown cluster gives them; the other guests' partner
        rows do not name it (only its own placement reads this state). None when its capacity
        dimensions are not the cluster's."""
        base, cons = self.state, self.state.constraints
        cluster = replace(self.cluster, rules=check.rules, guests=(*self.cluster.guests, added))
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
        everywhere = np.ones(len(cluster.nodes), dtype=bool)
        arch = np.array([n.arch == cluster.guest_arch(added) for n in cluster.nodes], dtype=bool)
        partners = self._partners(check.rules, added.id)
        grown = replace(
            cons,
            cluster=cluster,
            rules=check.rules,
            problems=check.problems,
            capacity=capacity,
            arch_ok=cons.arch_ok.with_row(arch),
            limits_ok=cons.limits_ok.with_row(everywhere),
            strict_ok=cons.strict_ok.with_row(everywhere),
            preferred=cons.preferred.with_row(everywhere),
            permitted=cons.permitted.with_row(everywhere),
            hard_neg=cons.hard_neg.with_row(partners[False, True]),
            hard_pos=cons.hard_pos.with_row(partners[True, True]),
            soft_neg=cons.soft_neg.with_row(partners[False, False]),
            soft_pos=cons.soft_pos.with_row(partners[True, False]),
            group_of=appended(cons.group_of, -1),
            tier=appended(cons.tier, -1),
            claimed=appended(cons.claimed, -1),
        )
        return PlacementState(
            constraints=grown,
            loads=loads,
            assign=appended(base.assign, -1),
            node_load=base.node_load.copy(),
            committed=base.committed.copy(),
            running=appended(base.running, bool(loaded_nodes(added))),
            weights=base.weights,
            counted=appended(base.counted, False),
        )

    def _partners(self, kept: Rules, gid: str) -> dict[tuple[bool, bool], np.ndarray]:
        """Per (positive, hard): the sorted indices of the new guest ``gid``'s partners in the
        ``kept`` rules of that kind; a hard negative partner kept with others brings them all
        (:func:`~.constraints.masks.hard_negatives`)."""
        index = self.cluster.guest_index
        found: dict[tuple[bool, bool], list[int]] = {
            (p, h): [] for p in (True, False) for h in (True, False)
        }
        for rule in kept.guest_affinity:
            if gid in rule.guests:
                found[rule.positive, rule.hard] += [index[g] for g in rule.guests if g in index]
        cons = self.state.constraints
        units = [cons.unit_members(j) for j in found[False, True]]
        found[False, True] = np.concatenate(units).tolist() if units else []
        return {kind: distinct(np.array(found[kind], dtype=np.intp)) for kind in found}


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
