"""The constraint set of a cluster (:class:`Constraints`): its masks and partner lists, the
hard filters a placement is tested against with the :class:`~.rejection.Rejection` of each node
refused, soft rules as penalties (:data:`SOFT_PENALTY` each), the rules a whole placement breaks,
and the capacity it commits (:func:`committed_for`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from opendrs.engine.distinct import distinct
from opendrs.model.cluster import Cluster
from opendrs.model.rules import Rules

from ..sparse_rows import Partners, RowMask
from ..usage import CapacityModel, MeasuredUsage, loaded_nodes, tolerance
from .masks import (
    arch_mask,
    hard_affinity_groups,
    hard_negatives,
    limits_mask,
    permitted_mask,
    rule_pairs,
)
from .node_affinity import affinity_tiers, binding, node_affinity_masks
from .rejection import Rejection, RejectionCode, Shortfall
from .rule_checks import RuleCheck, RuleProblem, check_rules

#: Penalty added to a placement score for each broken soft rule.
SOFT_PENALTY = 1.0


@dataclass
class Constraints:
    """Hard and soft constraints of one cluster, as arrays, ready to test placements."""

    cluster: Cluster
    rules: Rules
    problems: list[RuleProblem]
    capacity: CapacityModel
    #: (N,) nodes that may receive guests.
    usable: np.ndarray
    #: (G, N) architecture matches. The guests × nodes masks are stored by distinct row
    #: (:class:`RowMask`): most guests have the same row, that no rule touches.
    arch_ok: RowMask
    #: (G, N) the platform can move the guest there (its :attr:`Guest.limits`).
    limits_ok: RowMask
    #: (G, N) strict node affinity allows, within the platform's limits.
    strict_ok: RowMask
    #: (G, N) non-strict node affinity prefers (True where no preference applies).
    preferred: RowMask
    #: (G, N) False where a placement is forbidden (a plan could not be ordered safely with it).
    permitted: RowMask
    #: Per guest: sorted indices of hard negative partners (group members' partners included).
    hard_neg: Partners
    #: Per guest: sorted indices of hard positive partners (its merged group, itself excluded).
    hard_pos: Partners
    soft_neg: Partners
    soft_pos: Partners
    #: Hard positive groups (each a sorted array of guest indices), bundles that move together.
    groups: list[np.ndarray] = field(default_factory=list)
    #: guest index -> its group index, or -1.
    group_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    #: (G,) the node-affinity priority each guest uses (see :func:`affinity_tiers`), or -1.
    tier: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: (G,) the node each guest claimed when its tier was chosen, or -1.
    claimed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))

    @classmethod
    def build(
        cls,
        cluster: Cluster,
        forbidden: Iterable[tuple[str, str]] = (),
        usage: MeasuredUsage | None = None,
        measured_limit: float = 1.0,
        rule_check: RuleCheck | None = None,
    ) -> Constraints:
        """The constraints of ``cluster``; ``forbidden``: (guest, node) placements to refuse;
        ``usage``: the measured usage capacity is checked on (default: the cluster's own), up to
        ``measured_limit`` of each node's capacity (the policy's hot level, or all of it);
        ``rule_check``: :func:`check_rules` of ``cluster``, when the caller has it already
        (a cycle view's), else computed here."""
        rules, problems = rule_check if rule_check is not None else check_rules(cluster)
        cluster_r = replace_rules(cluster, rules)
        n_guests = len(cluster.guests)
        usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
        arch_ok = arch_mask(cluster)
        capacity = CapacityModel.build(cluster, usage, measured_limit)
        tier, claimed = affinity_tiers(cluster, rules, capacity, arch_ok)
        strict_ok, preferred = node_affinity_masks(cluster, rules, tier, usable)
        limits_ok = limits_mask(cluster)
        if len(limits_ok.table) > 1:
            # Every stage that reads strict node affinity keeps to the platform's limits too.
            strict_ok = RowMask.combine([strict_ok, limits_ok], np.ones(len(usable), dtype=bool))
        groups, group_of = hard_affinity_groups(cluster, rules)
        return cls(
            cluster=cluster_r,
            rules=rules,
            problems=problems,
            capacity=capacity,
            usable=usable,
            arch_ok=arch_ok,
            limits_ok=limits_ok,
            strict_ok=strict_ok,
            preferred=preferred,
            permitted=permitted_mask(cluster, forbidden),
            hard_neg=hard_negatives(cluster, rules, groups, group_of),
            hard_pos=Partners.within(n_guests, groups),
            soft_neg=Partners.from_pairs(n_guests, *rule_pairs(cluster, rules, False, False)),
            soft_pos=Partners.from_pairs(n_guests, *rule_pairs(cluster, rules, True, False)),
            groups=groups,
            group_of=group_of,
            tier=tier,
            claimed=claimed,
        )

    def unit_of(self, j: int) -> int:
        """The unit guest ``j`` moves in: its hard-affinity bundle's index (≥ 0), or ``-1 - j``
        for a guest that moves alone. The one definition of a unit every stage groups by."""
        group = int(self.group_of[j]) if len(self.group_of) else -1
        return group if group >= 0 else -1 - j

    def unit_members(self, j: int) -> np.ndarray:
        """Guest ``j`` and its hard-affinity partners: the guests that move together."""
        unit = self.unit_of(j)
        return self.groups[unit] if unit >= 0 else np.array([j], dtype=np.intp)

    def forbidding(self, forbidden: Iterable[tuple[str, str]]) -> Constraints:
        """These constraints with the (guest, node) placements ``forbidden`` refused as well:
        what :meth:`build` with ``forbidden`` gives, without building the rest again."""
        gidx, nidx = self.cluster.guest_index, self.cluster.node_index
        pairs = [(gidx.get(g), nidx.get(n)) for g, n in forbidden]
        known = [(j, n) for j, n in pairs if j is not None and n is not None]
        if not known:
            return self
        rows, cols = (np.array(c, dtype=np.intp) for c in zip(*known, strict=True))
        named = distinct(rows)
        # The guests named get rows of their own: their rows now, without the new placements.
        index = self.permitted.index.copy()
        own = self.permitted.table[index[named]].copy()
        own[np.searchsorted(named, rows), cols] = False
        index[named] = len(self.permitted.table) + np.arange(len(named))
        permitted = RowMask.build(index, np.vstack([self.permitted.table, own]))
        return replace(self, permitted=permitted)

    # ----------------------------------------------------------------------------------------

    def static_ok(self) -> RowMask:
        """(G, N): usable node, architecture, strict node affinity, not forbidden."""
        return RowMask.combine([self.arch_ok, self.strict_ok, self.permitted], self.usable)

    def kept_in_place(self, j: int) -> bool:
        """Whether the hard rules keep guest ``j`` on the node it is on: its own static filters
        (usable node, architecture, strict node affinity within the platform's limits — a pin, a
        strict node affinity to this node alone) allow it no other node, or those of a
        hard-affinity partner on the same node do (the bundle moves together or not at all)."""
        guests = self.cluster.guests
        node = guests[j].node
        return any(
            guests[m].node == node and not self._elsewhere(m) for m in self.unit_members(j).tolist()
        )

    def _elsewhere(self, j: int) -> bool:
        """Whether the static filters but ``permitted`` allow guest ``j`` a node besides its own."""
        allowed = self.usable & self.arch_ok[j] & self.strict_ok[j]
        here = self.cluster.node_index.get(self.cluster.guests[j].node)
        if here is not None:
            allowed[here] = False
        return bool(allowed.any())

    def guest_demand(self, j: int) -> np.ndarray:
        """Capacity demand (D,) guest ``j`` brings to a new node (storage only if not running)."""
        return self.capacity.moving[j].copy()

    def occupied(self, assign: np.ndarray, guests: np.ndarray) -> np.ndarray:
        """(N,) bool: nodes where any of ``guests`` sits (under ``assign``) or is migrating to."""
        out = np.zeros(len(self.cluster.nodes), dtype=bool)
        if guests.size:
            where = assign[guests]
            out[where[where >= 0]] = True
            for g in guests.tolist():
                target = self.cluster.guests[g].migrating_to
                if target is not None and assign[g] == self.cluster.node_index.get(
                    self.cluster.guests[g].node, -1
                ):
                    t = self.cluster.node_index.get(target)
                    if t is not None:
                        out[t] = True
        return out

    def hard_masks(
        self, j: int, assign: np.ndarray, headroom: np.ndarray, demand: np.ndarray | None = None
    ) -> list[tuple[RejectionCode, np.ndarray]]:
        """The hard filters for guest ``j`` as (N,) masks with their codes, in reporting order.

        ``assign`` places the other guests; ``headroom`` (N, D) is the free capacity with guest
        ``j`` *not* counted on any node; ``demand`` overrides the guest's demand (bundles).
        """
        nodes = self.cluster.nodes
        online = np.array([n.online for n in nodes], dtype=bool)
        not_maint = np.array([not n.maintenance for n in nodes], dtype=bool)
        demand = self.guest_demand(j) if demand is None else demand
        masks = [
            (RejectionCode.OFFLINE, online),
            (RejectionCode.MAINTENANCE, not_maint),
            (RejectionCode.ARCH, self.arch_ok[j]),
            (RejectionCode.PLATFORM, self.limits_ok[j]),
            (RejectionCode.NODE_AFFINITY, self.strict_ok[j]),
            (RejectionCode.FORBIDDEN, self.permitted[j]),
            (RejectionCode.ANTI_AFFINITY, ~self.occupied(assign, self.hard_neg[j])),
        ]
        pos = self.hard_pos[j]
        if pos.size:
            where = assign[pos]
            where = where[where >= 0]
            if where.size:
                counts = np.bincount(where, minlength=len(nodes))
                masks.append((RejectionCode.AFFINITY, counts == counts.max()))
        fits = np.all(demand[None, :] <= headroom + tolerance(self.capacity.limit), axis=1)
        masks.append((RejectionCode.CAPACITY, fits))
        return masks

    def allowed(
        self, j: int, assign: np.ndarray, headroom: np.ndarray, demand: np.ndarray | None = None
    ) -> np.ndarray:
        """(N,) nodes that pass every hard filter for guest ``j``."""
        ok = np.ones(len(self.cluster.nodes), dtype=bool)
        for _name, mask in self.hard_masks(j, assign, headroom, demand):
            ok &= mask
        return ok

    def rejection(
        self,
        code: RejectionCode,
        j: int,
        n: int,
        assign: np.ndarray,
        headroom: np.ndarray,
        demand: np.ndarray,
    ) -> Rejection:
        """Hard filter ``code`` rejecting node ``n`` for guest ``j``, with its facts."""
        node = self.cluster.nodes[n]
        guest = self.cluster.guests[j]
        if code is RejectionCode.CAPACITY:
            limit = tolerance(self.capacity.limit)[n]
            room = headroom[n]
            short = tuple(
                Shortfall(dim, float(demand[d]), float(max(room[d], 0)))
                for d, dim in enumerate(self.capacity.dimensions)
                if demand[d] > room[d] + limit[d]
            )
            return Rejection(code, node.name, shortfalls=short)
        detail = ""
        if code is RejectionCode.ARCH:
            detail = f"architecture {node.arch}, guest needs {self.cluster.guest_arch(guest)}"
        elif code is RejectionCode.PLATFORM:
            detail = next(
                (lim.reason for lim in guest.limits if node.name not in lim.nodes),
                "the platform cannot move it there",
            )
        elif code is RejectionCode.NODE_AFFINITY:
            detail = self._explain_node_affinity(j, n)
        elif code is RejectionCode.ANTI_AFFINITY:
            partners = [
                self.cluster.guests[p].label for p in self.hard_neg[j].tolist() if assign[p] == n
            ]
            if not partners:
                partners = [self.cluster.guests[p].label for p in self.hard_neg[j].tolist()]
            detail = "hard anti-affinity with " + ", ".join(partners)
        return Rejection(code, node.name, detail)

    def _explain_node_affinity(self, j: int, n: int) -> str:
        """Why guest ``j``'s strict node affinity (or its failback) rules out node ``n`` (a
        usable node)."""
        guest = self.cluster.guests[j]
        rules = [r for r in self.rules.node_rules_for(guest.id) if binding(r, guest)]
        node = self.cluster.nodes[n].name
        priority = rules[0].nodes.get(node) if len(rules) == 1 else None
        tier = int(self.tier[j]) if len(self.tier) else -1
        if rules and not any(r.strict for r in rules):
            usable = {x.name for x, ok in zip(self.cluster.nodes, self.usable, strict=True) if ok}
            top = sorted(m for m, p in rules[0].nodes.items() if p == tier and m in usable)
            where = f"priority {priority}" if priority is not None else "not one of its nodes"
            return (
                f"HA failback ({rules[0].name}): {where}, while the HA manager moves it back to "
                f"its priority {tier} nodes ({', '.join(top)}); set failback 0 on the HA "
                "resource to let it stay elsewhere"
            )
        head = f"strict node affinity ({', '.join(r.name for r in rules)})"
        if priority is None:
            return head
        if tier < 0:
            return f"{head}: none of its nodes is usable"
        if priority < tier:
            return f"{head}: priority {priority}, while priority {tier} can take it"
        partners = [
            self.cluster.guests[p].label for p in self.hard_neg[j].tolist() if self.claimed[p] == n
        ]
        if partners:
            why = f"holds its hard anti-affinity partner {', '.join(partners)}"
        else:
            why = "has no room for it"
        return f"{head}: priority {priority} {why}, priority {tier} is used"

    def soft_penalty(self, j: int, assign: np.ndarray) -> np.ndarray:
        """(N,) penalty of putting guest ``j`` on each node: broken soft rules × SOFT_PENALTY."""
        penalty = np.where(self.preferred[j], 0.0, SOFT_PENALTY)
        if self.soft_neg[j].size:
            penalty = penalty + SOFT_PENALTY * self._count_on(assign, self.soft_neg[j])
        if self.soft_pos[j].size:
            counts = self._count_on(assign, self.soft_pos[j])
            penalty = penalty + SOFT_PENALTY * (self.soft_pos[j].size - counts)
        return penalty

    def _count_on(self, assign: np.ndarray, guests: np.ndarray) -> np.ndarray:
        where = assign[guests]
        where = where[where >= 0]
        return np.bincount(where, minlength=len(self.cluster.nodes)).astype(np.float64)

    def violations(self, assign: np.ndarray) -> list[str]:
        """Hard rules broken by a full placement ``assign`` (capacity included), as sentences."""
        cluster = self.cluster
        names = [n.name for n in cluster.nodes]
        ids = [g.id for g in cluster.guests]
        placed = assign >= 0
        problems = [f"guest {ids[j]} has no node" for j in np.flatnonzero(~placed).tolist()]
        moved = placed & (assign != current_assign(cluster))
        refused = moved & ~self.static_ok()[np.arange(len(assign)), np.where(placed, assign, 0)]
        problems += [
            f"guest {ids[j]} on {names[assign[j]]}: not allowed there"
            for j in np.flatnonzero(refused).tolist()
        ]
        for j in self.hard_neg.having().tolist():
            if placed[j] and np.any(assign[self.hard_neg[j]] == assign[j]):
                problems.append(
                    f"guest {ids[j]} shares {names[assign[j]]} with a hard anti-affinity partner"
                )
        for j in self.hard_pos.having().tolist():
            if placed[j] and np.any(assign[self.hard_pos[j]] != assign[j]):
                problems.append(f"guest {ids[j]} is apart from a hard affinity partner")
        committed = committed_for(self, assign)
        over = self.capacity.over(committed)
        for n, dim in zip(*np.nonzero(over), strict=True):
            problems.append(f"node {names[n]} over capacity in {self.capacity.dimensions[dim]}")
        return sorted(set(problems))


def replace_rules(cluster: Cluster, rules: Rules) -> Cluster:
    """The cluster with other rules."""
    return replace(cluster, rules=rules)


def committed_for(constraints: Constraints, assign: np.ndarray) -> np.ndarray:
    """Committed capacity (N, D) when every guest sits where ``assign`` says (moves finished)."""
    cap = constraints.capacity
    cluster = constraints.cluster
    n_nodes = len(cluster.nodes)
    out = cap.base.copy()
    compute = np.array([bool(loaded_nodes(g)) for g in cluster.guests], dtype=bool)
    valid = assign >= 0
    demand_compute = np.where(cap.storage_cols[None, :], 0.0, cap.demand)
    demand_storage = np.where(cap.storage_cols[None, :], cap.demand, 0.0)
    idx = np.nonzero(valid & compute)[0]
    for col in range(len(cap.dimensions)):
        if idx.size:
            out[:, col] += np.bincount(
                assign[idx], weights=demand_compute[idx, col], minlength=n_nodes
            )
    idx = np.nonzero(valid)[0]
    for col in np.nonzero(cap.storage_cols)[0]:
        if idx.size:
            out[:, col] += np.bincount(
                assign[idx], weights=demand_storage[idx, col], minlength=n_nodes
            )
    return out


def current_assign(cluster: Cluster) -> np.ndarray:
    """Node index of every guest (``-1`` for an unknown node)."""
    return np.array([cluster.node_index.get(g.node, -1) for g in cluster.guests], dtype=np.intp)


__all__ = ["SOFT_PENALTY", "Constraints", "committed_for", "current_assign", "replace_rules"]
