"""``balance``'s units: the guests it moves, one at a time or in hard-affinity bundles, as arrays
(:class:`Units`, built by :func:`build_units`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opendrs.engine.constraints import Constraints, movability
from opendrs.engine.distinct import distinct
from opendrs.engine.sparse_rows import RowMask
from opendrs.engine.usage import RESOURCES, LoadModel, loaded_nodes
from opendrs.model.cluster import Cluster, Guest

from ..base import migration_cost


@dataclass
class Units:
    """Movable units (guests or hard-affinity bundles) as arrays.

    A bundle whose members are on different nodes (*broken*: a hard affinity not met) sits, as a
    unit, on its first member's node; where each member really is, is
    :attr:`BalanceState.where`. Moving the unit gathers every member on the target.
    """

    members: list[np.ndarray]
    assign: np.ndarray  # (U,) node index
    demand: np.ndarray  # (U, R) balance load (running members only)
    need: np.ndarray  # (U, D) capacity demand
    static_ok: RowMask  # (U, N)
    movable: np.ndarray  # (U,) bool
    #: (U,) bundles some of whose members cannot move, all of those on one node (the anchor,
    #: the only node the bundle may be gathered on): a repair moves the others there.
    anchored: np.ndarray
    cost: np.ndarray  # (U,) migration cost
    #: Per unit: guest indices of every member of its hard negative partner units.
    neg_guests: list[np.ndarray]
    label: list[str]
    unit_of: np.ndarray  # (G,) unit index of each guest, or -1
    guest_demand: np.ndarray  # (G, R) balance load of each guest (running ones only)
    guest_need: np.ndarray  # (G, D) capacity demand of each guest
    #: (U,) units a rule names (a member in a node or guest affinity, hard or soft): no cheaper
    #: twin stands in for another with one (:mod:`.twins`).
    ruled: np.ndarray


def build_units(cluster: Cluster, cons: Constraints, loads: LoadModel) -> Units:
    """The units of ``cluster``: each hard-affinity bundle and each other placed guest, with
    their demand, capacity demand, allowed nodes, movability and migration cost."""
    guests, capacity = cluster.guests, cons.capacity
    members, unit_of, bundles = _unit_members(cons, loads.assign)
    heads = np.array([int(m[0]) for m in members], dtype=np.intp)
    n_units = len(members)
    running = np.array([bool(loaded_nodes(g)) for g in guests], dtype=bool)
    guest_demand = np.where(running[:, None], loads.demand, 0.0)
    guest_need = np.where((unit_of >= 0)[:, None], capacity.moving, 0.0)
    free = np.zeros(len(guests), dtype=bool)
    guest_cost = np.zeros(len(guests))
    for j in np.nonzero(unit_of >= 0)[0].tolist():
        free[j] = movability(guests[j], cluster, "balance") is None
        guest_cost[j] = migration_cost(guests[j], cluster.settings)
    # A unit of one guest has its guest's figures (added to zeros, as a bundle's are).
    demand = np.zeros((n_units, len(RESOURCES))) + guest_demand[heads]
    unit_need = np.zeros((n_units, len(capacity.dimensions))) + guest_need[heads]
    cost = np.zeros(n_units) + guest_cost[heads]
    movable = free[heads]
    static = cons.static_ok()
    # A unit's allowed nodes: its guest's row, or for a bundle the rows of all its members.
    static_index = static.index[heads]
    bundle_rows: list[np.ndarray] = []
    labels = [guests[j].id for j in heads.tolist()]
    anchored = np.zeros(n_units, dtype=bool)
    for u in bundles.tolist():
        idx = members[u]
        demand[u], unit_need[u], cost[u] = 0.0, 0.0, 0.0
        for j in idx.tolist():
            demand[u] += guest_demand[j]
            unit_need[u] += guest_need[j]
            cost[u] += guest_cost[j]
        static_index[u] = len(static.table) + len(bundle_rows)
        row, anchored[u] = _bundle_row(static[idx], idx, free, loads.assign)
        bundle_rows.append(row)
        movable[u] = bool(free[idx].all())
        labels[u] = min(guests[j].id for j in idx.tolist())
    return Units(
        members,
        loads.assign[heads].astype(np.intp),
        demand,
        unit_need,
        RowMask.build(static_index, np.vstack([static.table, *bundle_rows])),
        movable,
        anchored,
        cost,
        _neg_guests(cons, members, unit_of),
        labels,
        unit_of,
        guest_demand,
        guest_need,
        _ruled(cons, members, guests),
    )


def _ruled(cons: Constraints, members: list[np.ndarray], guests: tuple[Guest, ...]) -> np.ndarray:
    """(U,) units with a member that a rule names (node or guest affinity, hard or soft)."""
    rules = cons.rules
    named = {g for r in (*rules.node_affinity, *rules.guest_affinity) for g in r.guests}
    guest_ruled = np.array([g.id in named for g in guests], dtype=bool)
    return np.array([bool(guest_ruled[m].any()) for m in members], dtype=bool)


def _bundle_row(
    rows: np.ndarray, idx: np.ndarray, free: np.ndarray, assign: np.ndarray
) -> tuple[np.ndarray, bool]:
    """The nodes bundle ``idx`` (its members' allowed nodes: ``rows``) may be gathered on, and
    whether it is anchored. Members that cannot move (not ``free``) hold the bundle where they
    are: it may be gathered only there, and nowhere when they are on several nodes."""
    row = np.logical_and.reduce(rows, axis=0)
    fixed = idx[~free[idx]]
    if not fixed.size:
        return row, False
    anchors = distinct(assign[fixed])
    row &= np.arange(row.size) == (anchors[0] if anchors.size == 1 else -1)
    return row, bool(anchors.size == 1 and fixed.size < idx.size)


def _unit_members(
    cons: Constraints, assign: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The units: each hard-affinity bundle's placed members, and each other placed guest alone,
    in the order of their first guest. Also the unit of each guest (-1: not placed) and the
    units that are bundles."""
    n_guests = len(assign)
    placed = assign >= 0
    first = np.arange(n_guests, dtype=np.intp)
    bundle: dict[int, np.ndarray] = {}
    for group in cons.groups:
        idx = group[placed[group]]
        if idx.size:
            first[idx] = idx[0]
            bundle[int(idx[0])] = idx
    heads = np.nonzero(placed & (first == np.arange(n_guests)))[0]
    unit_of = np.full(n_guests, -1, dtype=np.intp)
    unit_of[placed] = np.searchsorted(heads, first[placed])
    alone = np.arange(n_guests, dtype=np.intp)[:, None]
    members = [bundle[h] if h in bundle else alone[h] for h in heads.tolist()]
    bundles = np.searchsorted(heads, np.array(sorted(bundle), dtype=np.intp))
    return members, unit_of, bundles


def _neg_guests(
    cons: Constraints, members: list[np.ndarray], unit_of: np.ndarray
) -> list[np.ndarray]:
    """Per unit: the guest indices of every member of its hard negative partner units (every
    member: a broken partner bundle is on several nodes)."""
    none = np.zeros(0, dtype=np.intp)
    none.flags.writeable = False
    out = [none] * len(members)
    apart = cons.hard_neg.counts() > 0
    for u in distinct(unit_of[apart & (unit_of >= 0)]).tolist():
        partners: set[int] = set()
        for j in members[u].tolist():
            partners.update(unit_of[cons.hard_neg[j]].tolist())
        partners.discard(u)
        partners.discard(-1)
        if partners:
            out[u] = np.concatenate([members[p] for p in sorted(partners)]).astype(np.intp)
    return out
