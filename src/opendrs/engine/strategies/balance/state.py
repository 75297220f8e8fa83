"""``balance``'s search state (:class:`BalanceState`): where every unit is, the nodes' loads and
capacity commitments, the objective and the band, and the questions every phase asks of them —
which moves are allowed, what they gain, which exchanges pay."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendrs.engine.constraints import Constraints
from opendrs.engine.distinct import distinct
from opendrs.engine.imbalance import balance_objective, resource_weights
from opendrs.engine.usage import RESOURCES, LoadModel, arch_groups, tolerance
from opendrs.model.cluster import Cluster

from .hold import keeps_held, keeps_held_moves
from .kinds import (
    GainingPairs,
    Kinds,
    PairCheck,
    best_allowed,
    distinct_rows,
    every,
)
from .units import build_units

#: Node loads (moves × nodes × resources) whose objectives are computed at once.
MOVES_AT_ONCE = 1 << 18

#: Parts of exchange tables kept (see :meth:`BalanceState._gaining_pairs`).
SWAP_BLOCKS = 1024


class BalanceState:
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
        #: (R,) the resources held within their goal (:mod:`.hold`): none until :meth:`steer`.
        self.held = np.zeros(len(RESOURCES), dtype=bool)
        #: :attr:`weights` and :attr:`wnorm` without the held resources: what chooses moves.
        self.steer_weights = w.copy()
        self.steer_wnorm = self.wnorm.copy()
        self._steered: float | None = None
        self.units = build_units(cluster, cons, loads)
        #: (U,) the guests in each unit: the migrations its move makes.
        self.unit_guests = np.array([m.size for m in self.units.members], dtype=np.intp)
        #: (G,) the node each guest of a unit is on now (a broken bundle's members differ).
        self.where = np.array(loads.assign, dtype=np.intp, copy=True)
        #: (U,) bundles whose members are on different nodes now; moving one gathers it.
        self.broken = np.zeros(len(self.units.members), dtype=bool)
        for u, idx in enumerate(self.units.members):
            if idx.size > 1:
                self.broken[u] = np.any(self.where[idx] != self.where[idx[0]])
        #: (U,) bundles broken at the start: they have no home to go back to.
        self.broken_at_start = self.broken.copy()
        #: Where each unit started: a unit away from it has already cost its migration.
        self.origin = self.units.assign.copy()
        #: (U,) :meth:`moved`, kept up to date by :meth:`move` (nothing has moved yet).
        self._moved = np.zeros(len(self.origin), dtype=bool)
        #: The band: fractions within ``goal / 2`` of the mean.
        self.goal = np.zeros(len(RESOURCES))
        self._objective: float | None = None
        self._init_partners()
        self._init_typical(cap_total)
        self._init_groups()
        self._init_caches()

    def _init_partners(self) -> None:
        """Each unit's hard anti-affinity partner guests, laid end to end (CSR), for vectorised
        anti-affinity masks: a unit may not go where any member of a partner unit is, a broken
        partner bundle's included."""
        lengths = np.array([p.size for p in self.units.neg_guests], dtype=np.intp)
        self.has_neg = lengths > 0
        self.neg_start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.intp)
        self.neg_flat = (
            np.concatenate(self.units.neg_guests).astype(np.intp)
            if lengths.sum()
            else np.zeros(0, dtype=np.intp)
        )

    def _init_typical(self, cap_total: np.ndarray) -> None:
        """The mean and the typical movable unit's demand (``cap_total``: the usable capacity)."""
        movable = self.units.demand[self.units.movable]
        #: The mean movable unit's demand.
        self.mean_demand = movable.mean(axis=0) if movable.size else np.ones(len(RESOURCES))
        #: A typical movable unit's demand: the band distance is counted in these. A demand
        #: the loads cannot register (below one rounding step of the cluster's capacity, as a
        #: subnormal use can be) counts as none: distances counted in it would overflow.
        self.typical = np.where(
            self.mean_demand > np.finfo(float).eps * cap_total, self.mean_demand, 1.0
        )

    def _init_groups(self) -> None:
        """Each architecture group's nodes and capacity, and the capacity's inverse."""
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
        #: The resources that steer the exchanges' gains.
        self._weighted = np.nonzero(self.steer_wnorm)[0].tolist()
        self._cap_den = np.where(self._cap_pos, self.cap, 1.0)
        self.inv_cap = np.where(self._cap_pos, 1.0 / self._cap_den, 0.0)

    def _init_caches(self) -> None:
        """What the state keeps between moves: fractions, means, units and kinds per node."""
        self._f: np.ndarray | None = None
        #: Nodes whose loads changed since the fractions were last brought up to date.
        self._touched: list[int] = []
        #: (N,) how many times a move has changed each node's load or units.
        self.version = np.zeros(len(self.cluster.nodes), dtype=np.int64)
        self._means: np.ndarray | None = None
        #: :func:`.hold.group_extremes` by (resource, total of :attr:`version`).
        self.extremes: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
        #: The units on each node (by :attr:`Units.assign`), and the kinds of the movable ones
        #: on the nodes no move has touched since (see :meth:`node_kinds`).
        self._units_at: list[set[int]] = [set() for _ in range(len(self.cap))]
        for u, n in enumerate(self.units.assign.tolist()):
            self._units_at[n].add(u)
        self._kinds_on: dict[int, Kinds] = {}
        self._joined: dict[tuple[int, ...], tuple[list[Kinds], Kinds]] = {}
        self._swap_blocks: dict[tuple[int, int], tuple[Kinds, Kinds, GainingPairs]] = {}
        self._unit_kinds: tuple[np.ndarray, int] | None = None
        self._pair_kinds: tuple[np.ndarray, int] | None = None
        #: :meth:`scattered` of the broken units asked about, until they move.
        self._scattered: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        #: Best set exchanges of pairs of nodes, with the kinds of both when found
        #: (:mod:`.set_exchange`).
        self.set_exchanges: dict[tuple[int, int], tuple[Kinds, Kinds, Any]] = {}

    # ---------------------------------------------------------------------------------------

    def fractions(self) -> np.ndarray:
        """(N, R) each node's load over its capacity (0 where it has none)."""
        return self.kept_fractions().copy()

    def kept_fractions(self) -> np.ndarray:
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
        return self.spreads_of(self.kept_fractions())

    def spreads_moved(self, u: int, target: int) -> np.ndarray:
        """:meth:`spreads` were whole unit ``u`` on ``target`` (the same bits), not moving it."""
        rows = np.array([self.units.assign[u], target], dtype=np.intp)
        load = self.node_load[rows]
        load[0] -= self.units.demand[u]
        load[1] += self.units.demand[u]
        f = self.kept_fractions().copy()
        f[rows] = np.where(self._cap_pos[rows], load / self._cap_den[rows], 0.0)
        return self.spreads_of(f)

    def spreads_of(self, f: np.ndarray) -> np.ndarray:
        """:meth:`spreads` of the fractions ``f`` (N, R)."""
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

    def steer(self, held: np.ndarray) -> None:
        """Hold the resources ``held`` (R,): no weight in choosing moves (they only break ties
        between moves that steer alike, :mod:`.picks`), their spread kept within its goal by
        :meth:`allowed` and :meth:`swap_check` (see :mod:`.hold`). What was kept of gains
        computed with the weights before is dropped."""
        held = np.asarray(held, dtype=bool) & (self.weights > 0)
        if np.array_equal(held, self.held):
            return
        self.held = held
        self.steer_weights = np.where(held, 0.0, self.weights)
        self.steer_wnorm = np.where(held, 0.0, self.wnorm)
        self._weighted = np.nonzero(self.steer_wnorm)[0].tolist()
        self._steered = None
        self._swap_blocks.clear()
        self.set_exchanges.clear()

    def steered_objective(self) -> float:
        """:meth:`objective` with the held resources' weights left out: what a move's gain
        (:meth:`gains`) is a part of."""
        if not self.held.any():
            return self.objective()
        if self._steered is None:
            self._steered = float(
                balance_objective(self.node_load, self.cap, self.steer_weights, self.group)
            )
        return self._steered

    def units_on(self, nodes: np.ndarray) -> np.ndarray:
        """The movable units on ``nodes``, in index order: candidates for balancing moves.

        A broken bundle is not one: gathering it is a repair (:meth:`violating_units`).
        """
        mask = np.zeros(len(self.cluster.nodes), dtype=bool)
        mask[nodes] = True
        return np.nonzero(self.units.movable & ~self.broken & mask[self.units.assign])[0]

    def units_at(self, n: int) -> np.ndarray:
        """:meth:`units_on` of node ``n`` alone, from the units kept per node."""
        at = np.array(sorted(self._units_at[n]), dtype=np.intp)
        return at[self.units.movable[at] & ~self.broken[at]]

    def moved(self) -> np.ndarray:
        """(U,) units that have moved: away from where they started, or (broken) gathered."""
        return self._moved.copy()

    def moved_of(self, units: np.ndarray) -> np.ndarray:
        """:meth:`moved` of ``units`` only."""
        return self._moved[units]

    def is_moved(self, u: int) -> bool:
        """Whether unit ``u`` has moved (see :meth:`moved`)."""
        return bool(self._moved[u])

    def scattered(self, u: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where broken unit ``u``'s members are: (nodes, demand (k, R), need (k, D)) per node;
        read-only, kept until ``u`` moves (only its own move moves its members)."""
        kept = self._scattered.get(u)
        if kept is not None:
            return kept
        idx = self.units.members[u]
        nodes, at = np.unique(self.where[idx], return_inverse=True)
        demand = np.zeros((len(nodes), self.units.guest_demand.shape[1]))
        need = np.zeros((len(nodes), self.units.guest_need.shape[1]))
        np.add.at(demand, at, self.units.guest_demand[idx])
        np.add.at(need, at, self.units.guest_need[idx])
        for part in (nodes, demand, need):
            part.setflags(write=False)
        self._scattered[u] = (nodes, demand, need)
        return nodes, demand, need

    def occupied(self, u: int) -> np.ndarray:
        """The nodes unit ``u``'s members are on (one, unless it is a broken bundle)."""
        if self.broken[u]:
            return distinct(self.where[self.units.members[u]])
        return self.units.assign[u : u + 1]

    def mean(self) -> np.ndarray:
        """(N, R) per node, the capacity-weighted mean fraction of its architecture group's usable
        nodes (0 for a node that is not usable)."""
        return self.kept_mean().copy()

    def kept_mean(self) -> np.ndarray:
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
        column = self._columns(nodes)
        at, partners = self._partners_of(units[rows])
        row_of = rows[at]
        col = column[self.where[partners]]
        hit = col >= 0
        out[row_of[hit], col[hit]] = True
        return out

    def blocked_at(self, units: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """(k,): whether ``nodes[k]`` holds a hard negative partner of ``units[k]``."""
        out = np.zeros(len(units), dtype=bool)
        rows = np.nonzero(self.has_neg[units])[0]
        if rows.size:
            at, partners = self._partners_of(units[rows])
            row_of = rows[at]
            out[row_of[self.where[partners] == nodes[row_of]]] = True
        return out

    def _partners_of(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The hard negative partner guests of ``units``, laid end to end, and for each the
        position in ``units`` of the unit it is a partner of."""
        first = self.neg_start[units]
        count = self.neg_start[units + 1] - first
        at = np.repeat(np.arange(len(units)), count)
        offset = np.repeat(first - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
        return at, self.neg_flat[offset + np.arange(int(count.sum()))]

    def gains(
        self, units: np.ndarray, targets: np.ndarray, wnorm: np.ndarray | None = None
    ) -> np.ndarray:
        """(len(units), len(targets)) objective reduction of moving each unit to each target.

        With ``Σ_n L²/C`` per resource, moving ``d`` from ``a`` to ``b`` changes the objective by
        ``d²(1/C_a + 1/C_b) − 2d(f_a − f_b)``; a unit leaving an unusable node adds only the
        target's ``d²/C_b + 2d·f_b``. Weighted and summed over resources this factors into
        ``g_u − (2d·w)·f_b − (d²·w)·(1/C_b)``: two small matrix products. ``wnorm``: the
        resources' weights (default: :attr:`steer_wnorm`, what steers the search).
        """
        d = self.units.demand[units]  # (u, R)
        src = self.units.assign[units]
        f = self.kept_fractions()
        inv = self.inv_cap
        w = self.steer_wnorm if wnorm is None else wnorm
        own = ((2 * d * f[src] - d**2 * inv[src]) * w).sum(axis=1)
        own = np.where(self.usable[src], own, 0.0)
        # own − (2d·w) fᵀ − (d²·w) invᵀ, in place.
        out = (2 * d * w) @ f[targets].T
        np.subtract(own[:, None], out, out=out)
        out -= (d**2 * w) @ inv[targets].T
        broken = np.nonzero(self.broken[units])[0].tolist()
        column = self._columns(targets) if broken else targets[:0]
        for row in broken:
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
            for n, e_n in zip(nodes.tolist(), e, strict=True):
                if column[n] >= 0:
                    out[row, column[n]] += float((2 * dr * e_n * inv[n] * w).sum())
        return out

    def unit_kinds(self) -> tuple[np.ndarray, int]:
        """(U,) each unit's kind, and how many there are: units of a kind have the same demand,
        capacity demand, allowed nodes (:attr:`Units.static_ok`) and number of guests, so on one
        node the same gains, hard constraints and migrations. A bundle broken at the start, or a
        unit kept apart from others, is a kind of its own."""
        if self._unit_kinds is None:
            self._unit_kinds = self._kinds_apart(self.broken_at_start | self.has_neg)
        return self._unit_kinds

    def pair_kinds(self) -> tuple[np.ndarray, int]:
        """:meth:`unit_kinds` for the exchanges, which check hard anti-affinity pair by pair of
        units (:meth:`swap_check`): a unit kept apart from others is of its kind, only a bundle
        broken at the start is a kind of its own."""
        if self._pair_kinds is None:
            self._pair_kinds = self._kinds_apart(self.broken_at_start)
        return self._pair_kinds

    def _kinds_apart(self, alone: np.ndarray) -> tuple[np.ndarray, int]:
        """(U,) each unit's kind and how many there are; each of the units ``alone`` its own
        (no units: no kinds — a cluster of no guests, unbalanced by its hosts' own load)."""
        if not len(alone):
            return np.zeros(0, dtype=np.int64), 0
        u = self.units
        column = [
            u.demand.view(np.int64),
            u.need.view(np.int64),
            u.static_ok.distinct(),
            self.unit_guests,
            np.where(alone, np.arange(len(alone)), -1),
        ]
        key = np.hstack([c.astype(np.int64).reshape(len(alone), -1) for c in column])
        first, kind = distinct_rows(key)
        return kind, first.size

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
        mean = self.kept_mean()
        low = (mean - self.goal / 2) * self.cap  # (N, R) absolute
        high = (mean + self.goal / 2) * self.cap
        outside = np.maximum(self.node_load - high, 0.0) + np.maximum(low - self.node_load, 0.0)
        left = self.node_load[src] - d
        at_source = outside[src] - (
            np.maximum(left - high[src], 0.0) + np.maximum(low[src] - left, 0.0)
        )
        at_source = np.where(self.usable[src][:, None], at_source, d)
        scale = (self.steer_weights > 0) / self.typical
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
        rows = np.nonzero(broken)[0].tolist()
        column = self._columns(targets) if rows else targets[:0]
        for row in rows:
            nodes, _demand, there = self.scattered(int(units[row]))
            extra = np.broadcast_to(need[row], headroom.shape).copy()
            cols = column[nodes]
            hit = cols >= 0
            extra[cols[hit]] -= there[hit]  # the nodes differ: one subtraction each
            fits[row] = np.all(extra <= headroom, axis=1)
        ok &= fits
        if self.has_neg[units].any():
            ok &= ~self.blocked_by_partners(units, targets)
        if self.held.any() and ok.any():
            ok &= keeps_held_moves(self, units, targets, ok)
        return ok

    def _columns(self, targets: np.ndarray) -> np.ndarray:
        """(N,) each node's column in ``targets`` (the last, where a target repeats); -1 for a
        node that is not one."""
        column = np.full(len(self.cluster.nodes), -1, dtype=np.intp)
        column[targets] = np.arange(len(targets))
        return column

    def allowed_one(self, u: int, t: int) -> bool:
        """:meth:`allowed` for one unit and one target."""
        if self.broken[u]:
            return bool(self.allowed(np.array([u]), np.array([t]))[0, 0])
        if not (self.units.static_ok[u, t] and self.usable[t]) or self.units.assign[u] == t:
            return False
        headroom = (self.limit[t] - self.committed[t]) + self.tol[t]
        if not (np.all(headroom >= self.tol[t]) and np.all(self.units.need[u] <= headroom)):
            return False
        if self.has_neg[u] and self.blocked_by_partners(np.array([u]), np.array([t])).any():
            return False
        return not self.held.any() or bool(
            keeps_held_moves(self, np.array([u]), np.array([t]))[0, 0]
        )

    def best_swap(
        self, a: int, partners: np.ndarray, above: float = -np.inf
    ) -> tuple[float, float, int, int] | None:
        """The best exchange of a unit on node ``a`` with a unit on one of the ``partners`` nodes,
        of those scoring above ``above`` (the others' constraints are not checked).

        Returns (score, gain, unit on a, unit elsewhere) or None. Both units must be movable,
        allowed on each other's node, fit there once the other has left, and keep hard
        anti-affinity. The score is the gain per migration the exchange adds (units that have
        already moved cost nothing more), and four times the gain for one that adds none. Among
        equal scores the units with the lower indices win.
        """
        nodes = [int(n) for n in partners.tolist() if n != a and self.usable[n]]
        if not self.usable[a] or not nodes:
            return None
        x = self.node_kinds(a)
        parts = [self.node_kinds(n) for n in nodes]
        if x.units.size == 0 or all(p.units.size == 0 for p in parts):
            return None
        # Units alike (same demand and node, not moved yet) pair alike: gains and scores are
        # computed per kind, and pairs of units only for the best of them.
        pairs = self._gaining_pairs(a, x, nodes, parts, above)
        if pairs.score.size == 0:  # none gains (or scores above ``above``)
            return None
        o = self._nodes_kinds(nodes, parts)
        found = best_allowed(self.swap_check(a, x.units, o.units), x, o, pairs)
        if found is None:
            return None
        score, gain, at_x, at_o = found
        return score, gain, int(x.units[at_x]), int(o.units[at_o])

    def swap_check(self, a: int, on_a: np.ndarray, others: np.ndarray) -> PairCheck:
        """Whether exchanging on_a[xs[k]] with others[os[k]] is allowed, for each k: what units
        of a :meth:`pair_kinds` kind (on one node) share, and their anti-affinity partners."""
        units = self.units
        b = units.assign[others]  # (o,)
        room = self.limit - self.committed + self.tol

        def alike(xs: np.ndarray, os: np.ndarray) -> np.ndarray:
            xu, ou, on = on_a[xs], others[os], b[os]
            ok = units.static_ok[xu, on] & units.static_ok[ou, a]
            shift = units.need[xu] - units.need[ou]  # what moves a -> b
            ok &= every(shift <= room[on])
            ok &= every(-shift <= room[a][None, :])
            if self.held.any():
                shift = units.demand[xu] - units.demand[ou]
                ok &= keeps_held(self, np.full_like(on, a), on, shift)
            return ok

        def apart(xs: np.ndarray, os: np.ndarray) -> np.ndarray:
            xu, ou = on_a[xs], others[os]
            return ~self.blocked_at(xu, b[os]) & ~self.blocked_at(ou, np.full_like(ou, a))

        partners = self.has_neg[on_a].any() or self.has_neg[others].any()
        return PairCheck(alike, apart if partners else None)

    def _gaining_pairs(
        self, a: int, x: Kinds, nodes: list[int], parts: list[Kinds], above: float = -np.inf
    ) -> GainingPairs:
        """The exchanges of the kinds ``x`` on ``a`` with the kinds ``parts`` on ``nodes`` (one
        node after the other) that gain (:meth:`_swap_gains`), that the units' allowed nodes
        let exchange (:meth:`_static_pairs`) and that score above ``above``, with their
        scores. Each node's part is kept while neither it nor ``a`` changes (a move drops the
        kinds of the nodes it touches)."""
        kept = self._swap_blocks
        blocks = [kept.get((a, n)) for n in nodes]
        fresh = [
            i
            for i, (block, part) in enumerate(zip(blocks, parts, strict=True))
            if block is None or block[0] is not x or block[1] is not part
        ]
        if fresh:
            os = np.concatenate([parts[i].first for i in fresh])
            gain = self._swap_gains(a, x.first, os)  # (os, xs)
            # Column after column: each node's pairs together; only those the units' allowed
            # nodes let exchange (the same for every unit of a kind).
            cols, rows = np.nonzero((gain > 0) & self._static_pairs(a, x.first, os))
            values = gain[cols, rows]
            scores = self._swap_scores(a, x.first, os, (rows, cols, values))
            found = GainingPairs(rows, cols, values, scores)
            if len(kept) > SWAP_BLOCKS:
                kept.clear()
            widths = [parts[i].first.size for i in fresh]
            for i, block in zip(fresh, found.split(widths), strict=True):
                blocks[i] = kept[(a, nodes[i])] = (x, parts[i], block)
            if len(fresh) == len(nodes) and above == -np.inf:
                return found
        kept_pairs = [b[2].above(above) for b in blocks]
        return GainingPairs.join(kept_pairs, [p.first.size for p in parts])

    def _static_pairs(self, a: int, xs: np.ndarray, os: np.ndarray) -> np.ndarray:
        """(len(os), len(xs)) whether each unit ``xs`` on node ``a`` may go to the node of each
        unit ``os``, and that one to ``a`` (:attr:`Units.static_ok`)."""
        ok = self.units.static_ok
        return ok[xs][:, self.units.assign[os]].T & ok[os, a][:, None]

    def _nodes_kinds(self, nodes: list[int], parts: list[Kinds]) -> Kinds:
        """``parts``, the :meth:`node_kinds` of ``nodes``, one node after the other; the last ones
        kept."""
        key = tuple(nodes)
        kept = self._joined.get(key)
        if kept is None or any(p is not q for p, q in zip(parts, kept[0], strict=True)):
            kept = self._joined[key] = (parts, Kinds.join(parts))
            if len(self._joined) > 64:
                self._joined.pop(next(iter(self._joined)))
        return kept[1]

    def node_kinds(self, n: int) -> Kinds:
        """The movable, whole units on node ``n`` by kind (:meth:`pair_kinds`), not moved yet (a
        unit that has moved is a kind of its own: its way home is free). Kept until a move
        touches the node."""
        kinds = self._kinds_on.get(n)
        if kinds is None:
            on = np.array(sorted(self._units_at[n]), dtype=np.intp)
            on = on[self.units.movable[on] & ~self.broken[on]]
            kind, n_kinds = self.pair_kinds()
            code = np.where(self.moved_of(on), n_kinds + on, kind[on])
            _, first, of = np.unique(code, return_index=True, return_inverse=True)
            kinds = self._kinds_on[n] = Kinds.of(on, first, of)
        return kinds

    def _swap_gains(self, a: int, xs: np.ndarray, os: np.ndarray) -> np.ndarray:
        """(len(os), len(xs)) the objective gain of exchanging each unit ``xs`` on node ``a``
        with each unit ``os`` elsewhere (a row per unit elsewhere: each node's rows together)."""
        units = self.units
        f = self.kept_fractions()
        inv = self.inv_cap
        b = units.assign[os]  # (o,)
        dx, do, fb, inv_b = units.demand[xs], units.demand[os], f[b], inv[b]
        # Objective gain of every pair, one resource at a time: t = what moves a -> b.
        gain = np.zeros((os.size, xs.size))
        t, part = np.empty(gain.shape), np.empty(gain.shape)
        for r in self._weighted:
            # gain −= w_r (t² (1/C_a + 1/C_b) − 2t (f_a − f_b)), in place.
            np.subtract(dx[:, r], do[:, r : r + 1], out=t)
            gap = (f[a, r] - fb[:, r])[:, None]
            np.multiply(t, t, out=part)
            part *= (inv[a, r] + inv_b[:, r])[:, None]
            t *= 2
            t *= gap
            part -= t
            part *= self.steer_wnorm[r]
            gain -= part
        return gain

    def _swap_scores(
        self,
        a: int,
        xs: np.ndarray,
        os: np.ndarray,
        pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> np.ndarray:
        """The scores of the exchanges ``pairs`` (rows in ``xs``, columns in ``os``, gains) of
        :meth:`_swap_gains`: the gain per migration each adds, four times the gain for none."""
        rows, cols, gain = pairs
        if gain.size == 0:  # no pair gains (a node without movable units has none)
            return gain
        # Migrations added: a unit's guests, unless it has moved already (added_migrations).
        moved_x, moved_o = self.moved_of(xs).any(), self.moved_of(os).any()
        guests_x, guests_o = self.unit_guests[xs], self.unit_guests[os]
        if not (moved_x or moved_o) and guests_x.max() == 1 and guests_o.max() == 1:
            return gain / 2
        # Per unit and node (the units elsewhere are on a few nodes), then per pair.
        if moved_x:
            nodes, at = np.unique(self.units.assign[os], return_inverse=True)
            added_at = self.added_migrations(np.repeat(xs, nodes.size), np.tile(nodes, xs.size))
            added_x = added_at.reshape(xs.size, nodes.size)[rows, at.ravel()[cols]]
        else:
            added_x = guests_x[rows]
        added_o = (self.added_migrations(os, np.full_like(os, a)) if moved_o else guests_o)[cols]
        added = np.asarray(added_x + added_o)
        # gain / added where it adds some, else 4 × gain.
        return np.where(added > 0, gain / np.maximum(added, 1), 4 * gain)

    def added_migrations(self, units: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Migrations each move (units[k] to targets[k]) adds: the unit's guests, none (already
        moved) or as many fewer (back home)."""
        home = self.origin[units]
        away = self.moved_of(units)
        back = (targets == home) & ~self.broken_at_start[units]
        guests = self.unit_guests[units]
        return np.where(away, np.where(back, -guests, 0), guests)

    def move_all(self, moves: list[tuple[int, int]]) -> list[tuple[int, float]]:
        """Make ``moves`` (unit, target) in order; for each, where the unit was and the objective
        after it — as :meth:`objective` gives, for many moves at once."""
        out: list[tuple[int, float]] = []
        step = max(1, MOVES_AT_ONCE // self.node_load.size)
        for begin in range(0, len(moves), step):
            start = self.node_load.copy()
            touched: list[tuple[np.ndarray, np.ndarray]] = []
            for u, t in moves[begin : begin + step]:
                nodes = distinct(np.append(self.where[self.units.members[u]], t))
                out.append((int(self.units.assign[u]), 0.0))
                self.move(u, t)
                touched.append((nodes, self.node_load[nodes]))
            loads = np.repeat(start[None], len(touched), axis=0)  # (k, N, R): after each move
            for k, (nodes, rows) in enumerate(touched):
                loads[k:, nodes] = rows
            found = self._objectives(loads)
            out[begin:] = [(src, j) for (src, _), j in zip(out[begin:], found, strict=True)]
            self._objective = found[-1]
            self._steered = None
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
        self._steered = None
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
        self._scattered.pop(u, None)
        units.assign[u] = target
        self.where[idx] = target
        self._moved[u] = target != self.origin[u] or bool(self.broken_at_start[u])
        self._objective = None
        self._steered = None
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
        out.extend(self._clashing_units().tolist())
        # Split hard-affinity bundles are gathered by moving the whole bundle; one anchored by
        # members that cannot move, by moving the others to them.
        out.extend(np.nonzero((units.movable | units.anchored) & self.broken)[0].tolist())
        return list(dict.fromkeys(out))

    def _clashing_units(self) -> np.ndarray:
        """The movable units that break hard anti-affinity and must move, in index order: a
        member shares a node with a member of a partner unit whose label is smaller or that
        cannot move (the unit with the larger label moves, or the one that can). All units'
        partners at once; a broken bundle, on several nodes, one by one."""
        units = self.units
        checked = np.nonzero(units.movable & self.has_neg)[0]
        must = np.zeros(len(units.assign), dtype=bool)
        whole = checked[~self.broken[checked]]
        at, partners = self._partners_of(whole)
        shared = self.where[partners] == units.assign[whole][at]
        for u, c in zip(
            whole[at[shared]].tolist(), units.unit_of[partners[shared]].tolist(), strict=True
        ):
            must[u] |= units.label[u] > units.label[c] or not units.movable[c]
        for u in checked[self.broken[checked]].tolist():
            partners = units.neg_guests[u]
            clash = units.unit_of[partners[np.isin(self.where[partners], self.occupied(u))]]
            must[u] = any(
                units.label[u] > units.label[c] or not units.movable[c] for c in clash.tolist()
            )
        return np.nonzero(must)[0]

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


def _fraction_rows(load: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """``load / cap``, 0 where the capacity is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cap > 0, load / np.where(cap > 0, cap, 1.0), 0.0)
