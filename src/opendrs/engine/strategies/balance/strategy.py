"""``balance`` — opendrs's own rebalancing strategy.

Goal: reach a target balance (every resource's spread — max − min of the usable nodes' load
fractions — at most ``target_spread``) with the fewest and smallest migrations, never breaking a
hard constraint, never making the objective worse, deterministically and fast.

**Objective.** The capacity-weighted variance of the node load fractions, per resource, combined
with the cluster's weights: ``J = Σ_r w_r · Σ_n C_nr (f_nr − f̄_r)² / Σ_n C_nr``
(:func:`~opendrs.engine.imbalance.balance_objective`, its one definition). It is zero exactly
when every node has the same fraction, for nodes of any size, and a move's effect is exact and
cheap: moving demand ``d`` from node ``a`` to node ``b`` changes it by
``Σ_r w_r (d²(1/C_a + 1/C_b) − 2d(f_a − f_b)) / Σ_n C_nr`` (:meth:`_State.gains`, checked
against the definition) — the ``d²`` term is what prevents overshoot: a move that would swap the
roles of ``a`` and ``b`` scores worse than a smaller one. Every balancing move lowers ``J``.

**The band.** The target is met once every usable node's fraction lies within ``goal / 2`` of the
cluster mean, per weighted resource (the *band*; the goal is ``target_spread``, or one guest's
step on the smallest node where that is coarser). How far a node is from it, counted in typical
guests (its load outside the band over the mean movable guest's demand, summed over the weighted
resources), is the *band distance*: it says how much is left to move, and a move that brings a
node exactly into the band is worth as much as it moves, where the variance would rather halve
the gap between two nodes and leave both to be fixed again. Moves are therefore *chosen* by how
much band distance they remove (the variance breaks ties and decides when no move shortens it),
and *allowed* only when they also lower ``J``.

**Shedding plan.** A node above the band in every weighted resource must shed its excess; the
fewest guests that do it carry cpu and memory in the proportions of that excess, not the biggest
ones (which are memory-heavy: they balance memory long before cpu, and the node then takes guests
back). For each such node the plan sweeps directions in the (cpu, memory) plane: guests in the
order of their projection on the direction, each taken if it does not overshoot the excess by
more than half the band, until the excess is covered; the direction needing the fewest guests
(a shortfall counted as extra guests) wins — a rounding of the linear relaxation behind
:func:`opendrs.engine.bounds.migration_lower_bound`. Until the planned guests have left (or none
of them helps any more), the rounds below move only them, each to where it removes the most band
distance.

**Rounds of moves.** What the plan leaves is finished by rounds of greedy moves over a vectorised
(unit × node) matrix — a *unit* is a guest, or a bundle of guests kept together by hard affinity.
In each round every candidate unit gets its best allowed target; then moves are taken in order of
score, at most one per node, so moves in a round touch disjoint nodes and their gains stay exact.
Among scores within 1 % of each other the cheaper migration wins. A move is made only if it pays
for itself — the balance σ (the square root of the objective) falls by at least ``margin``
percentage points per percent of the cluster's total migration cost that the move spends (moving
a guest that has already moved, or back home, spends nothing) — and the search stops as soon as
every weighted resource is within its goal: no moves while balanced. When no single move helps,
units are exchanged between the nodes that deviate most (four, or one in 64 on big clusters) and
nodes that deviate the other way, on disjoint pairs of nodes, the exchange with the largest gain
per migration it adds first (one between guests that have both moved already adds none). When no
exchange of two pays either, one unit is exchanged against a set of another node's units, all
its moves evaluated together (:mod:`.set_exchange`).

**Idle windows.** A move's gain depends only on its two nodes' loads, and whether it is allowed
only on its unit and its target: a window in which a round found no move that lowers the
objective stays so for every pair of nodes no move has changed since. A round looks first at
the pairs that changed (:class:`_Idle`); when they offer none either, it knows the whole window
offers none (the same answer as the whole search, found at a fraction of its cost).

**Repair first.** Guests that break a hard constraint now — on a node in maintenance, on a node
their strict node affinity excludes, sharing a node with a hard anti-affinity partner, split from
their hard-affinity partners, or on a node over capacity — are moved first, to their best allowed
node, whatever the cost. A bundle split over several nodes is on all of them until it is gathered
(on any node, one of its own included, with room there for the members not there yet): no hard
anti-affinity partner of any member may go to any of them, and a gathered bundle is not split
again by pruning. Split bundles are gathered by repairs only, not moved by balancing. A bundle
with members that cannot move (*anchored*) may be gathered only on their node — its other members
join them there — and nowhere when they are on several nodes.

**Exact repair.** The greedy repair moves only the units that break something; when one can go
nowhere — its only possible node must first shed a small guest, two full nodes must swap — the
exact model (:func:`~opendrs.engine.strategies.optimal.solve_repair`, CP-SAT, bounded in time,
repeatable) places the stuck units and the units that may make room for them at the least
migration cost (see :func:`_exact_repair` for which units and nodes it holds). Its moves are made
all together, or not at all when they would exceed ``max_moves`` (the policy then asks for the
whole repair and keeps the first steps of its plan); what is left is noted as not repaired, and
``Proposal.options["repair"]`` says what the exact repair found.

**Pruning.** Afterwards, every move is tried undone (most expensive first): if the cluster still
meets the target and the constraints without it, it is dropped.

**Below the grain.** A resource whose goal was one step on the smallest node, coarser than
``target_spread``, is then brought within ``target_spread`` in whole steps where the nodes' whole
steps can add up inside one such window (:mod:`.grain_window`, :mod:`.grain_polish`); where
they cannot, or the polish does not get every node in, it keeps the grain as its goal and the
stop reason says why.

**A second path.** With few, big guests per node the search above can end short of the target,
where no move or exchange pays for itself. Then, on a cluster of at most :data:`PLAIN_GUESTS`
guests, the plain search — no plan, moves chosen by objective gain — runs from the start, and its
answer is kept if it reaches the target.

On large clusters (more than ``wide`` nodes) each round looks only at the ``wide`` most loaded
sources and ``wide`` least loaded targets, which keeps a round cheap at 1,000 nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from opendrs.engine.constraints import Constraints, movability
from opendrs.engine.imbalance import balance_objective, resource_weights
from opendrs.engine.sparse_rows import RowMask
from opendrs.engine.strategies.optimal import REPAIR_TIME_LIMIT, solve_repair
from opendrs.engine.usage import RESOURCES, LoadModel, arch_groups, loaded_nodes, tolerance
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster

from ..base import (
    Proposal,
    ProposedMove,
    Request,
    Strategy,
    StrategyOptions,
    cluster_imbalance,
    constraints_for,
    migration_cost,
    spread_options,
)
from .polish import polish
from .set_exchange import SetExchange, set_round

log = logging.getLogger(__name__)

DEFAULT_TARGET_SPREAD = 0.01
DEFAULT_MARGIN = 0.05
DEFAULT_WIDE = 64
#: Most (unit, target) pairs a round looks at when it widens its window on a big cluster.
PAIR_BUDGET = 4_000_000
#: Candidate moves a round's greedy pass first screens at once for the next one it can take
#: (then twice as many each time).
PICK_BLOCK = 16
#: Node loads (moves × nodes × resources) whose objectives are computed at once.
MOVES_AT_ONCE = 1 << 18
#: A round's band distances are computed only for the moves that may be made where those are
#: fewer than one in this many of its (unit, target) pairs (the same values, fewer of them).
BAND_AT_MOST = 4
#: Parts of exchange tables kept (see :meth:`_State._swap_table`).
SWAP_BLOCKS = 1024
#: Directions the shedding plan tries, from "memory-light" through "both" to "cpu-light".
PLAN_DIRECTIONS = 91
#: A shedding plan that falls short of a node's excess counts each missing typical guest as
#: this many extra migrations (it will take a few moves to make up later).
PLAN_SHORTFALL = 4.0
#: Hot nodes planned at once (bounds the plan's working arrays on big clusters).
PLAN_CHUNK = 64
#: A round without single moves looks for exchanges from this many of the most deviating nodes
#: per this many nodes (at least 4).
SWAP_NODES_PER = 64
#: The exact repair: the stuck units it takes at once; the nodes that lack least to take them
#: (two per stuck unit, from ``REPAIR_TARGETS`` to four times that) and the nodes with the most
#: room (``REPAIR_SPARES``) in its first model; the (movable unit, node) pairs up to which it then
#: tries every unit on every node.
REPAIR_UNITS = 256
REPAIR_TARGETS = 16
REPAIR_SPARES = 8
REPAIR_PAIRS = 20_000
#: The plain second search runs only on clusters of at most this many guests.
PLAIN_GUESTS = 5_000


@dataclass
class _Units:
    """Movable units (guests or hard-affinity bundles) as arrays.

    A bundle whose members are on different nodes (*broken*: a hard affinity not met) sits, as a
    unit, on its first member's node; where each member really is, is
    :attr:`_State.where`. Moving the unit gathers every member on the target.
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


