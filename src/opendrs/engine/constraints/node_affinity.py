"""Node affinity as a hard filter: which rules bind a guest (:func:`binding`, for a guest that
:func:`fails_back` too), the priority tier each guest uses and the node it claims there
(:func:`affinity_tiers`), and the masks of what strict node affinity allows and non-strict node
affinity prefers (:func:`node_affinity_masks`)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from opendrs.model.cluster import Cluster, Guest
from opendrs.model.rules import NodeAffinity, Rules

from ..sparse_rows import RowMask
from ..usage import CapacityModel, tolerance


def _usable_nodes(cluster: Cluster) -> frozenset[str]:
    return frozenset(n.name for n in cluster.nodes if n.usable)


def affinity_tiers(
    cluster: Cluster, rules: Rules, capacity: CapacityModel, arch_ok: RowMask
) -> tuple[np.ndarray, np.ndarray]:
    """(G,) the node-affinity priority each guest uses (-1: no rule, or no usable node in it),
    and (G,) the node each claims (-1: none).

    Priorities are tiers: a guest uses the highest tier with a node that can take it — usable,
    of its architecture, with room for it (its own node counts its own room as free), and not
    claimed by a hard anti-affinity partner. The guests of a rule claim a node in turn, those on
    the rule's higher-priority nodes first, then by id, so two guests never count on the same
    free room. When no tier can take it, the highest usable tier applies (and the filters say
    why the guest cannot go there). HA-managed guests with ``failback`` on always use the highest
    usable tier: Proxmox's HA manager moves them back there, whatever the load.
    """
    usable = _usable_nodes(cluster)
    tier = np.full(len(cluster.guests), -1, dtype=np.int64)
    headroom = capacity.limit - capacity.committed()
    gidx = cluster.guest_index
    apart: dict[int, set[int]] = defaultdict(set)
    for neg in rules.guest_affinity:
        if not neg.positive and neg.hard:
            members = {gidx[g] for g in neg.guests if g in gidx}
            for j in members:
                apart[j] |= members - {j}
    claimed = np.full(len(cluster.guests), -1, dtype=np.intp)
    for rule in rules.node_affinity:
        tiers = rule.tiers(usable)
        if not tiers:
            continue
        members = [gidx[g] for g in rule.guests if g in gidx]
        members.sort(
            key=lambda j: (
                -_priority_on(rule, cluster.guests[j].node, usable),
                cluster.guests[j].id,
            )
        )
        for j in members:
            taken = {int(claimed[p]) for p in apart.get(j, ())}
            tier[j], claimed[j] = _claim_tier(
                cluster, j, tiers, capacity, headroom, arch_ok[j], taken
            )
    return tier, claimed


def fails_back(guest: Guest) -> bool:
    """Whether the HA manager moves ``guest`` back to its highest-priority available nodes every
    round (an HA resource with ``failback`` on; pve-ha-manager ``Manager.pm``
    ``select_service_node``)."""
    return guest.ha and guest.failback


def binding(rule: NodeAffinity, guest: Guest) -> bool:
    """Whether ``rule`` is a hard filter for ``guest``: a strict rule, or any rule of a guest
    that :func:`fails_back` — a plan that puts it below its top tier is undone by the HA
    manager, and opendrs would move it again."""
    return rule.strict or fails_back(guest)


def _priority_on(rule: NodeAffinity, node: str, usable: frozenset[str]) -> int:
    return rule.nodes.get(node, -1) if node in usable else -1


def _claim_tier(
    cluster: Cluster,
    j: int,
    tiers: list[tuple[int, frozenset[str]]],
    capacity: CapacityModel,
    headroom: np.ndarray,
    arch_ok: np.ndarray,
    taken: set[int],
) -> tuple[int, int]:
    """The priority guest ``j`` uses and the node it claims (-1: none); its demand is taken off
    ``headroom`` there. ``taken``: nodes its hard anti-affinity partners claimed."""
    guest = cluster.guests[j]
    here = cluster.node_index.get(guest.node, -1)
    if fails_back(guest):
        return tiers[0][0], here if guest.node in tiers[0][1] else -1
    need = capacity.moving[j].copy()

    def room(n: int) -> np.ndarray:
        return headroom[n] + need if n == here else headroom[n]

    for priority, names in tiers:
        fits = [
            n
            for n in sorted(cluster.node_index[name] for name in names)
            if arch_ok[n]
            and n not in taken
            and np.all(need <= room(n) + tolerance(capacity.limit[n]))
        ]
        if fits:
            # Where it stays, or the node of the tier with the most free memory.
            target = (
                here
                if here in fits
                else min(fits, key=lambda n: (-room(n)[1], cluster.nodes[n].name))
            )
            if here >= 0:
                headroom[here] += need
            headroom[target] -= need
            return priority, target
    return tiers[0][0], -1


def node_affinity_masks(
    cluster: Cluster, rules: Rules, tier: np.ndarray, usable: np.ndarray
) -> tuple[RowMask, RowMask]:
    """(G, N) what strict node affinity allows, and what non-strict node affinity prefers
    (true where none applies): a rule's guests get its usable nodes of the priority they use
    (``tier``; a non-strict rule only where the guest has one). A non-strict rule binds the
    guests that :func:`fails_back` as a strict one does (:func:`binding`)."""
    n_guests, n_nodes = len(cluster.guests), len(cluster.nodes)
    gidx, nidx = cluster.guest_index, cluster.node_index
    rows = {True: [np.ones(n_nodes, dtype=bool)], False: [np.ones(n_nodes, dtype=bool)]}
    index = {True: np.zeros(n_guests, np.intp), False: np.zeros(n_guests, np.intp)}
    for rule in rules.node_affinity:
        members = np.array([gidx[g] for g in rule.guests if g in gidx], dtype=np.intp)
        hard = np.array([binding(rule, cluster.guests[j]) for j in members], dtype=bool)
        keep = hard | (tier[members] >= 0)
        members, hard = members[keep], hard[keep]
        if not members.size:
            continue
        named = np.zeros(n_nodes, dtype=bool)
        priority = np.zeros(n_nodes, dtype=np.int64)
        for name, p in rule.nodes.items():
            if name in nidx:
                named[nidx[name]], priority[nidx[name]] = True, p
        for strict in (True, False):
            chosen = members[hard == strict]
            if strict and not rule.strict:
                # Failback binds to the top tier only while the rule has a usable node: else
                # the HA manager takes any node (the others are its priority -1).
                chosen = chosen[tier[chosen] >= 0]
            if not chosen.size:
                continue
            used, which = np.unique(tier[chosen], return_inverse=True)
            # check_rules leaves each guest in one node-affinity rule at most: one row per guest.
            index[strict][chosen] = len(rows[strict]) + which.ravel()
            rows[strict].extend(usable & named & (priority == p) for p in used.tolist())
    return (
        RowMask.build(index[True], np.array(rows[True])),
        RowMask.build(index[False], np.array(rows[False])),
    )


__all__ = ["affinity_tiers", "binding", "fails_back", "node_affinity_masks"]
