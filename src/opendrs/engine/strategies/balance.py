"""``balance`` — opendrs's own rebalancing strategy.

Goal: reach a target balance (every resource's spread — max − min of the usable nodes' load
fractions — at most ``target_spread``) with the fewest and smallest migrations, never breaking a
hard constraint, never making the objective worse, deterministically and fast.

**Objective.** The capacity-weighted variance of the node load fractions, per resource, combined
with the cluster's weights: ``J = Σ_r w_r · Σ_n C_nr (f_nr − f̄_r)² / Σ_n C_nr``. It is zero exactly
when every node has the same fraction, for nodes of any size, and a move's effect is exact and
cheap: moving demand ``d`` from node ``a`` to node ``b`` changes it by
``Σ_r w_r (d²(1/C_a + 1/C_b) − 2d(f_a − f_b)) / Σ_n C_nr`` — the ``d²`` term is what prevents
overshoot: a move that would swap the roles of ``a`` and ``b`` scores worse than a smaller one.

**Search.** Rounds of greedy moves over a vectorised (unit × node) gain matrix — a *unit* is a
guest, or a bundle of guests kept together by hard affinity. In each round every candidate unit gets
its best allowed target; then moves are taken in order of gain, at most one per node, so moves in a
round touch disjoint nodes and their gains stay exact. The best gain wins; among gains within 1 % of
each other the cheaper migration wins (fewest first, then smallest). A move is made only if it pays
for itself — the balance σ (the square root of the objective) falls by at least ``margin``
percentage points per percent of the cluster's total migration cost that the move spends — and
the search stops as soon as every weighted resource is within
``target_spread``: no moves while balanced.

**Repair first.** Guests that break a hard constraint now — on a node in maintenance, on a node
their strict node affinity excludes, sharing a node with a hard anti-affinity partner, split from
their hard-affinity partners, or on a node over capacity — are moved first, to their best allowed
node, whatever the cost.

**Pruning.** Afterwards, every move is tried undone (most expensive first): if the cluster still
meets the target and the constraints without it, it is dropped.

On large clusters (more than ``wide`` nodes) each round looks only at the ``wide`` most loaded
sources and ``wide`` least loaded targets, which keeps a round cheap at 1,000 nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from opendrs.engine.constraints import Constraints, movability
from opendrs.engine.usage import RESOURCES, LoadModel, loaded_nodes, tolerance
from opendrs.model.cluster import Cluster

from .base import Proposal, ProposedMove, cluster_imbalance, migration_cost, register

log = logging.getLogger(__name__)

DEFAULT_TARGET_SPREAD = 0.01
DEFAULT_MARGIN = 0.05
DEFAULT_WIDE = 64
#: Most (unit, target) pairs a round looks at when it widens its window on a big cluster.
PAIR_BUDGET = 4_000_000


@dataclass
class _Units:
    """Movable units (guests or hard-affinity bundles) as arrays."""

    members: list[np.ndarray]
    assign: np.ndarray  # (U,) node index
    demand: np.ndarray  # (U, R) balance load (running members only)
    need: np.ndarray  # (U, D) capacity demand
    static_ok: np.ndarray  # (U, N)
    movable: np.ndarray  # (U,) bool
    cost: np.ndarray  # (U,) migration cost
    neg: list[np.ndarray]  # per unit: indices of hard negative partner units
    label: list[str]


class _State:
    """The evolving placement: node loads, capacity commitments and unit positions."""

    def __init__(self, cluster: Cluster, cons: Constraints) -> None:
        self.cluster = cluster
        self.cons = cons
        loads = LoadModel.build(cluster)
        self.loads = loads
        self.cap = loads.capacity
        self.node_load = loads.loads()
        self.limit = cons.capacity.limit
        self.committed = cons.capacity.committed()
        self.tol = tolerance(self.limit)
        self.usable = cons.usable & np.all(self.cap > 0, axis=1)
        settings = cluster.settings
        w = np.array([settings.weight_cpu, settings.weight_memory], dtype=float)
        w = w / w.sum() if w.sum() > 0 else np.full(len(RESOURCES), 1 / len(RESOURCES))
        cap_total = (self.cap * self.usable[:, None]).sum(axis=0)
        #: Per-resource weight that turns Σ L²/C into the weighted variance of fractions.
        self.wnorm = np.where(cap_total > 0, w / np.where(cap_total > 0, cap_total, 1.0), 0.0)
        self.weights = w
        self.units = self._build_units()
        self.has_neg = np.array([p.size > 0 for p in self.units.neg], dtype=bool)

    # ---------------------------------------------------------------------------------------

    def _build_units(self) -> _Units:
        cluster, cons, loads = self.cluster, self.cons, self.loads
        guests = cluster.guests
        seen: set[int] = set()
        members: list[np.ndarray] = []
        for j in range(len(guests)):
            if j in seen or loads.assign[j] < 0:
                continue
            group = int(cons.group_of[j])
            idx = cons.groups[group] if group >= 0 else np.array([j], dtype=np.intp)
            idx = idx[loads.assign[idx] >= 0]
            seen.update(idx.tolist())
            members.append(idx)
        n_units = len(members)
        unit_of = np.full(len(guests), -1, dtype=np.intp)
        for u, idx in enumerate(members):
            unit_of[idx] = u
        static = cons.static_ok()
        running = np.array([bool(loaded_nodes(g)) for g in guests], dtype=bool)
        assign = np.array([int(loads.assign[idx[0]]) for idx in members], dtype=np.intp)
        demand = np.zeros((n_units, len(RESOURCES)))
        need = np.zeros((n_units, len(cons.capacity.dims)))
        static_ok = np.ones((n_units, len(cluster.nodes)), dtype=bool)
        movable = np.ones(n_units, dtype=bool)
        cost = np.zeros(n_units)
        labels: list[str] = []
        neg: list[np.ndarray] = []
        settings = cluster.settings
        for u, idx in enumerate(members):
            for j in idx.tolist():
                if running[j]:
                    demand[u] += loads.demand[j]
                need[u] += cons.guest_demand(j)
                static_ok[u] &= static[j]
                if movability(guests[j], cluster, "balance") is not None:
                    movable[u] = False
                cost[u] += migration_cost(guests[j], settings)
            partners = set()
            for j in idx.tolist():
                partners.update(unit_of[cons.hard_neg[j]].tolist())
            partners.discard(u)
            partners.discard(-1)
            neg.append(np.array(sorted(partners), dtype=np.intp))
            labels.append(min(guests[j].id for j in idx.tolist()))
        return _Units(members, assign, demand, need, static_ok, movable, cost, neg, labels)

    # ---------------------------------------------------------------------------------------

    def fractions(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(
                self.cap > 0, self.node_load / np.where(self.cap > 0, self.cap, 1.0), 0.0
            )

    def spreads(self) -> np.ndarray:
        f = self.fractions()[self.usable]
        if f.shape[0] < 2:
            return np.zeros(len(RESOURCES))
        return f.max(axis=0) - f.min(axis=0)

    def objective(self) -> float:
        """Weighted variance of the usable nodes' fractions (Σ_r w_r Var_C(f_r))."""
        f = self.fractions()
        c = np.where(self.usable[:, None], self.cap, 0.0)
        total = c.sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(total > 0, (f * c).sum(axis=0) / np.where(total > 0, total, 1.0), 0.0)
            var = np.where(
                total > 0, (c * (f - mean) ** 2).sum(axis=0) / np.where(total > 0, total, 1.0), 0.0
            )
        return float(var @ self.weights)

    def blocked_by_partners(self, units: np.ndarray) -> np.ndarray:
        """(len(units), N): nodes holding a hard negative partner of each unit."""
        out = np.zeros((len(units), len(self.cluster.nodes)), dtype=bool)
        rows = np.nonzero(self.has_neg[units])[0]
        for row in rows.tolist():
            partners = self.units.neg[int(units[row])]
            out[row, self.units.assign[partners]] = True
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
        f = self.fractions()
        inv = np.where(self.cap > 0, 1.0 / np.where(self.cap > 0, self.cap, 1.0), 0.0)
        w = self.wnorm
        own = ((2 * d * f[src] - d**2 * inv[src]) * w).sum(axis=1)
        own = np.where(self.usable[src], own, 0.0)
        return own[:, None] - (2 * d * w) @ f[targets].T - (d**2 * w) @ inv[targets].T

    def allowed(self, units: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """(len(units), len(targets)) hard-constraint mask for moving each unit to each target."""
        ok = self.units.static_ok[np.ix_(units, targets)]
        ok &= self.usable[targets][None, :]
        ok &= self.units.assign[units][:, None] != targets[None, :]
        headroom = (self.limit - self.committed + self.tol)[targets]  # (t, D)
        # Never add to a node already over a limit.
        ok &= np.all(headroom >= self.tol[targets], axis=1)[None, :]
        need = self.units.need[units]  # (u, D)
        for dim in range(need.shape[1]):
            ok &= need[:, dim : dim + 1] <= headroom[None, :, dim]
        if self.has_neg[units].any():
            ok &= ~self.blocked_by_partners(units)[:, targets]
        return ok

    def best_swap(self, a: int, candidates: np.ndarray) -> tuple[float, int, int] | None:
        """The best exchange of a unit on node ``a`` with a unit on another node.

        Returns (gain, unit on a, unit elsewhere) or None. Both units must be movable, allowed on
        each other's node, fit there once the other has left, and keep hard anti-affinity.
        """
        units = self.units
        on_a = candidates[units.assign[candidates] == a]
        others = candidates[(units.assign[candidates] != a) & self.usable[units.assign[candidates]]]
        if on_a.size == 0 or others.size == 0 or not self.usable[a]:
            return None
        f = self.fractions()
        inv = np.where(self.cap > 0, 1.0 / np.where(self.cap > 0, self.cap, 1.0), 0.0)
        b = units.assign[others]  # (o,)
        t = units.demand[on_a][:, None, :] - units.demand[others][None, :, :]  # (x, o, R) a -> b
        diff = (f[a][None, :] - f[b])[None, :, :]
        delta = t**2 * (inv[a][None, None, :] + inv[b][None, :, :]) - 2 * t * diff
        gain = -(delta * self.wnorm[None, None, :]).sum(axis=2)  # (x, o)
        ok = units.static_ok[on_a][:, b] & units.static_ok[others][:, a][None, :]
        room = self.limit - self.committed + self.tol
        nt = units.need[on_a][:, None, :] - units.need[others][None, :, :]  # moves a -> b
        ok &= np.all(nt <= room[b][None, :, :], axis=2)
        ok &= np.all(-nt <= room[a][None, None, :], axis=2)
        blocked_x = self.blocked_by_partners(on_a)  # (x, N)
        blocked_y = self.blocked_by_partners(others)  # (o, N)
        ok &= ~blocked_x[:, b]
        ok &= ~blocked_y[:, a][None, :]
        gain = np.where(ok, gain, -np.inf)
        flat = int(np.argmax(gain))
        x, o = divmod(flat, gain.shape[1])
        if not np.isfinite(gain[x, o]) or gain[x, o] <= 0:
            return None
        return float(gain[x, o]), int(on_a[x]), int(others[o])

    def move(self, u: int, target: int) -> None:
        src = int(self.units.assign[u])
        self.node_load[src] -= self.units.demand[u]
        self.node_load[target] += self.units.demand[u]
        self.committed[src] -= self.units.need[u]
        self.committed[target] += self.units.need[u]
        self.units.assign[u] = target

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
        # Hard anti-affinity broken: the unit with the larger label moves.
        for u in range(len(assign)):
            if units.movable[u] and units.neg[u].size:
                clash = units.neg[u][assign[units.neg[u]] == assign[u]]
                if clash.size and any(units.label[u] > units.label[c] for c in clash.tolist()):
                    out.append(u)
        # Split hard-affinity bundles are gathered by moving the whole bundle.
        for u, idx in enumerate(units.members):
            if units.movable[u] and len(idx) > 1:
                nodes = self.loads.assign[idx]
                if np.any(nodes != nodes[0]):
                    out.append(u)
        return list(dict.fromkeys(out))

    def overloaded_units(self) -> list[int]:
        """For each node over a capacity limit, the movable units to take off it (smallest fit)."""
        out: list[int] = []
        over = self.committed > self.limit + self.tol
        for n in np.nonzero(over.any(axis=1))[0].tolist():
            excess = np.maximum(self.committed[n] - self.limit[n], 0.0)
            on = np.nonzero((self.units.assign == n) & self.units.movable)[0]
            # Largest first until the excess is covered in every dimension.
            order = on[np.lexsort((on, -self.units.need[on].max(axis=1)))]
            freed = np.zeros_like(excess)
            for u in order.tolist():
                if np.all(freed >= excess):
                    break
                out.append(u)
                freed += self.units.need[u]
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
    movable = state.units.demand[state.units.movable]
    typical = movable.mean(axis=0) if movable.size else np.ones(f.shape[1])
    projected = (f * (state.wnorm * typical)[None, :]).sum(axis=1)[usable_idx]
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
    limit: int = 1 << 30,
) -> list[tuple[float, int, int]]:
    """Best disjoint moves of a round: [(gain, unit, target)], each node used at most once."""
    if units.size == 0 or targets.size == 0:
        return []
    gain = state.gains(units, targets)
    ok = state.allowed(units, targets)
    gain = np.where(ok, gain, -np.inf)
    if not forced:
        gain = np.where(gain > 0, gain, -np.inf)
    # Candidate pairs, best first: at most a few per unit, so a busy target does not hide the
    # unit's next-best choice.
    best = gain.max(axis=1)
    unit_rows = np.nonzero(np.isfinite(best))[0]
    if unit_rows.size == 0:
        return []
    if not forced and unit_rows.size > 8:
        # Only a few units of each source node can be taken in a round: keep each source's
        # eight best, ordered by their best gain.
        src = state.units.assign[units[unit_rows]]
        order = np.lexsort((units[unit_rows], -best[unit_rows], src))
        first = np.r_[True, src[order][1:] != src[order][:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        rank = np.arange(len(order)) - group_start
        unit_rows = np.sort(unit_rows[order[rank < 8]])
    # Each kept unit's best few targets, so a busy target does not hide the next-best choice.
    per_unit = min(64, gain.shape[1])
    sub = gain[unit_rows]
    top = np.argsort(-sub, axis=1, kind="stable")[:, :per_unit]
    rows = np.repeat(unit_rows, per_unit)
    cols = top.ravel()
    g = gain[rows, cols]
    keep = np.isfinite(g)
    rows, cols, g = rows[keep], cols[keep], g[keep]
    if g.size == 0:
        return []
    cost = state.units.cost[units[rows]]
    if forced:
        order = np.lexsort((targets[cols], units[rows], -g))
    else:
        # Fewest moves: biggest gain first; among gains within 1 %, the cheaper migration.
        bucket = np.floor(np.log(g) / np.log(1.01))
        order = np.lexsort((targets[cols], units[rows], cost, -bucket))
    used: set[int] = set()
    moved: set[int] = set()
    picks: list[tuple[float, int, int]] = []
    n_sources = len(np.unique(state.units.assign[units[unit_rows]]))
    for k in order.tolist():
        u = int(units[rows[k]])
        t = int(targets[cols[k]])
        s = int(state.units.assign[u])
        if u in moved or s in used or t in used:
            continue
        used.update((s, t))
        moved.add(u)
        picks.append((float(g[k]), u, t))
        if len(picks) >= min(n_sources, len(targets), limit):
            break
    return picks


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


@register("balance", "opendrs: fewest, smallest migrations to a target spread; all rules hard")
def propose_balance(
    cluster: Cluster,
    *,
    forbidden: Iterable[tuple[str, str]] = (),
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
    """
    _check_options(target_spread, margin, max_moves, wide, swaps)
    options = {
        "target_spread": target_spread,
        "margin": margin,
        "max_moves": max_moves,
        "wide": wide,
        "swaps": swaps,
    }
    cons = Constraints.build(cluster, forbidden)
    state = _State(cluster, cons)
    units = state.units
    before = cluster_imbalance(cluster)
    start = units.assign.copy()
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

    # 1. Repair: units that break a hard rule now, then nodes over capacity.
    stuck: list[str] = []
    for phase in ("rules", "capacity"):
        for _ in range(len(units.assign) + 1):
            todo = state.violating_units() if phase == "rules" else state.overloaded_units()
            todo = [u for u in todo if u not in {h[0] for h in history if h[5] != "balance"}]
            if not todo or len(history) >= limit:
                break
            progressed = False
            for u in todo:
                picks = _pick(state, np.array([u], dtype=np.intp), all_nodes, forced=True)
                if picks:
                    record(u, picks[0][2], "repair: " + phase)
                    progressed = True
                    break
                stuck.append(units.label[u])
            if not progressed:
                break

    # 2. Balance.
    stopped = "move limit reached"
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
    while len(history) < limit:
        spreads = state.spreads()
        if np.all(spreads[weighted] <= goal[weighted]):
            stopped = (
                "balanced: every spread within its goal "
                f"({target_spread * 100:.2f} pp, or one guest's step where coarser): "
                "("
                + ", ".join(
                    f"{r} {s * 100:.2f} pp" for r, s in zip(RESOURCES, spreads, strict=True)
                )
                + ")"
            )
            break
        f = state.fractions()
        usable_idx = np.nonzero(state.usable)[0]
        objective = state.objective()
        sigma = np.sqrt(max(objective, 0.0))
        window = wide
        while True:
            sources, targets = _window(state, f, usable_idx, window)
            cand = np.nonzero(units.movable & np.isin(units.assign, sources))[0]
            picks = _pick(state, cand, targets, forced=False, limit=max(4, n_nodes // 8))
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
        made = 0
        # Moves chosen in one round see each other only through their disjoint nodes: keep
        # rounds short enough that later picks are not based on a stale picture.
        picks = picks[: max(4, n_nodes // 8)]
        for gain, u, t in picks:
            if len(history) >= limit:
                break
            # Pays for itself: σ falls by at least margin × the move's share of all costs.
            drop = sigma - np.sqrt(max(objective - gain, 0.0))
            if drop * 100 < margin * 100 * units.cost[u] / total_cost:
                continue
            record(u, t, "balance")
            made += 1
        if made == 0 and swaps:
            # A local optimum for single moves: try exchanging two units, from the node that
            # deviates most, when both migrations pay for themselves.
            dev = np.abs(f - state.fractions()[state.usable].mean(axis=0)) @ state.weights
            dev = np.where(state.usable, dev, -1.0)
            mean_f = state.fractions()[state.usable].mean(axis=0)
            signed = (state.fractions() - mean_f) * state.weights[None, :]
            for a in np.argsort(-dev, kind="stable")[: min(4, n_nodes)].tolist():
                # Partners: the nodes that deviate most the other way.
                opposite = -(signed @ np.sign(signed[a]))
                opposite = np.where(state.usable, opposite, -np.inf)
                opposite[a] = -np.inf
                partners = np.argsort(-opposite, kind="stable")[: min(8, n_nodes - 1)]
                pool = np.nonzero(units.movable & np.isin(units.assign, np.append(partners, a)))[0]
                found = state.best_swap(int(a), pool)
                if found is None:
                    continue
                gain, x, y = found
                drop = sigma - np.sqrt(max(objective - gain, 0.0))
                pair_cost = units.cost[x] + units.cost[y]
                if drop * 100 < margin * 100 * pair_cost / total_cost or len(history) + 2 > limit:
                    continue
                tx, ty = int(units.assign[y]), int(units.assign[x])
                record(x, tx, "balance (swap)")
                record(y, ty, "balance (swap)")
                made = 2
                break
        if made == 0:
            stopped = (
                "no allowed move pays for itself (margin "
                f"{margin:g} pp of σ per % of the cluster's migration cost)"
            )
            break

    # 3. Prune: undo moves that the target no longer needs (most expensive first).
    final = units.assign.copy()
    moved = [u for u in range(len(final)) if final[u] != start[u]]
    if np.all(state.spreads()[weighted] <= goal[weighted]):
        for u in sorted(moved, key=lambda u: (-units.cost[u], units.label[u])):
            origin = int(start[u])
            back = state.allowed(np.array([u]), np.array([origin]))[0, 0]
            here_ok = units.static_ok[u, origin] and cons.usable[origin]
            if not (back and here_ok):
                continue
            t = int(units.assign[u])
            state.move(u, origin)
            if np.all(state.spreads()[weighted] <= goal[weighted]):
                history.append((u, t, origin, 0.0, state.objective(), "pruned"))
            else:
                state.move(u, t)

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
    for u in sorted(
        (u for u in range(len(final)) if final[u] != start[u]), key=lambda u: first_seen[u]
    ):
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
        if final[u] != start[u]:
            assign[idx] = final[u]
    after = cluster_imbalance(cluster, assign)
    notes = [str(p) for p in cons.problems]
    if stuck:
        notes.append("could not repair: " + ", ".join(sorted(set(stuck))))
    return Proposal("balance", tuple(moves), before, after, stopped, tuple(notes), options)