class _State:
    """The evolving placement: node loads, capacity commitments and unit positions."""

    def __init__(self, cluster: Cluster, cons: Constraints, loads: LoadModel | None = None) -> None:
        self.cluster = cluster
        self.cons = cons
        loads = loads if loads is not None else LoadModel.build(cluster)
        self.loads = loads
        self.cap = loads.capacity
        self.node_load = loads.loads()
        self.limit = cons.capacity.limit
        self.committed = cons.capacity.committed()
        self.tol = tolerance(self.limit)
        self.usable = cons.usable & np.all(self.cap > 0, axis=1)
        #: (N,) each usable node's CPU architecture group (-1: not usable): guests cannot move
        #: between architectures, so each group has its own mean, band and spread.
        self.group = arch_groups(cluster, self.usable)[1]
        w = resource_weights(cluster.settings)
        cap_total = (self.cap * self.usable[:, None]).sum(axis=0)
        #: Per-resource weight that turns Σ L²/C into the weighted variance of fractions.
        self.wnorm = np.where(cap_total > 0, w / np.where(cap_total > 0, cap_total, 1.0), 0.0)
        self.weights = w
        self.units = self._build_units()
        #: (G,) the node each guest of a unit is on now (a broken bundle's members differ).
        self.where = np.array(loads.assign, dtype=np.intp, copy=True)
        #: (U,) bundles whose members are on different nodes now; moving one gathers it.
        self.broken = np.zeros(len(self.units.members), dtype=bool)
        for u, idx in enumerate(self.units.members):
            if idx.size > 1:
                self.broken[u] = np.any(self.where[idx] != self.where[idx[0]])
        #: (U,) bundles broken at the start: they have no home to go back to.
        self.broken_at_start = self.broken.copy()
        # Partner guests laid end to end (CSR), for vectorised anti-affinity masks: a unit may
        # not go where any member of a partner unit is, a broken partner bundle's included.
        lengths = np.array([p.size for p in self.units.neg_guests], dtype=np.intp)
        self.has_neg = lengths > 0
        self.neg_start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.intp)
        self.neg_flat = (
            np.concatenate(self.units.neg_guests).astype(np.intp)
            if lengths.sum()
            else np.zeros(0, dtype=np.intp)
        )
        #: Where each unit started: a unit away from it has already cost its migration.
        self.origin = self.units.assign.copy()
        movable = self.units.demand[self.units.movable]
        #: The mean movable unit's demand.
        self.mean_demand = movable.mean(axis=0) if movable.size else np.ones(len(RESOURCES))
        #: A typical movable unit's demand: the band distance is counted in these. A demand
        #: the loads cannot register (below one rounding step of the cluster's capacity, as a
        #: subnormal use can be) counts as none: distances counted in it would overflow.
        self.typical = np.where(
            self.mean_demand > np.finfo(float).eps * cap_total, self.mean_demand, 1.0
        )
        #: The band: fractions within ``goal / 2`` of the mean.
        self.goal = np.zeros(len(RESOURCES))
        self._objective: float | None = None
        #: Each architecture group's nodes (every node: a slice, no copy), and their capacity.
        groups = [
            np.nonzero(self.group == g)[0] for g in range(int(self.group.max(initial=-1)) + 1)
        ]
        self._group_size = [idx.size for idx in groups]
        self._groups: list[np.ndarray | slice] = [
            slice(None) if idx.size == len(self.group) else idx for idx in groups
        ]
        self._group_cap = [self.cap[idx].sum(axis=0) for idx in self._groups]
        self._cap_pos = self.cap > 0
        #: The resources the objective weighs.
        self._weighted = np.nonzero(self.wnorm)[0].tolist()
        self._cap_den = np.where(self._cap_pos, self.cap, 1.0)
        self._inv_cap = np.where(self._cap_pos, 1.0 / self._cap_den, 0.0)
        self._f: np.ndarray | None = None
        #: Nodes whose loads changed since the fractions were last brought up to date.
        self._touched: list[int] = []
        #: (N,) how many times a move has changed each node's load or units.
        self.version = np.zeros(len(cluster.nodes), dtype=np.int64)
        self._means: np.ndarray | None = None
        #: The units on each node (by :attr:`_Units.assign`), and the kinds of the movable ones
        #: on the nodes no move has touched since (see :meth:`_node_kinds`).
        self._units_at: list[set[int]] = [set() for _ in range(len(self.cap))]
        for u, n in enumerate(self.units.assign.tolist()):
            self._units_at[n].add(u)
        self._kinds_on: dict[int, _Kinds] = {}
        self._joined: dict[tuple[int, ...], tuple[list[_Kinds], _Kinds]] = {}
        self._swap_blocks: dict[tuple[int, int], tuple[_Kinds, _Kinds, np.ndarray, np.ndarray]] = {}
        self._unit_kinds: tuple[np.ndarray, int] | None = None
        #: Best set exchanges of pairs of nodes, with the kinds of both when found
        #: (:mod:`.set_exchange`).
        self._set_exchanges: dict[tuple[int, int], tuple[_Kinds, _Kinds, Any]] = {}

    # ---------------------------------------------------------------------------------------

    def _build_units(self) -> _Units:
        cluster, cons, loads = self.cluster, self.cons, self.loads
        guests, capacity = cluster.guests, cons.capacity
        members, unit_of, bundles = _unit_members(cons, loads.assign)
        heads = np.array([int(m[0]) for m in members], dtype=np.intp)
        n_units = len(members)
        running = np.array([bool(loaded_nodes(g)) for g in guests], dtype=bool)
        guest_demand = np.where(running[:, None], loads.demand, 0.0)
        # As Constraints.guest_demand: a guest that is not running needs only its storage.
        need = np.where(running[:, None] | capacity.storage_cols[None, :], capacity.demand, 0.0)
        guest_need = np.where((unit_of >= 0)[:, None], need, 0.0)
        free = np.zeros(len(guests), dtype=bool)
        guest_cost = np.zeros(len(guests))
        for j in np.nonzero(unit_of >= 0)[0].tolist():
            free[j] = movability(guests[j], cluster, "balance") is None
            guest_cost[j] = migration_cost(guests[j], cluster.settings)
        # A unit of one guest has its guest's figures (added to zeros, as a bundle's are).
        demand = np.zeros((n_units, len(RESOURCES))) + guest_demand[heads]
        unit_need = np.zeros((n_units, len(capacity.dims))) + guest_need[heads]
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
            row = np.logical_and.reduce(static[idx], axis=0)
            fixed = idx[~free[idx]]
            if fixed.size:
                # Members that cannot move hold the bundle where they are: it may be gathered
                # only there, and nowhere when they are on several nodes.
                anchors = np.unique(loads.assign[fixed])
                row &= np.arange(row.size) == (anchors[0] if anchors.size == 1 else -1)
                anchored[u] = anchors.size == 1 and fixed.size < idx.size
            bundle_rows.append(row)
            movable[u] = bool(free[idx].all())
            labels[u] = min(guests[j].id for j in idx.tolist())
        return _Units(
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
        )

    # ---------------------------------------------------------------------------------------

    def fractions(self) -> np.ndarray:
        """(N, R) each node's load over its capacity (0 where it has none)."""
        return self._fractions().copy()

    def _fractions(self) -> np.ndarray:
        """:meth:`fractions`, kept: only the rows of the nodes moves touched are recomputed."""
        if self._f is None:
            self._f = _fraction_rows(self.node_load, self.cap)
        elif self._touched:
            # As _fraction_rows (the denominators are positive: nothing to warn about).
            rows = np.array(self._touched, dtype=np.intp)
            load = self.node_load[rows] / self._cap_den[rows]
            self._f[rows] = np.where(self._cap_pos[rows], load, 0.0)
        self._touched.clear()
        return self._f

    def spreads(self) -> np.ndarray:
        """(R,) the largest spread of any architecture group's usable nodes, per resource."""
        return self._spreads_of(self._fractions())

    def spreads_moved(self, u: int, target: int) -> np.ndarray:
        """:meth:`spreads` were whole unit ``u`` on ``target`` (the same bits), not moving it."""
        rows = np.array([self.units.assign[u], target], dtype=np.intp)
        load = self.node_load[rows]
        load[0] -= self.units.demand[u]
        load[1] += self.units.demand[u]
        f = self._fractions().copy()
        f[rows] = np.where(self._cap_pos[rows], load / self._cap_den[rows], 0.0)
        return self._spreads_of(f)

    def _spreads_of(self, f: np.ndarray) -> np.ndarray:
        """:meth:`spreads` of the fractions ``f``."""
        out = np.zeros(len(RESOURCES))
        for idx, size in zip(self._groups, self._group_size, strict=True):
            if size >= 2:
                members = f[idx]
                # Column by column: a reduction along the long axis is the fast one.
                spread = [members[:, r].max() - members[:, r].min() for r in range(len(out))]
                out = np.maximum(out, spread)
        return out

    def objective(self) -> float:
        """The objective now: :func:`~opendrs.engine.imbalance.balance_objective` of the usable
        nodes, each against the mean of its architecture group (one group: the weighted
        variance; a move within a group changes both the same way)."""
        if self._objective is None:
            self._objective = float(
                balance_objective(self.node_load, self.cap, self.weights, self.group)
            )
        return self._objective

    def units_on(self, nodes: np.ndarray) -> np.ndarray:
        """The movable units on ``nodes``, in index order: candidates for balancing moves.

        A broken bundle is not one: gathering it is a repair (:meth:`violating_units`).
        """
        mask = np.zeros(len(self.cluster.nodes), dtype=bool)
        mask[nodes] = True
        return np.nonzero(self.units.movable & ~self.broken & mask[self.units.assign])[0]

    def moved(self) -> np.ndarray:
        """(U,) units that have moved: away from where they started, or (broken) gathered."""
        return (self.units.assign != self.origin) | (self.broken_at_start & ~self.broken)

    def _moved(self, units: np.ndarray) -> np.ndarray:
        """:meth:`moved` of ``units`` only."""
        return (self.units.assign[units] != self.origin[units]) | (
            self.broken_at_start[units] & ~self.broken[units]
        )

    def is_moved(self, u: int) -> bool:
        """Whether unit ``u`` has moved (see :meth:`moved`)."""
        return bool(
            self.units.assign[u] != self.origin[u]
            or (self.broken_at_start[u] and not self.broken[u])
        )

    def scattered(self, u: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where broken unit ``u``'s members are: (nodes, demand (k, R), need (k, D)) per node."""
        idx = self.units.members[u]
        nodes, at = np.unique(self.where[idx], return_inverse=True)
        demand = np.zeros((len(nodes), self.units.guest_demand.shape[1]))
        need = np.zeros((len(nodes), self.units.guest_need.shape[1]))
        np.add.at(demand, at, self.units.guest_demand[idx])
        np.add.at(need, at, self.units.guest_need[idx])
        return nodes, demand, need

    def occupied(self, u: int) -> np.ndarray:
        """The nodes unit ``u``'s members are on (one, unless it is a broken bundle)."""
        if self.broken[u]:
            return np.unique(self.where[self.units.members[u]])
        return self.units.assign[u : u + 1]

    def mean(self) -> np.ndarray:
        """(N, R) per node, the capacity-weighted mean fraction of its architecture group's usable
        nodes (0 for a node that is not usable)."""
        return self._mean().copy()

    def _mean(self) -> np.ndarray:
        """:meth:`mean`, kept until the next move."""
        if self._means is None:
            out = np.zeros(self.cap.shape)
            for idx, total in zip(self._groups, self._group_cap, strict=True):
                load = self.node_load[idx].sum(axis=0)
                mean = np.where(total > 0, load / np.where(total > 0, total, 1.0), 0.0)
                if isinstance(idx, slice):  # one group of every node: no copies
                    out = np.broadcast_to(mean, self.cap.shape)
                else:
                    out[idx] = mean
            self._means = out
        return self._means

    def blocked_by_partners(self, units: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """(len(units), len(nodes)): whether each node holds a hard negative partner of each unit.

        ``nodes`` must not repeat.
        """
        out = np.zeros((len(units), len(nodes)), dtype=bool)
        rows = np.nonzero(self.has_neg[units])[0]
        if rows.size == 0:
            return out
        column = np.full(len(self.cluster.nodes), -1, dtype=np.intp)
        column[nodes] = np.arange(len(nodes))
        first = self.neg_start[units[rows]]
        count = self.neg_start[units[rows] + 1] - first
        row_of = np.repeat(rows, count)
        offset = np.repeat(first - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
        partners = self.neg_flat[offset + np.arange(int(count.sum()))]
        col = column[self.where[partners]]
        hit = col >= 0
        out[row_of[hit], col[hit]] = True
        return out

    def blocked_at(self, units: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """(k,): whether ``nodes[k]`` holds a hard negative partner of ``units[k]``."""
        out = np.zeros(len(units), dtype=bool)
        rows = np.nonzero(self.has_neg[units])[0]
        if rows.size:
            first = self.neg_start[units[rows]]
            count = self.neg_start[units[rows] + 1] - first
            row_of = np.repeat(rows, count)
            offset = np.repeat(first - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
            partners = self.neg_flat[offset + np.arange(int(count.sum()))]
            out[row_of[self.where[partners] == nodes[row_of]]] = True
        return out

    def gains(self, units: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """(len(units), len(targets)) objective reduction of moving each unit to each target.

        With ``Σ_n L²/C`` per resource, moving ``d`` from ``a`` to ``b`` changes the objective by
        ``d²(1/C_a + 1/C_b) − 2d(f_a − f_b)``; a unit leaving an unusable node adds only the
        target's ``d²/C_b + 2d·f_b``. Weighted and summed over resources this factors into
        ``g_u − (2d·w)·f_b − (d²·w)·(1/C_b)``: two small matrix products.
        """
        d = self.units.demand[units]  # (u, R)
        src = self.units.assign[units]
        f = self._fractions()
        inv = self._inv_cap
        w = self.wnorm
        own = ((2 * d * f[src] - d**2 * inv[src]) * w).sum(axis=1)
        own = np.where(self.usable[src], own, 0.0)
        # own − (2d·w) fᵀ − (d²·w) invᵀ, in place.
        out = (2 * d * w) @ f[targets].T
        np.subtract(own[:, None], out, out=out)
        out -= (d**2 * w) @ inv[targets].T
        for row in np.nonzero(self.broken[units])[0].tolist():
            # A broken bundle leaves each of its members' nodes e_n; on a target b where some
            # of it already is, the load becomes L_b − e_b + D, which adds 2·D·e_b/C_b.
            nodes, e, _need = self.scattered(int(units[row]))
            part = (2 * e * f[nodes] - e**2 * inv[nodes]) * w
            dr = d[row]
            out[row] = (
                float(part[self.usable[nodes]].sum())
                - (2 * dr * w) @ f[targets].T
                - (dr**2 * w) @ inv[targets].T
            )
            column = {int(t): k for k, t in enumerate(targets.tolist())}
            for n, e_n in zip(nodes.tolist(), e, strict=True):
                if n in column:
                    out[row, column[n]] += float((2 * dr * e_n * inv[n] * w).sum())
        return out

    def unit_kinds(self) -> tuple[np.ndarray, int]:
        """(U,) each unit's kind, and how many there are: units of a kind have the same demand,
        capacity demand and allowed nodes (:attr:`_Units.static_ok`), so on one node the same
        gains and hard constraints. A bundle broken at the start, or a unit kept apart from
        others, is a kind of its own."""
        if self._unit_kinds is None:
            u = self.units
            static = u.static_ok.distinct()
            alone = self.broken_at_start | self.has_neg
            column = [
                u.demand.view(np.int64),
                u.need.view(np.int64),
                static,
                np.where(alone, np.arange(len(alone)), -1),
            ]
            key = np.hstack([c.astype(np.int64).reshape(len(alone), -1) for c in column])
            first, kind = _distinct_rows(key)
            self._unit_kinds = (kind, first.size)
        return self._unit_kinds

    def band_gains(
        self,
        units: np.ndarray,
        targets: np.ndarray,
        at: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """(len(units), len(targets)) fall of the band distance if each unit moves to each target;
        with ``at`` (rows, columns), only the moves there, (k,) — the same values.

        The band distance of a node is its load outside ``mean ± goal / 2``, in typical guests,
        summed over the weighted resources; a unit leaving an unusable node removes all it carries.
        """
        d = self.units.demand[units]  # (u, R)
        src = self.units.assign[units]
        mean = self._mean()
        low = (mean - self.goal / 2) * self.cap  # (N, R) absolute
        high = (mean + self.goal / 2) * self.cap
        outside = np.maximum(self.node_load - high, 0.0) + np.maximum(low - self.node_load, 0.0)
        left = self.node_load[src] - d
        at_source = outside[src] - (
            np.maximum(left - high[src], 0.0) + np.maximum(low[src] - left, 0.0)
        )
        at_source = np.where(self.usable[src][:, None], at_source, d)
        scale = (self.weights > 0) / self.typical
        if at is None:
            shape = (len(units), len(targets))

            def by_unit(column: np.ndarray) -> np.ndarray:
                return column[:, None]

            def by_target(column: np.ndarray) -> np.ndarray:
                return column[None, :]
        else:
            rows, cols = at
            shape = (rows.size,)

            def by_unit(column: np.ndarray) -> np.ndarray:
                return column[rows]

            def by_target(column: np.ndarray) -> np.ndarray:
                return column[cols]

        # Element by element, in place: after = max(d − room up, 0) + max(−room down − d, 0),
        # out += scale · (at source + before − after).
        out, after, part = np.zeros(shape), np.empty(shape), np.empty(shape)
        for r in np.nonzero(scale)[0].tolist():
            room_up = high[targets, r] - self.node_load[targets, r]
            room_down = self.node_load[targets, r] - low[targets, r]
            dr = by_unit(d[:, r])
            np.maximum(np.subtract(dr, by_target(room_up), out=after), 0.0, out=after)
            np.maximum(np.subtract(by_target(-room_down), dr, out=part), 0.0, out=part)
            after += part
            np.add(by_unit(at_source[:, r]), by_target(outside[targets, r]), out=part)
            part -= after
            part *= scale[r]
            out += part
        return out

    def allowed(self, units: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """(len(units), len(targets)) hard-constraint mask for moving each unit to each target.

        A broken bundle may be gathered on any node, one of its members' included, and needs
        room there only for the members not there yet. No unit may go where a member of a hard
        negative partner unit is — every member of a broken partner bundle counts.
        """
        ok = np.take(self.units.static_ok[units], targets, axis=1)
        ok &= self.usable[targets][None, :]
        broken = self.broken[units]
        ok &= (self.units.assign[units][:, None] != targets[None, :]) | broken[:, None]
        headroom = (self.limit[targets] - self.committed[targets]) + self.tol[targets]  # (t, D)
        # Never add to a node already over a limit.
        ok &= np.all(headroom >= self.tol[targets], axis=1)[None, :]
        need = self.units.need[units]  # (u, D)
        fits = np.ones(ok.shape, dtype=bool)
        for dim in range(need.shape[1]):
            fits &= need[:, dim : dim + 1] <= headroom[None, :, dim]
        for row in np.nonzero(broken)[0].tolist():
            nodes, _demand, there = self.scattered(int(units[row]))
            extra = np.broadcast_to(need[row], headroom.shape).copy()
            column = {int(t): k for k, t in enumerate(targets.tolist())}
            for n, need_n in zip(nodes.tolist(), there, strict=True):
                if n in column:
                    extra[column[n]] -= need_n
            fits[row] = np.all(extra <= headroom, axis=1)
        ok &= fits
        if self.has_neg[units].any():
            ok &= ~self.blocked_by_partners(units, targets)
        return ok

    def allowed_one(self, u: int, t: int) -> bool:
        """:meth:`allowed` for one unit and one target."""
        if self.broken[u]:
            return bool(self.allowed(np.array([u]), np.array([t]))[0, 0])
        if not (self.units.static_ok[u, t] and self.usable[t]) or self.units.assign[u] == t:
            return False
        headroom = (self.limit[t] - self.committed[t]) + self.tol[t]
        if not (np.all(headroom >= self.tol[t]) and np.all(self.units.need[u] <= headroom)):
            return False
        return not (
            self.has_neg[u] and self.blocked_by_partners(np.array([u]), np.array([t])).any()
        )

    def best_swap(self, a: int, partners: np.ndarray) -> tuple[float, float, int, int] | None:
        """The best exchange of a unit on node ``a`` with a unit on one of the ``partners`` nodes.

        Returns (score, gain, unit on a, unit elsewhere) or None. Both units must be movable,
        allowed on each other's node, fit there once the other has left, and keep hard
        anti-affinity. The score is the gain per migration the exchange adds (units that have
        already moved cost nothing more), and four times the gain for one that adds none. Among
        equal scores the units with the lower indices win.
        """
        nodes = [int(n) for n in partners.tolist() if n != a and self.usable[n]]
        if not self.usable[a] or not nodes:
            return None
        x = self._node_kinds(a)
        o = self._nodes_kinds(nodes)
        if x.units.size == 0 or o.units.size == 0:
            return None
        # Units alike (same demand and node, not moved yet) pair alike: gains and scores are
        # computed per kind, and pairs of units only for the best of them.
        gain, score = self._swap_table(a, x, nodes)
        check = self._swap_check(a, x.units, o.units)
        # Most often a pair of the best-scoring kinds is allowed.
        score = np.where(gain > 0, score, -np.inf)
        best = score.max(initial=-np.inf)
        if best == -np.inf:
            return None
        xk, ok = np.nonzero(score == best)
        if (first := _first_allowed(check, x, o, xk, ok)) is not None:
            at_x, at_o, k = first
            return float(best), float(gain[xk[k], ok[k]]), int(x.units[at_x]), int(o.units[at_o])
        xk, ok = np.nonzero(score > -np.inf)
        values = score[xk, ok]
        rank = np.argsort(-values, kind="stable")
        xk, ok, values = xk[rank], ok[rank], values[rank]
        # Pairs of units best first, by unit index among equal scores; their constraints checked
        # 256 (and every pair tied with the last of them) at a time.
        ties = np.flatnonzero(np.append(values[1:] != values[:-1], True)) + 1
        for begin, end in _runs(np.cumsum(x.count[xk] * o.count[ok]), ties, 256):
            xs, os, kinds = _unit_pairs(x, o, xk[begin:end], ok[begin:end])
            order = np.lexsort((o.units[os], x.units[xs], -values[begin:end][kinds]))
            xs, os, kinds = xs[order], os[order], kinds[order]
            for at in range(0, xs.size, 256):
                allowed = check(xs[at : at + 256], os[at : at + 256])
                if allowed.any():
                    pair = at + int(np.argmax(allowed))
                    k = begin + int(kinds[pair])
                    return (
                        float(values[k]),
                        float(gain[xk[k], ok[k]]),
                        int(x.units[xs[pair]]),
                        int(o.units[os[pair]]),
                    )
        return None

    def _swap_check(
        self, a: int, on_a: np.ndarray, others: np.ndarray
    ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """Whether exchanging on_a[xs[k]] with others[os[k]] is allowed, for each k."""
        units = self.units
        b = units.assign[others]  # (o,)
        room = self.limit - self.committed + self.tol
        partners = self.has_neg[on_a].any() or self.has_neg[others].any()

        def check(xs: np.ndarray, os: np.ndarray) -> np.ndarray:
            xu, ou, on = on_a[xs], others[os], b[os]
            ok = units.static_ok[xu, on] & units.static_ok[ou, a]
            shift = units.need[xu] - units.need[ou]  # what moves a -> b
            ok &= _every(shift <= room[on])
            ok &= _every(-shift <= room[a][None, :])
            if partners:
                ok &= ~self.blocked_at(xu, on) & ~self.blocked_at(ou, np.full_like(ou, a))
            return ok

        return check

    def _swap_table(self, a: int, x: _Kinds, nodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_swap_scores` of the kinds on ``a`` with those on ``nodes``, one node after the
        other. Each node's part is kept while neither it nor ``a`` changes (a move drops the
        kinds of the nodes it touches)."""
        parts = [self._node_kinds(n) for n in nodes]
        kept = self._swap_blocks
        blocks = [kept.get((a, n)) for n in nodes]
        fresh = [
            i
            for i, (block, part) in enumerate(zip(blocks, parts, strict=True))
            if block is None or block[0] is not x or block[1] is not part
        ]
        if fresh:
            firsts = [parts[i].first for i in fresh]
            gain, score = self._swap_scores(a, x.first, np.concatenate(firsts))
            at = np.cumsum([0] + [f.size for f in firsts]).tolist()
            if len(kept) > SWAP_BLOCKS:
                kept.clear()
            for i, lo, hi in zip(fresh, at, at[1:], strict=False):
                blocks[i] = kept[(a, nodes[i])] = (x, parts[i], gain[:, lo:hi], score[:, lo:hi])
            if len(fresh) == len(nodes):
                return gain, score
        if len(blocks) == 1:
            return blocks[0][2], blocks[0][3]
        return np.hstack([b[2] for b in blocks]), np.hstack([b[3] for b in blocks])

    def _nodes_kinds(self, nodes: list[int]) -> _Kinds:
        """:meth:`_node_kinds` of ``nodes``, one node after the other; the last ones kept."""
        parts = [self._node_kinds(n) for n in nodes]
        key = tuple(nodes)
        kept = self._joined.get(key)
        if kept is None or any(p is not q for p, q in zip(parts, kept[0], strict=True)):
            kept = self._joined[key] = (parts, _Kinds.join(parts))
            if len(self._joined) > 64:
                self._joined.pop(next(iter(self._joined)))
        return kept[1]

    def _node_kinds(self, n: int) -> _Kinds:
        """The movable, whole units on node ``n`` by kind (:meth:`unit_kinds`), not moved yet (a
        unit that has moved is a kind of its own: its way home is free). Kept until a move
        touches the node."""
        kinds = self._kinds_on.get(n)
        if kinds is None:
            on = np.array(sorted(self._units_at[n]), dtype=np.intp)
            on = on[self.units.movable[on] & ~self.broken[on]]
            kind, n_kinds = self.unit_kinds()
            code = np.where(self._moved(on), n_kinds + on, kind[on])
            _, first, of = np.unique(code, return_index=True, return_inverse=True)
            kinds = self._kinds_on[n] = _Kinds.of(on, first, of)
        return kinds

    def _swap_scores(self, a: int, xs: np.ndarray, os: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(len(xs), len(os)) the objective gain of exchanging each unit ``xs`` on node ``a``
        with each unit ``os`` elsewhere, and its score (the gain per migration it adds, four
        times the gain for none)."""
        units = self.units
        f = self._fractions()
        inv = self._inv_cap
        b = units.assign[os]  # (o,)
        dx, do, fb, inv_b = units.demand[xs], units.demand[os], f[b], inv[b]
        # Objective gain of every pair, one resource at a time: t = what moves a -> b.
        gain = np.zeros((xs.size, os.size))
        t, part = np.empty(gain.shape), np.empty(gain.shape)
        for r in self._weighted:
            # gain −= w_r (t² (1/C_a + 1/C_b) − 2t (f_a − f_b)), in place.
            np.subtract(dx[:, r : r + 1], do[:, r], out=t)
            gap = f[a, r] - fb[:, r]
            np.multiply(t, t, out=part)
            part *= inv[a, r] + inv_b[:, r]
            t *= 2
            t *= gap
            part -= t
            part *= self.wnorm[r]
            gain -= part
        # Migrations added: one each, unless a unit has moved already (see _added_one).
        moved_x, moved_o = self._moved(xs).any(), self._moved(os).any()
        if not (moved_x or moved_o):
            return gain, gain / 2
        added_x = self._added_one(xs[:, None], b[None, :]) if moved_x else 1
        added_o = self._added_one(os, np.full_like(os, a)) if moved_o else 1
        # gain / added where it adds some, else 4 × gain: factors of two, the same bits.
        return gain, gain * _SWAP_FACTOR[np.asarray(added_x + added_o) + 2]

    def _added_one(self, units: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Migrations each move (units[k] to targets[k]) adds: 1, 0 (already moved) or −1 (home)."""
        home = self.origin[units]
        away = self._moved(units)
        back = (targets == home) & ~self.broken_at_start[units]
        return np.where(away, np.where(back, -1, 0), 1)

    def move_all(self, moves: list[tuple[int, int]]) -> list[tuple[int, float]]:
        """Make ``moves`` (unit, target) in order; for each, where the unit was and the objective
        after it — as :meth:`objective` gives, for many moves at once."""
        out: list[tuple[int, float]] = []
        step = max(1, MOVES_AT_ONCE // self.node_load.size)
        for begin in range(0, len(moves), step):
            start = self.node_load.copy()
            touched: list[tuple[np.ndarray, np.ndarray]] = []
            for u, t in moves[begin : begin + step]:
                nodes = np.unique(np.append(self.where[self.units.members[u]], t))
                out.append((int(self.units.assign[u]), 0.0))
                self.move(u, t)
                touched.append((nodes, self.node_load[nodes]))
            loads = np.repeat(start[None], len(touched), axis=0)  # (k, N, R): after each move
            for k, (nodes, rows) in enumerate(touched):
                loads[k:, nodes] = rows
            found = self._objectives(loads)
            out[begin:] = [(src, j) for (src, _), j in zip(out[begin:], found, strict=True)]
            self._objective = found[-1]
        return out

    def _objectives(self, loads: np.ndarray) -> list[float]:
        """:meth:`objective` of each node load of ``loads`` (k, N, R), all at once."""
        return balance_objective(loads, self.cap, self.weights, self.group).tolist()

    def there_and_back(self, u: int, target: int) -> None:
        """Whole unit ``u`` moved to ``target`` and back, as :meth:`move` twice: its node's and
        the target's loads and commitments rounded as they are by that (adding a demand and
        taking it away can change a sum's last bit), the rest as it was."""
        src = int(self.units.assign[u])
        for load, d in (
            (self.node_load, self.units.demand[u]),
            (self.committed, self.units.need[u]),
        ):
            load[src] -= d
            load[target] += d
            load[target] -= d
            load[src] += d
        touched = [src, target, target, src]
        self._touched.extend(touched)
        self.version[touched] += 1
        for n in touched:
            self._kinds_on.pop(n, None)
        self._objective = None
        self._means = None

    def move(self, u: int, target: int) -> None:
        """Move unit ``u`` to ``target``: every member of a broken bundle leaves its own node."""
        units = self.units
        idx = units.members[u]
        if self.broken[u]:
            np.subtract.at(self.node_load, self.where[idx], units.guest_demand[idx])
            np.subtract.at(self.committed, self.where[idx], units.guest_need[idx])
            self.broken[u] = False
        else:
            src = int(units.assign[u])
            self.node_load[src] -= units.demand[u]
            self.committed[src] -= units.need[u]
        self.node_load[target] += units.demand[u]
        self.committed[target] += units.need[u]
        touched = [*self.where[idx].tolist(), int(units.assign[u]), target]
        self._touched.extend(touched)
        self.version[touched] += 1
        for n in touched:
            self._kinds_on.pop(n, None)
        self._units_at[int(units.assign[u])].discard(u)
        self._units_at[target].add(u)
        units.assign[u] = target
        self.where[idx] = target
        self._objective = None
        self._means = None

    # ---------------------------------------------------------------------------------------

    def violating_units(self) -> list[int]:
        """Units that break a hard constraint where they are now, most urgent first."""
        units = self.units
        out: list[int] = []
        assign = units.assign
        here_ok = units.static_ok[np.arange(len(assign)), assign]
        on_unusable = ~self.cons.usable[assign]
        for u in np.nonzero((~here_ok | on_unusable) & units.movable)[0].tolist():
            out.append(u)
        # Hard anti-affinity broken (a member of the unit shares a node with a member of a
        # partner unit): the unit with the larger label moves, or the one that can.
        for u in np.nonzero(units.movable & self.has_neg)[0].tolist():
            partners = units.neg_guests[u]
            shared = np.isin(self.where[partners], self.occupied(u))
            clash = units.unit_of[partners[shared]]
            if any(units.label[u] > units.label[c] or not units.movable[c] for c in clash.tolist()):
                out.append(u)
        # Split hard-affinity bundles are gathered by moving the whole bundle; one anchored by
        # members that cannot move, by moving the others to them.
        out.extend(np.nonzero((units.movable | units.anchored) & self.broken)[0].tolist())
        return list(dict.fromkeys(out))

    def overloaded_units(self) -> list[int]:
        """For each node over a capacity limit, its movable units in the order to try moving them.

        First the units that cover the excess alone (in every dimension), smallest first — one
        migration, the cheapest that does it; then the others, largest first (their share of the
        node's limits). All of them: when one can go nowhere, the next one is tried.
        """
        out: list[int] = []
        over = self.committed > self.limit + self.tol
        broken = np.nonzero(self.broken & self.units.movable)[0].tolist()
        for n in np.nonzero(over.any(axis=1))[0].tolist():
            excess = np.maximum(self.committed[n] - self.limit[n], 0.0)
            here = (self.units.assign == n) & self.units.movable & ~self.broken
            # A broken bundle with members here relieves the node of those members.
            for u in broken:
                here[u] = bool(np.any(self.where[self.units.members[u]] == n))
            on = np.nonzero(here)[0]
            need = self.units.need[on].copy()
            for k in np.nonzero(self.broken[on])[0].tolist():
                idx = self.units.members[on[k]]
                need[k] = self.units.guest_need[idx[self.where[idx] == n]].sum(axis=0)
            limit = self.limit[n]
            size = np.where(limit > 0, need / np.where(limit > 0, limit, 1.0), 0.0).max(axis=1)
            alone = np.all(need >= excess, axis=1)
            # Keys, last primary: covering ones first, by size up; the rest by size down.
            order = on[np.lexsort((on, np.where(alone, size, -size), ~alone))]
            out.extend(order.tolist())
        return out


#: An exchange's score over its gain, by the migrations it adds (−2 to 2): 1 / added, or 4.
_SWAP_FACTOR = np.array([4.0, 4.0, 4.0, 1.0, 0.5])


@dataclass
class _Kinds:
    """Units by kind: ``units`` (by index); per kind, one unit (``first``) and how many there are
    (``count``); the units' positions kind after kind (``by_kind``), and where each kind's start
    there (``start``)."""

    units: np.ndarray
    first: np.ndarray
    count: np.ndarray
    by_kind: np.ndarray
    start: np.ndarray

    @classmethod
    def of(cls, units: np.ndarray, first: np.ndarray, kind: np.ndarray) -> _Kinds:
        """``units`` of the kinds ``kind`` (each one's), ``first``: one position of each."""
        count = np.bincount(kind, minlength=first.size)
        by_kind = np.argsort(kind, kind="stable")
        return cls(units, units[first], count, by_kind, np.cumsum(count) - count)

    @classmethod
    def join(cls, parts: list[_Kinds]) -> _Kinds:
        """The units of ``parts`` one part after the other, each part's kinds its own."""
        at = np.cumsum([0] + [p.units.size for p in parts]).tolist()
        return cls(
            np.concatenate([p.units for p in parts]),
            np.concatenate([p.first for p in parts]),
            np.concatenate([p.count for p in parts]),
            np.concatenate([p.by_kind + k for p, k in zip(parts, at, strict=False)]),
            np.concatenate([p.start + k for p, k in zip(parts, at, strict=False)]),
        )


def _first_allowed(
    check: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x: _Kinds,
    o: _Kinds,
    xk: np.ndarray,
    ok: np.ndarray,
) -> tuple[int, int, int] | None:
    """The first allowed pair of units, by unit index, of the kind pairs (``xk[i]``, ``ok[i]``):
    its positions in ``x`` and ``o``, and ``i``. None if no pair is allowed."""
    # The very first pair, most often allowed: the lowest unit of the kinds of x, with the
    # lowest unit of the kinds of o paired with its kind.
    lowest_x, lowest_o = x.by_kind[x.start[xk]], o.by_kind[o.start[ok]]
    with_first = np.flatnonzero(xk == xk[np.argmin(x.units[lowest_x])])
    i = int(with_first[np.argmin(o.units[lowest_o[with_first]])])
    if check(lowest_x[i : i + 1], lowest_o[i : i + 1])[0]:
        return int(lowest_x[i]), int(lowest_o[i]), i
    xs, os, kinds = _unit_pairs(x, o, xk, ok)
    order = np.lexsort((o.units[os], x.units[xs]))
    allowed = check(xs[order], os[order])
    if not allowed.any():
        return None
    pair = order[int(np.argmax(allowed))]
    return int(xs[pair]), int(os[pair]), int(kinds[pair])


def _runs(reach: np.ndarray, ends: np.ndarray, least: int) -> Iterable[tuple[int, int]]:
    """Runs [begin, end) of kind pairs, each of whole tie groups (``ends``: where each ends) and
    of at least ``least`` pairs of units but the last (``reach``: how many up to each)."""
    begin = 0
    while begin < reach.size:
        done = int(reach[begin - 1]) if begin else 0
        j = int(np.searchsorted(reach[ends - 1], done + least))
        end = int(ends[j]) if j < ends.size else reach.size
        yield begin, end
        begin = end


def _unit_pairs(
    x: _Kinds, o: _Kinds, xk: np.ndarray, ok: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of units of the kind pairs (``xk[i]``, ``ok[i]``): the positions of the units
    in ``x`` and ``o``, and the kind pair (i) each pair of units is of."""
    sizes = x.count[xk] * o.count[ok]
    kinds = np.repeat(np.arange(xk.size), sizes)
    offset = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = o.count[ok[kinds]]
    xs = x.by_kind[x.start[xk[kinds]] + offset // width]
    os = o.by_kind[o.start[ok[kinds]] + offset % width]
    return xs, os, kinds


def _fraction_rows(load: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """``load / cap``, 0 where the capacity is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cap > 0, load / np.where(cap > 0, cap, 1.0), 0.0)


def _distinct_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of ``key`` (n, k): one index of each distinct row, and for each row which of
    those it equals."""
    order = np.lexsort(key.T[::-1])
    ranked = key[order]
    new = np.ones(len(key), dtype=bool)
    new[1:] = np.any(ranked[1:] != ranked[:-1], axis=1)
    inverse = np.empty(len(key), dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse


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
    for u in np.unique(unit_of[apart & (unit_of >= 0)]).tolist():
        partners: set[int] = set()
        for j in members[u].tolist():
            partners.update(unit_of[cons.hard_neg[j]].tolist())
        partners.discard(u)
        partners.discard(-1)
        if partners:
            out[u] = np.concatenate([members[p] for p in sorted(partners)]).astype(np.intp)
    return out


def _shed_plan(state: _State) -> np.ndarray:
    """(U,) units planned to leave the nodes above the band in every weighted resource.

    Per such node, with its excess ``e`` over the mean (per weighted resource) and ``h`` half the
    band: for each of :data:`PLAN_DIRECTIONS` directions, the node's movable units in the order of
    their projection (demand / ``e``) on the direction, each taken unless it would push the total
    beyond ``e + h`` in some resource, until the total reaches ``e − h`` in every one. The
    direction with the fewest units wins, a shortfall counting :data:`PLAN_SHORTFALL` units per
    missing typical unit. Vectorised over directions and over :data:`PLAN_CHUNK` nodes at a time.
    """
    units = state.units
    plan = np.zeros(len(units.assign), dtype=bool)
    counted = state.weights > 0
    if state.usable.sum() < 2 or not counted.any():
        return plan
    excess = (state.node_load - state.mean() * state.cap)[:, counted]  # (N, R')
    half = (state.goal / 2 * state.cap)[:, counted]
    hot = np.nonzero(state.usable & np.all(excess > np.maximum(half, 0.0), axis=1))[0]
    if hot.size == 0:
        return plan
    dims = int(counted.sum())
    if dims == 2:
        angles = np.linspace(-np.pi / 2, np.pi, PLAN_DIRECTIONS)
        directions = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    else:
        directions = np.ones((1, dims))
    candidate = units.movable & ~state.broken & state.usable[units.assign]
    typical = state.typical[counted]
    for chunk in range(0, hot.size, PLAN_CHUNK):
        nodes = hot[chunk : chunk + PLAN_CHUNK]
        members = [np.nonzero(candidate & (units.assign == n))[0] for n in nodes.tolist()]
        width = max((m.size for m in members), default=0)
        if width == 0:
            continue
        index = np.full((len(nodes), width), -1, dtype=np.intp)
        for k, m in enumerate(members):
            index[k, : m.size] = m
        valid = index >= 0
        e = excess[nodes]  # (H, R')
        demand = np.where(valid[:, :, None], units.demand[np.maximum(index, 0)][:, :, counted], 0.0)
        scaled = demand / e[:, None, :]  # (H, M, R')
        low = 1 - half[nodes] / e
        high = 1 + half[nodes] / e
        score = np.where(valid[:, :, None], scaled @ directions.T, -np.inf)  # (H, M, K)
        order = np.argsort(-score, axis=1, kind="stable").transpose(0, 2, 1)  # (H, K, M)
        rows = np.arange(len(nodes))[:, None]
        total = np.zeros((len(nodes), len(directions), dims))
        taken = np.zeros(order.shape, dtype=bool)
        active = np.ones((len(nodes), len(directions)), dtype=bool)
        for p in range(width):
            item = order[:, :, p]  # (H, K)
            grown = total + scaled[rows, item]
            take = active & valid[rows, item] & _every(grown <= high[:, None, :])
            total = np.where(take[:, :, None], grown, total)
            taken[:, :, p] = take
            active &= ~_every(total >= low[:, None, :])
            if not active.any():
                break
        short = (np.maximum(low[:, None, :] - total, 0.0) * (e / typical)[:, None, :]).sum(axis=2)
        count = taken.sum(axis=2)
        best = np.argmin(count + PLAN_SHORTFALL * short, axis=1)  # (H,)
        for k in range(len(nodes)):
            chosen = order[k, best[k]][taken[k, best[k]]]
            plan[index[k, chosen]] = True
    return plan


def _every(mask: np.ndarray) -> np.ndarray:
    """``mask.all(axis=-1)``, one column at a time (a reduction over a short last axis is slow)."""
    out = mask[..., 0].copy()
    for k in range(1, mask.shape[-1]):
        out &= mask[..., k]
    return out


def _window(
    state: _State, f: np.ndarray, usable_idx: np.ndarray, wide: int
) -> tuple[np.ndarray, np.ndarray]:
    """Source and target nodes looked at in a round.

    All nodes on small clusters. On big ones, nodes are ranked by what moving a typical guest
    there would do: their fractions projected on the mean movable demand, weighted as the objective
    weighs resources (``Σ_r w_r d̄_r f_nr / Σ_n C_nr``). The ``wide`` highest are sources, the
    ``wide`` lowest targets; the ``wide / 2`` nodes that contribute most to the objective
    (``C_n Σ_r w_r (f_nr − f̄_r)²``) join both sides — a node high in one resource and low in
    another trades both ways — and unusable nodes are sources, which must empty.
    """
    n_nodes = len(f)
    if n_nodes <= wide:
        return np.arange(n_nodes, dtype=np.intp), usable_idx
    projected = (f * (state.wnorm * state.mean_demand)[None, :]).sum(axis=1)[usable_idx]
    mean = f[usable_idx].mean(axis=0)
    contribution = ((state.cap * (f - mean) ** 2) * state.wnorm[None, :]).sum(axis=1)
    top = usable_idx[np.argsort(-contribution[usable_idx], kind="stable")[: max(wide // 2, 1)]]
    order = np.argsort(-projected, kind="stable")
    sources = usable_idx[order[:wide]]
    targets = usable_idx[order[::-1][:wide]]
    unusable = np.nonzero(~state.usable)[0]
    return np.union1d(np.union1d(sources, top), unusable), np.union1d(targets, top)


def _pick(
    state: _State,
    units: np.ndarray,
    targets: np.ndarray,
    *,
    forced: bool,
    shaped: bool = True,
    limit: int = 1 << 30,
) -> list[tuple[float, int, int]]:
    """Best disjoint moves of a round: [(gain, unit, target)], each node used at most once.

    Forced (repair) moves go to the target with the largest objective gain, whatever it is.
    Balancing moves must lower the objective; among them, when ``shaped``, the band distance they
    remove decides (the objective gain where no move removes any), else the objective gain; then
    the cheaper migration.
    """
    if units.size == 0 or targets.size == 0:
        return []
    # Units alike score alike: one row per kind of unit (``kind``: each unit's row).
    kinds, kind = (np.arange(units.size),) * 2 if forced else _kinds(state, units)
    gain, score = _scores(state, units, kinds, targets, forced, shaped)
    rows, cols, n_sources = _candidates(state, units, kind, score, forced)
    if rows.size == 0:
        return []
    s = score[kind[rows], cols]
    cost = state.units.cost[units[rows]]
    if forced:
        order = np.lexsort((targets[cols], units[rows], -s))
    else:
        # Fewest moves: best score first; among scores within 1 %, the cheaper migration.
        bucket = np.floor(np.log(s) / np.log(1.01))
        order = np.lexsort((targets[cols], units[rows], cost, -bucket))
    rows, cols = rows[order], cols[order]
    taken = _disjoint(
        state.units.assign[units[rows]],
        targets[cols],
        min(n_sources, len(targets), limit),
        len(state.cluster.nodes),
    )
    return [
        (float(gain[kind[rows[k]], cols[k]]), int(units[rows[k]]), int(targets[cols[k]]))
        for k in taken
    ]


class _Idle:
    """The windows in which a round found no move that lowers the objective (no pick at all),
    with the versions of their nodes then: a move's gain depends only on its two nodes' loads,
    and whether it is allowed only on its unit and target, so a window found idle stays idle
    for the pairs of nodes no move has changed since. A round's search then looks first at the
    other pairs only; when those offer no move either, it finds none, without the whole search.
    """

    def __init__(self, state: _State) -> None:
        self.state = state
        #: window size -> (sources, their versions, targets, their versions)
        self.windows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def record(self, sources: np.ndarray, targets: np.ndarray, window: int) -> None:
        """The search of every movable unit on ``sources`` to ``targets`` found no move."""
        version = self.state.version
        self.windows[window] = (sources, version[sources], targets, version[targets])

    def pick(
        self,
        cand: np.ndarray,
        sources: np.ndarray,
        targets: np.ndarray,
        window: int,
        limit: int,
        shaped: bool,
    ) -> list[tuple[float, int, int]]:
        """:func:`_pick` (balancing) of ``cand`` (units on ``sources``) to ``targets``."""
        state = self.state
        kept = self.windows.get(window)
        if kept is not None:
            idle_sources = _unchanged(state, kept[0], kept[1], len(state.cluster.nodes))
            idle_targets = _unchanged(state, kept[2], kept[3], len(state.cluster.nodes))
            new_units = cand[~idle_sources[state.units.assign[cand]]]
            new_targets = targets[~idle_targets[targets]]
            if not _pick(state, new_units, targets, forced=False, shaped=shaped, limit=1) and not (
                _pick(state, cand, new_targets, forced=False, shaped=shaped, limit=1)
            ):
                return []
        return _pick(state, cand, targets, forced=False, shaped=shaped, limit=limit)


def _unchanged(state: _State, nodes: np.ndarray, versions: np.ndarray, n_nodes: int) -> np.ndarray:
    """(N,) the ``nodes`` still at ``versions``."""
    mask = np.zeros(n_nodes, dtype=bool)
    mask[nodes[state.version[nodes] == versions]] = True
    return mask


def _kinds(state: _State, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One unit (its position) of each kind, and each unit's kind: units of a kind
    (:meth:`_State.unit_kinds`) on the same node score alike."""
    kind, n_kinds = state.unit_kinds()
    code = state.units.assign[units].astype(np.int64) * n_kinds + kind[units]
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse


def _scores(
    state: _State,
    units: np.ndarray,
    kinds: np.ndarray,
    targets: np.ndarray,
    forced: bool,
    shaped: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(len(kinds), len(targets)) the objective gain of moving one unit of each kind (``kinds``:
    positions in ``units``) to each target, and what the move is chosen by, -inf where it may not
    be made: the objective gain (forced: any; else a positive one), or when ``shaped`` the band
    distance removed by a move that lowers the objective, if any move removes some."""
    rows = units[kinds]
    # The gains' matrix product rounds as it does for every unit only with two rows or more (a
    # single row takes numpy's vector path): a lone kind of several units is computed twice.
    twice = rows.size == 1 and units.size > 1
    gain = state.gains(np.repeat(rows, 2) if twice else rows, targets)[: rows.size]
    if forced:
        return gain, np.where(state.allowed(rows, targets), gain, -np.inf)
    # Whether a move is allowed, only for the kinds with a move that lowers the objective.
    lowers = gain > 0
    some = np.nonzero(lowers.any(axis=1))[0]
    ok = np.zeros(gain.shape, dtype=bool)
    if some.size:
        ok[some] = state.allowed(rows[some], targets)
    score = np.where(ok & lowers, gain, -np.inf)
    live = np.isfinite(score)
    count = np.count_nonzero(live) if shaped else 0
    if count:
        # The band distance of the moves that may be made only: where few may, at theirs alone.
        if count * BAND_AT_MOST < live.size:
            at = np.nonzero(live)
            band = np.full(score.shape, -np.inf)
            found = state.band_gains(rows, targets, at)
            band[at] = np.where(found > 1e-9, found, -np.inf)
        else:
            band = state.band_gains(rows, targets)
            band = np.where(live & (band > 1e-9), band, -np.inf)
        if np.isfinite(band).any():
            return gain, band
    return gain, score


def _candidates(
    state: _State, units: np.ndarray, kind: np.ndarray, score: np.ndarray, forced: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """The candidate moves (unit position, target position) of a round, best first: at most a few
    per unit, so a busy target does not hide the unit's next-best choice; and the number of
    source nodes they leave. ``score``: one row per kind, ``kind`` each unit's."""
    best = score.max(axis=1)[kind]
    unit_rows = np.nonzero(np.isfinite(best))[0]
    if unit_rows.size == 0:
        return unit_rows, unit_rows, 0
    if not forced and unit_rows.size > 8:
        # Only a few units of each source node can be taken in a round: keep each source's
        # eight best, ordered by their best score.
        src = state.units.assign[units[unit_rows]]
        order = np.lexsort((units[unit_rows], -best[unit_rows], src))
        first = np.r_[True, src[order][1:] != src[order][:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        rank = np.arange(len(order)) - group_start
        unit_rows = np.sort(unit_rows[order[rank < 8]])
    # Each kept unit's best few targets, so a busy target does not hide the next-best choice.
    per_unit = min(64, score.shape[1])
    kept, of_kept = np.unique(kind[unit_rows], return_inverse=True)
    top = np.argsort(-score[kept], axis=1, kind="stable")[:, :per_unit][of_kept]
    rows = np.repeat(unit_rows, per_unit)
    cols = top.ravel()
    keep = np.isfinite(score[kind[rows], cols])
    n_sources = len(np.unique(state.units.assign[units[unit_rows]]))
    return rows[keep], cols[keep], n_sources


def _disjoint(sources: np.ndarray, targets: np.ndarray, most: int, n_nodes: int) -> list[int]:
    """The moves (source, target) a greedy pass in the order given takes: each one whose nodes
    no move taken before it uses, up to ``most`` moves. (A unit's second move would leave a
    node used already.) The next one is looked for a block at a time, twice as long each time."""
    used = np.zeros(n_nodes, dtype=bool)
    taken: list[int] = []
    begin, block = 0, PICK_BLOCK
    while begin < sources.size and len(taken) < most:
        src, tgt = sources[begin : begin + block], targets[begin : begin + block]
        free = ~(used[src] | used[tgt])
        k = int(np.argmax(free))
        if not free[k]:
            begin, block = begin + block, 2 * block
            continue
        used[src[k]] = used[tgt[k]] = True
        taken.append(begin + k)
        begin, block = begin + k + 1, PICK_BLOCK
    return taken


def _exact_repair(
    state: _State, stuck: list[int]
) -> tuple[list[tuple[int, int, str]], dict[str, Any]]:
    """Moves ``(unit, target, reason)`` that repair the ``stuck`` units with the exact model
    (:func:`~opendrs.engine.strategies.optimal.solve_repair`), moving other units to make room,
    and a summary for the proposal's options. No moves when it finds no repair.

    First a small model: the stuck units (at most :data:`REPAIR_UNITS`) on the nodes that lack
    least to take them, and the units there, which may stay, go to one of those nodes or to one
    of the nodes with the most room. Then, if it finds nothing and the cluster is small, every
    movable unit on every node. A unit that no allowed node could hold even empty stays out.
    """
    units = state.units
    movable = [u for u in dict.fromkeys(stuck) if units.movable[u] or units.anchored[u]]
    must = np.array(movable[:REPAIR_UNITS], dtype=np.intp)
    fit = _repair_domains(state, must)
    info: dict[str, Any] = {"exact": "not run", "units": 0, "nodes": 0}
    info["hopeless"] = int((~fit.any(axis=1)).sum())
    must, fit = must[fit.any(axis=1)], fit[fit.any(axis=1)]
    if must.size == 0:
        return [], info
    n_movable, usable = np.count_nonzero(units.movable), state.usable
    for whole in (False, True):
        model, allow = _repair_neighbourhood(state, must, fit, whole=whole)
        # Complete: every stuck unit, every movable unit, every usable node in the model.
        complete = len(movable) <= REPAIR_UNITS and len(model) == n_movable
        complete = bool(complete and np.all(allow[:, usable]))
        model, domain = _repair_model_domains(state, model, allow)
        found = solve_repair(*_repair_inputs(state, model, domain), time_limit=REPAIR_TIME_LIMIT)
        nodes = np.unique(np.concatenate(domain)).size if domain else 0
        info.update(exact=found.status, units=len(model), nodes=nodes, complete=complete)
        info["deterministic"] = found.deterministic
        small = n_movable * np.count_nonzero(usable) <= REPAIR_PAIRS
        if found.choice is not None or complete or not small:
            break
    if found.choice is None:
        return [], info
    chosen = dict(zip(model, found.choice.tolist(), strict=True))
    moving = [u for u in model if state.broken[u] or chosen[u] != int(units.assign[u])]
    first = set(must.tolist())
    moving.sort(key=lambda u: (u in first, u))  # the room first, then the repairs

    def reason(u: int) -> str:
        if u not in first:
            return "repair: makes room (exact)"
        return "repair: maintenance (exact)" if _in_maintenance(state, u) else "repair (exact)"

    return [(u, chosen[u], reason(u)) for u in moving], info


def _in_maintenance(state: _State, u: int) -> bool:
    """Whether unit ``u`` is on a node that takes no guests: in maintenance (a unit on an
    offline node does not move)."""
    return not state.usable[int(state.units.assign[u])]


def _repair_cause(state: _State, u: int, phase: str) -> str:
    """What a repair of unit ``u`` in ``phase`` (``rules`` or ``capacity``) mends, as its move's
    reason says it: ``maintenance`` for a unit on a node in maintenance, else the phase."""
    return "maintenance" if _in_maintenance(state, u) else phase


def _repair_domains(state: _State, which: np.ndarray) -> np.ndarray:
    """(len(which), N): the nodes each unit may end on in a repair — usable, allowed, roomy
    enough when empty of guests; for a movable or anchored unit only."""
    units = state.units
    empty = state.limit - state.cons.capacity.base + state.tol
    fits = np.all(units.need[which][:, None, :] <= empty[None, :, :], axis=2)
    moves = units.movable[which] | units.anchored[which]
    return units.static_ok[which] & state.usable[None, :] & fits & moves[:, None]


def _repair_neighbourhood(
    state: _State, must: np.ndarray, fit: np.ndarray, *, whole: bool
) -> tuple[list[int], np.ndarray]:
    """The units of an exact repair model and the nodes (len, N) each may end on (see
    :func:`_exact_repair`); ``fit``: the repair domains of the ``must`` units."""
    units, usable = state.units, state.usable
    movable = np.nonzero(units.movable)[0]
    if whole:
        return movable.tolist(), np.broadcast_to(usable, (movable.size, usable.size))
    free = state.limit - state.committed
    scale = np.maximum(state.limit, 1.0)
    lack = (np.maximum(units.need[must][:, None, :] - free[None, :, :], 0.0) / scale).sum(axis=2)
    lack = np.where(fit, lack, np.inf)
    wanted = min(max(REPAIR_TARGETS, 2 * must.size), 4 * REPAIR_TARGETS)
    best = np.argsort(lack, axis=1, kind="stable")[:, :wanted]
    votes = np.zeros(usable.size)
    for row, cols in enumerate(best):
        votes[cols[np.isfinite(lack[row, cols])]] += 1
    targets = np.zeros(usable.size, dtype=bool)
    targets[np.argsort(-votes, kind="stable")[: min(np.count_nonzero(votes), wanted)]] = True
    slack = np.where(usable, (free / scale).min(axis=1), -np.inf)
    spares = np.zeros(usable.size, dtype=bool)
    spares[np.argsort(-slack, kind="stable")[:REPAIR_SPARES]] = True
    spares &= usable
    model = set(must.tolist())
    for u in must.tolist():
        model.update(units.unit_of[units.neg_guests[u]].tolist())
    model.update(movable[targets[units.assign[movable]] & ~state.broken[movable]].tolist())
    chosen = sorted(u for u in model if u >= 0 and (units.movable[u] or units.anchored[u]))
    allow = np.zeros((len(chosen), usable.size), dtype=bool)
    for k, u in enumerate(chosen):
        allow[k] = targets | spares
        allow[k, state.where[units.members[u]]] = True
    return chosen, allow


def _repair_model_domains(
    state: _State, model: list[int], allow: np.ndarray
) -> tuple[list[int], list[np.ndarray]]:
    """The model's units and their domains (within ``allow``): no node where a hard
    anti-affinity partner left out of the model is; a unit left with no node is left out (it
    stays), until none is."""
    units = state.units
    fit = _repair_domains(state, np.array(model, dtype=np.intp)) & allow
    inside = np.zeros(len(units.assign), dtype=bool)
    keep = np.ones(len(model), dtype=bool)
    has_neg = np.array([units.neg_guests[u].size > 0 for u in model], dtype=bool)
    while True:
        inside[:] = False
        inside[np.array(model, dtype=np.intp)[keep]] = True
        domain = fit.copy()
        for k in np.nonzero(keep & has_neg)[0].tolist():
            partners = units.neg_guests[model[k]]
            of = units.unit_of[partners]
            where = state.where[partners[(of < 0) | ~inside[np.maximum(of, 0)]]]
            domain[k, where[where >= 0]] = False
        empty = keep & ~domain.any(axis=1)
        if not empty.any():
            return [u for u, k in zip(model, keep, strict=True) if k], [
                np.nonzero(domain[k])[0] for k in np.nonzero(keep)[0]
            ]
        keep &= ~empty


def _repair_inputs(
    state: _State, model: list[int], domain: list[np.ndarray]
) -> tuple[
    np.ndarray,
    np.ndarray,
    tuple[str, ...],
    list[np.ndarray],
    list[np.ndarray],
    list[tuple[int, int]],
]:
    """The arguments of :func:`~opendrs.engine.strategies.optimal.solve_repair`: need, room,
    dims, domains, costs and apart pairs. A cost is the net migrations' (from where each guest
    started) first, then how full the target is now (up to 100): the roomiest targets, which
    need the fewest parking moves, among equally cheap repairs."""
    units, guests, settings = state.units, state.cluster.guests, state.cluster.settings
    fill = np.minimum(50 * (state.committed / np.maximum(state.limit, 1.0)).max(axis=1), 100)
    fill = np.maximum(fill, 0).astype(np.int64)
    scale = 101 * (len(model) + 1)
    index = {u: i for i, u in enumerate(model)}
    room = state.limit - state.committed
    if model:
        members = np.concatenate([units.members[u] for u in model])
        np.add.at(room, state.where[members], units.guest_need[members])
    start = state.loads.assign
    cost: list[np.ndarray] = []
    apart: list[tuple[int, int]] = []
    for i, u in enumerate(model):
        partners = np.unique(units.unit_of[units.neg_guests[u]]).tolist()
        apart.extend((i, index[p]) for p in partners if index.get(p, -1) > i)
        idx = units.members[u]
        price = np.array([migration_cost(guests[j], settings) for j in idx.tolist()])
        away = start[idx][:, None] != domain[i][None, :]
        net = (price[:, None] * away).sum(axis=0).astype(np.int64)
        cost.append(np.where(net > 0, scale * net + fill[domain[i]], 0))
    need = units.need[model] if model else np.zeros((0, room.shape[1]))
    return need, room, state.cons.capacity.dims, domain, cost, apart


def _exact_note(info: dict[str, Any]) -> str:
    """The note of an exact repair: what the model was and what it found."""
    text = f"exact repair: CP-SAT {info['exact']}"
    if info["units"]:
        text += f" over {info['units']} units and {info['nodes']} nodes"
    if info["hopeless"]:
        text += f"; {info['hopeless']} units fit no allowed node even empty"
    if "needs" in info:
        text += f"; not made: {info['needs']} moves, more than max_moves {info['max_moves']}"
    return text


def _check_options(
    target_spread: float, margin: float, max_moves: int | None, wide: int, swaps: bool
) -> None:
    """ValueError naming the first bad option."""

    def number(name: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
            raise ValueError(f"{name}: expected a finite number, got {value!r}")
        if value < 0:
            raise ValueError(f"{name}: must not be negative, got {value!r}")

    number("target_spread", target_spread)
    number("margin", margin)
    if max_moves is not None and (
        isinstance(max_moves, bool) or not isinstance(max_moves, int) or max_moves < 0
    ):
        raise ValueError(f"max_moves: expected a whole number ≥ 0, got {max_moves!r}")
    if isinstance(wide, bool) or not isinstance(wide, int) or wide < 1:
        raise ValueError(f"wide: expected a whole number ≥ 1, got {wide!r}")
    if not isinstance(swaps, bool):
        raise ValueError(f"swaps: expected true or false, got {swaps!r}")


def propose_balance(
    cluster: Cluster,
    *,
    forbidden: Iterable[tuple[str, str]] = (),
    constraints: Constraints | None = None,
    loads: LoadModel | None = None,
    target_spread: float = DEFAULT_TARGET_SPREAD,
    margin: float = DEFAULT_MARGIN,
    max_moves: int | None = None,
    wide: int = DEFAULT_WIDE,
    swaps: bool = True,
) -> Proposal:
    """Balance the cluster to ``target_spread`` with the fewest and smallest migrations.

    ``margin`` is the least fall of the balance σ, in percentage points, a move must bring per
    percent of the cluster's total migration cost it spends; ``max_moves`` caps the migrations
    (None: no cap); ``wide`` bounds the sources and targets looked at per round on big clusters.
    ``constraints`` and ``loads`` are the models a cycle view built already (capacity checked on
    its usage, ``forbidden`` not yet refused: :func:`constraints_for`; ``cluster``'s balance
    loads); without them they are built from ``cluster``.
    """
    _check_options(target_spread, margin, max_moves, wide, swaps)
    options = {
        "target_spread": target_spread,
        "margin": margin,
        "max_moves": max_moves,
        "wide": wide,
        "swaps": swaps,
    }
    cons = constraints_for(cluster, forbidden, constraints)
    loads = loads if loads is not None else LoadModel.build(cluster)
    cache: dict[str, Any] = {}
    proposal, balanced = _propose(cluster, cons, loads, options, shaped=True, cache=cache)
    if not balanced and len(cluster.guests) <= PLAIN_GUESTS:
        # With few, big guests per node the shaped search can end where no move or exchange
        # pays for itself; the plain one (no plan, moves chosen by objective gain) takes
        # another path, and is kept if it reaches the target. It repeats the whole search:
        # on a big cluster that doubles the time, for a path that did not reach the target
        # there either (#15), so it runs on small clusters only.
        plain, plain_balanced = _propose(cluster, cons, loads, options, shaped=False, cache=cache)
        if plain_balanced:
            return plain
    return proposal


def _propose(
    cluster: Cluster,
    cons: Constraints,
    loads: LoadModel,
    options: dict[str, Any],
    *,
    shaped: bool,
    cache: dict[str, Any],
) -> tuple[Proposal, bool]:
    """One search; ``shaped``: with the shedding plan and band-ordered moves. Also: balanced?

    ``cache`` keeps the exact repair for the second search, which starts from the same state.
    """
    target_spread: float = options["target_spread"]
    margin: float = options["margin"]
    max_moves: int | None = options["max_moves"]
    wide: int = options["wide"]
    swaps: bool = options["swaps"]
    state = _State(cluster, cons, loads)
    units = state.units
    before = cluster_imbalance(cluster, loads=state.loads)
    start = state.origin
    history: list[tuple[int, int, int, float, float, str]] = []  # unit, src, tgt, J0, J1, why
    limit = max_moves if max_moves is not None else 10**9
    weighted = state.weights > 0
    n_nodes = len(cluster.nodes)
    all_nodes = np.arange(n_nodes, dtype=np.intp)

    def record(u: int, t: int, why: str) -> None:
        j0 = state.objective()
        src = int(units.assign[u])
        state.move(u, t)
        history.append((u, src, t, j0, state.objective(), why))

    def record_all(moves: list[tuple[int, int]], why: str) -> None:
        # As record, move after move; the objectives after each computed at once.
        j0 = state.objective()
        for (u, t), (src, j1) in zip(moves, state.move_all(moves), strict=True):
            history.append((u, src, t, j0, j1, why))
            j0 = j1

    # 1. Repair: units that break a hard rule now, then nodes over capacity.
    stuck: list[int] = []
    for phase in ("rules", "capacity"):
        for _ in range(len(units.assign) + 1):
            todo = state.violating_units() if phase == "rules" else state.overloaded_units()
            repaired = {h[0] for h in history if h[5] != "balance"}
            todo = [u for u in todo if u not in repaired]
            if not todo or len(history) >= limit:
                break
            # The units, in the order given, that have an allowed target at all: one vectorised
            # check of them all rather than a search per unit, so a node full of units that can
            # go nowhere costs one pass per repair move, not one search per unit.
            candidates = np.array(todo, dtype=np.intp)
            placeable = candidates[state.allowed(candidates, all_nodes).any(axis=1)]
            move: tuple[int, int] | None = None
            for u in placeable.tolist():
                picks = _pick(state, np.array([u], dtype=np.intp), all_nodes, forced=True)
                if picks:
                    move = (u, picks[0][2])
                    break
            if move is None:
                stuck.extend(todo)
                break
            record(move[0], move[1], "repair: " + _repair_cause(state, move[0], phase))
    exact: dict[str, Any] | None = None
    if stuck and len(history) < limit:
        # The greedy repair moves only the units that break something: when one can go
        # nowhere, the exact model may move others to make room (the same in both passes).
        if "exact" not in cache:
            cache["exact"] = _exact_repair(state, list(dict.fromkeys(stuck)))
        pairs, exact = cache["exact"]
        if len(history) + len(pairs) > limit:
            # All or nothing: part of a repair may not repair anything.
            exact = {**exact, "needs": len(pairs), "max_moves": max_moves}
            pairs = []
        for u, t, why in pairs:
            record(u, t, why)
        if pairs:
            stuck = [*state.violating_units(), *state.overloaded_units()]

    # 2. Balance.
    stopped = "move limit reached"
    reached_goal = False
    scale = 1e4  # objective in squared percentage points
    total_cost = max(float(units.cost.sum()), 1.0)
    # A spread finer than the smallest movable step on the smallest node cannot be asked for.
    movable_demand = units.demand[units.movable]
    usable_cap = state.cap[state.usable]
    if movable_demand.size and usable_cap.size:
        positive = np.where(movable_demand > 0, movable_demand, np.inf)
        grain = np.nan_to_num(positive.min(axis=0) / usable_cap.min(axis=0), posinf=0.0)
    else:
        grain = np.zeros(len(RESOURCES))
    goal = np.maximum(target_spread, grain) + 1e-12
    state.goal = goal

    def balanced() -> bool:
        return bool(np.all(state.spreads()[weighted] <= goal[weighted]))

    def pays(u: int, gain: float, objective: float) -> bool:
        """Whether moving ``u`` for ``gain`` pays for itself (free for a unit already moved)."""
        if state.is_moved(u):
            return gain > 1e-9 * objective
        drop = np.sqrt(max(objective, 0.0)) - np.sqrt(max(objective - gain, 0.0))
        return bool(drop * 100 >= margin * 100 * units.cost[u] / total_cost)

    # Balancing never leaves the objective above what it is now (repairs may raise it).
    ceiling = state.objective()

    # 2a. The shedding plan of the nodes above the band: its units move first (in the rounds).
    plan = np.zeros(len(units.assign), dtype=bool)
    if shaped and not balanced():
        plan = _shed_plan(state)

    # 2b. Rounds of moves (and exchanges) until balanced.
    idle = _Idle(state)
    while len(history) < limit:
        spreads = state.spreads()
        if np.all(spreads[weighted] <= goal[weighted]):
            stopped = _balanced_reason(target_spread, spreads)
            reached_goal = True
            break
        f = state.fractions()
        usable_idx = np.nonzero(state.usable)[0]
        objective = state.objective()
        window = wide
        while True:
            sources, targets = _window(state, f, usable_idx, window)
            cand = state.units_on(sources)
            fresh = ~state.moved()
            shedding = bool((plan & fresh).any())
            if shedding:
                cand = cand[plan[cand] & fresh[cand]]
            picks = idle.pick(cand, sources, targets, window, max(4, n_nodes // 8), shaped)
            if not picks and not shedding:
                idle.record(sources, targets, window)
            # Widen when the window has nothing, within a budget of (unit, target) pairs.
            wider = 2 * window
            per_node = len(units.assign) / max(n_nodes, 1)
            if picks or window >= n_nodes or per_node * wider * wider > PAIR_BUDGET:
                break
            window = wider
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "round: %d moves so far, spreads %s, window %d, %d picks",
                len(history),
                " ".join(f"{x * 100:.2f}" for x in spreads),
                window,
                len(picks),
            )
        # Moves chosen in one round see each other only through their disjoint nodes: keep
        # rounds short enough that later picks are not based on a stale picture.
        chosen: list[tuple[int, int]] = []
        for gain, u, t in picks[: max(4, n_nodes // 8)]:
            if len(history) + len(chosen) >= limit:
                break
            if pays(u, gain, objective):
                chosen.append((u, t))
        j0 = state.objective()
        for (u, t), (src, j1) in zip(chosen, state.move_all(chosen), strict=True):
            history.append((u, src, t, j0, j1, "balance"))
            j0 = j1
        made = len(chosen)
        if made == 0 and swaps:
            # A local optimum for single moves: try exchanging two units, from the nodes that
            # deviate most, when both migrations pay for themselves.
            mean_f = f[state.usable].mean(axis=0)
            dev = np.abs(f - mean_f) @ state.weights
            dev = np.where(state.usable, dev, -1.0)
            signed = (f - mean_f) * state.weights[None, :]
            # The best exchange from each of the nodes that deviate most, best first; a node
            # already in an exchange this round is left out (so every gain stays exact), and an
            # exchange that would touch one is looked for again without it.
            busy = np.zeros(n_nodes, dtype=bool)
            ranked: dict[bytes, list[int]] = {}

            def exchange(
                a: int, signed: np.ndarray, busy: np.ndarray, ranked: dict[bytes, list[int]]
            ) -> tuple[float, float, int, int] | None:
                # Partners: the nodes that deviate most the other way, usable and not busy (the
                # ranking is the same for every node that deviates the same way).
                sign = np.sign(signed[a])
                if (order := ranked.get(sign.tobytes())) is None:
                    opposite = -(signed @ sign)
                    order = np.argsort(-opposite, kind="stable").tolist()
                    ranked[sign.tobytes()] = order
                free = (state.usable & ~busy).tolist()
                # The first few in the ranking: stop there rather than filter every node.
                partners = np.array(
                    list(islice((n for n in order if free[n] and n != a), min(8, n_nodes - 1))),
                    dtype=np.intp,
                )
                found = state.best_swap(a, partners)
                if found is None:
                    return None
                _, gain, x, y = found
                objective = state.objective()
                fresh = [v for v in (x, y) if not state.is_moved(v)]
                drop = np.sqrt(max(objective, 0.0)) - np.sqrt(max(objective - gain, 0.0))
                pair_cost = float(units.cost[fresh].sum()) if fresh else 0.0
                if drop * 100 < margin * 100 * pair_cost / total_cost or gain <= 1e-9 * objective:
                    return None
                return found

            heads = np.argsort(-dev, kind="stable")[: max(4, n_nodes // SWAP_NODES_PER)].tolist()
            offers = [(o, a) for a in heads if (o := exchange(a, signed, busy, ranked)) is not None]
            offers.sort(key=lambda o: (-o[0][0], o[1]))
            for found, a in offers:
                if len(history) + 2 > limit or busy[a]:
                    continue
                if busy[units.assign[found[3]]]:
                    again = exchange(a, signed, busy, ranked)
                    if again is None:
                        continue
                    found = again
                _, _, x, y = found
                b = int(units.assign[y])
                busy[[a, b]] = True
                record_all([(x, b), (y, a)], "balance (swap)")
                made += 2
        if made == 0 and shedding:
            # What is left of the plan does not help any more: back to every unit.
            plan[:] = False
            continue
        if made == 0 and swaps:
            # No move and no pair pays: a unit against a set of units, evaluated together.
            def exchange_pays(e: SetExchange) -> bool:
                objective = state.objective()
                fresh = [v for v in (e.unit, *e.others) if not state.is_moved(v)]
                drop = np.sqrt(max(objective, 0.0)) - np.sqrt(max(objective - e.gain, 0.0))
                spent = float(units.cost[fresh].sum()) if fresh else 0.0
                # As for a pair: a gain within rounding of nothing is none (no exchange back).
                if e.gain <= 1e-9 * objective:
                    return False
                return bool(drop * 100 >= margin * 100 * spent / total_cost)

            heads = max(4, n_nodes // SWAP_NODES_PER)
            for e in set_round(state, heads, exchange_pays, limit - len(history)):
                record_all([(e.unit, e.b), *((y, e.a) for y in e.others)], "balance (set exchange)")
                made += 1 + len(e.others)
        if made == 0:
            stopped = (
                "no allowed move pays for itself (margin "
                f"{margin:g} pp of σ per % of the cluster's migration cost)"
            )
            break

    # 3. Prune: undo moves that the target no longer needs (most expensive first). A gathered
    # bundle stays gathered: undoing that would break its hard affinity again.
    moved = np.nonzero(state.moved() & ~state.broken_at_start)[0].tolist()
    if np.all(state.spreads()[weighted] <= goal[weighted]):
        for u in sorted(moved, key=lambda u: (-units.cost[u], units.label[u])):
            origin = int(start[u])
            back = state.allowed_one(u, origin)
            here_ok = units.static_ok[u, origin] and cons.usable[origin]
            if not (back and here_ok):
                continue
            t = int(units.assign[u])
            if np.all(state.spreads_moved(u, origin)[weighted] <= goal[weighted]):
                state.move(u, origin)
                history.append((u, t, origin, 0.0, state.objective(), "pruned"))
            else:
                state.there_and_back(u, origin)

    # 4. Below the grain: a resource whose goal was one step on the smallest node, brought within
    # target_spread in whole steps where they can add up (grain_polish).
    if reached_goal:
        polished = _polish(
            state, grain, goal, target_spread, ceiling, limit, swaps, history, record
        )
        if polished:
            stopped = _balanced_reason(target_spread, state.spreads(), polished)

    final = units.assign
    guests = cluster.guests
    moves: list[ProposedMove] = []
    first_seen: dict[int, int] = {}
    j_before: dict[int, float] = {}
    j_after: dict[int, float] = {}
    why: dict[int, str] = {}
    for i, (u, _src, _tgt, j0, j1, reason) in enumerate(history):
        if reason == "pruned":
            continue
        first_seen.setdefault(u, i)
        j_before.setdefault(u, j0)
        j_after[u] = j1
        why.setdefault(u, reason)
    moved_mask = state.moved()
    for u in sorted(np.nonzero(moved_mask)[0].tolist(), key=lambda u: first_seen[u]):
        tgt = cluster.nodes[int(final[u])].name
        for j in units.members[u].tolist():
            origin = int(state.loads.assign[j])
            if origin == int(final[u]):
                continue  # a bundle member that was already there
            src = cluster.nodes[origin].name
            partner = f" (with {units.label[u]})" if guests[j].id != units.label[u] else ""
            moves.append(
                ProposedMove(
                    guest=guests[j].id,
                    source=src,
                    target=tgt,
                    metric="weighted variance (pp²)",
                    before=j_before[u] * scale,
                    after=j_after[u] * scale,
                    cost=migration_cost(guests[j], cluster.settings),
                    reason=why[u] + partner,
                )
            )
    assign = np.array(state.loads.assign, copy=True)
    for u, idx in enumerate(units.members):
        if moved_mask[u]:
            assign[idx] = final[u]
    after = cluster_imbalance(cluster, assign, state.loads)
    notes = [str(p) for p in cons.problems]
    if exact is not None:
        notes.append(_exact_note(exact))
        options = {**options, "repair": exact}
    if stuck:
        names = sorted({units.label[u] for u in stuck})
        more = f" (and {len(names) - 10} more)" if len(names) > 10 else ""
        notes.append("could not repair: " + ", ".join(names[:10]) + more)
    proposal = Proposal("balance", tuple(moves), before, after, stopped, tuple(notes), options)
    return proposal, reached_goal


def _balanced_reason(target_spread: float, spreads: np.ndarray, more: Iterable[str] = ()) -> str:
    """The stop reason of a search that ended balanced, with ``more`` clauses."""
    text = (
        "balanced: every spread within its goal "
        f"({target_spread * 100:.2f} pp, or one guest's step where coarser): ("
        + ", ".join(f"{r} {s * 100:.2f} pp" for r, s in zip(RESOURCES, spreads, strict=True))
        + ")"
    )
    return "; ".join([text, *more])


def _polish(
    state: _State,
    grain: np.ndarray,
    goal: np.ndarray,
    target_spread: float,
    ceiling: float,
    limit: int,
    exchanges: bool,
    history: list[tuple[int, int, int, float, float, str]],
    record: Callable[[int, int, str], None],
) -> list[str]:
    """The final phase of a balanced search: each weighted resource whose grain is coarser than
    ``target_spread`` and whose spread is above it, brought within it in whole steps where a
    window allows (:func:`.grain_polish.polish`), ``record`` making each move into ``history``
    (at most ``limit`` entries), the objective never above ``ceiling``; a polish that does not
    reach the window is undone, and the resource keeps its grain goal. ``goal`` is tightened to
    ``target_spread`` for the resources polished. One clause per resource tried, for the stop
    reason."""
    clauses: list[str] = []
    coarse = (state.weights > 0) & (grain > target_spread)
    for r in np.nonzero(coarse)[0].tolist():
        if state.spreads()[r] <= target_spread + 1e-12:
            goal[r] = target_spread + 1e-12
            continue
        mark = len(history)
        result = polish(
            state,
            r,
            target_spread,
            ceiling,
            limit - mark,
            exchanges,
            lambda u, t: record(u, t, "balance (below the grain)"),
        )
        if result.reached:
            goal[r] = target_spread + 1e-12
            clauses.append(result.note)
            continue
        for u, src, _t, *_ in reversed(history[mark:]):
            state.move(u, src)
        del history[mark:]
        clauses.append(result.note + f"; its goal stays one step ({grain[r] * 100:.2f} pp)")
    return clauses


@dataclass(frozen=True)
class BalanceOptions(StrategyOptions):
    """``balance``'s options (see :func:`propose_balance`)."""

    target_spread: float = DEFAULT_TARGET_SPREAD
    margin: float = DEFAULT_MARGIN
    max_moves: int | None = None
    wide: int = DEFAULT_WIDE
    swaps: bool = True

    def check(self) -> None:
        _check_options(self.target_spread, self.margin, self.max_moves, self.wide, self.swaps)


class Balance:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = "balance"
    summary = "opendrs: fewest, smallest migrations to a target spread; all rules hard"
    Options = BalanceOptions

    def propose(self, view: CycleView, request: Request, options: BalanceOptions) -> Proposal:
        return spread_options(
            propose_balance, view.observed, view, request, options, ("target_spread", "max_moves")
        )


STRATEGIES: tuple[Strategy, ...] = (Balance(),)
