"""The constraint set's tables, built by what rules name: the (guest, node) masks of
architecture, the platform's limits and forbidden placements, stored by distinct row
(:class:`~opendrs.engine.sparse_rows.RowMask`), and the guest-affinity partners as one flat
array (:class:`~opendrs.engine.sparse_rows.Partners`): the hard groups, the hard negative
partners, the pairs of each kind of rule."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from opendrs.model.cluster import Cluster
from opendrs.model.rules import Rules

from ..distinct import distinct
from ..sparse_rows import Partners, RowMask, pairs_within
from .rule_checks import check_rules, positive_components


def arch_mask(cluster: Cluster) -> RowMask:
    """(G, N) architecture matches: one row per architecture."""
    node_names = [n.arch for n in cluster.nodes]
    guest_names = [cluster.guest_arch(g) for g in cluster.guests]
    code = {name: i for i, name in enumerate(sorted({*node_names, *guest_names}))}
    node_arch = np.array([code[name] for name in node_names], dtype=np.intp)
    guest_arch = np.array([code[name] for name in guest_names], dtype=np.intp)
    table = np.arange(len(code))[:, None] == node_arch[None, :]
    return RowMask.build(guest_arch, table)


def limits_mask(cluster: Cluster) -> RowMask:
    """(G, N) the nodes the platform can move each guest to (:attr:`Guest.limits`): a row per
    guest with limits, the all-true row for the others."""
    n_guests, n_nodes = len(cluster.guests), len(cluster.nodes)
    index = np.zeros(n_guests, dtype=np.intp)
    rows = [np.ones(n_nodes, dtype=bool)]
    names = [n.name for n in cluster.nodes]
    for j, guest in enumerate(cluster.guests):
        if not guest.limits:
            continue
        row = np.ones(n_nodes, dtype=bool)
        for limit in guest.limits:
            row &= np.array([n in limit.nodes or n == guest.node for n in names], dtype=bool)
        index[j] = len(rows)
        rows.append(row)
    return RowMask.build(index, np.array(rows))


def permitted_mask(cluster: Cluster, forbidden: Iterable[tuple[str, str]]) -> RowMask:
    """(G, N) false where ``forbidden`` refuses the placement: a row per guest it names."""
    n_guests, n_nodes = len(cluster.guests), len(cluster.nodes)
    gidx, nidx = cluster.guest_index, cluster.node_index
    pairs = [(gidx[g], nidx[n]) for g, n in forbidden if g in gidx and n in nidx]
    index = np.zeros(n_guests, dtype=np.intp)
    table = np.ones((1, n_nodes), dtype=bool)
    if pairs:
        guests, nodes = np.array(pairs, dtype=np.intp).T
        named, row = np.unique(guests, return_inverse=True)
        index[named] = 1 + np.arange(len(named))
        table = np.ones((1 + len(named), n_nodes), dtype=bool)
        table[1 + row.ravel(), nodes] = False
    return RowMask.build(index, table)


def _rule_members(cluster: Cluster, rules: Rules, positive: bool, hard: bool) -> list[np.ndarray]:
    """The guest indices of each guest-affinity rule of the kind."""
    gidx = cluster.guest_index
    return [
        np.array([gidx[g] for g in rule.guests if g in gidx], dtype=np.intp)
        for rule in rules.guest_affinity
        if rule.positive == positive and rule.hard == hard
    ]


def rule_pairs(
    cluster: Cluster, rules: Rules, positive: bool, hard: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(guest, partner) pairs of the guest-affinity rules of the kind (a guest with itself too)."""
    return pairs_within(_rule_members(cluster, rules, positive, hard))


def hard_affinity_groups(cluster: Cluster, rules: Rules) -> tuple[list[np.ndarray], np.ndarray]:
    """The hard positive groups (merged rules, two or more guests each, as sorted indices), and
    each guest's group (-1: none)."""
    gidx = cluster.guest_index
    groups: list[np.ndarray] = []
    group_of = np.full(len(cluster.guests), -1, dtype=np.intp)
    for _rules, members in positive_components(
        [r for r in rules.guest_affinity if r.positive and r.hard]
    ):
        idx = np.array(sorted(gidx[g] for g in members if g in gidx), dtype=np.intp)
        if len(idx) >= 2:
            group_of[idx] = len(groups)
            groups.append(idx)
    return groups, group_of


def hard_groups(cluster: Cluster, kept: Rules | None = None) -> list[np.ndarray]:
    """The hard-affinity bundles of ``cluster``, as :attr:`~.constraint_set.Constraints.groups`
    holds them, without building the rest of the constraint set (``kept``: the rules
    :func:`check_rules` keeps, when the caller has them; else checked here)."""
    rules = kept if kept is not None else check_rules(cluster).rules
    return hard_affinity_groups(cluster, rules)[0]


def hard_negatives(
    cluster: Cluster, rules: Rules, groups: list[np.ndarray], group_of: np.ndarray
) -> Partners:
    """Per guest, its hard negative partners. Guests kept together share their negative
    partners: between "units" (a group, or a guest alone) a negative pair of members makes the
    units apart, and every guest is apart from every member of the units its unit is apart
    from."""
    n_guests = len(cluster.guests)
    guest, partner = rule_pairs(cluster, rules, False, True)
    unit = np.where(group_of >= 0, group_of, len(groups) + np.arange(n_guests))
    apart = unit[guest] != unit[partner]
    ua, ub = unit[guest][apart], unit[partner][apart]
    n_units = len(groups) + n_guests  # a pair (a, b) as a * n_units + b, in (a, b) order
    coded = distinct(np.r_[ua, ub] * n_units + np.r_[ub, ua])
    unit_pairs = np.stack([coded // n_units, coded % n_units], axis=1)

    def members(u: int) -> np.ndarray:
        return groups[u] if u < len(groups) else np.array([u - len(groups)], dtype=np.intp)

    sides = [(members(a), members(b)) for a, b in unit_pairs.tolist()]
    pairs = [(np.repeat(a, len(b)), np.tile(b, len(a))) for a, b in sides]
    if not pairs:
        return Partners.from_pairs(n_guests, guest[:0], partner[:0])
    return Partners.from_pairs(
        n_guests, np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])
    )


__all__ = [
    "arch_mask",
    "hard_affinity_groups",
    "hard_groups",
    "hard_negatives",
    "limits_mask",
    "permitted_mask",
    "rule_pairs",
]
