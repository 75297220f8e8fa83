"""``balance``'s last phase: a spread below one step on the smallest node, where whole steps allow.

``balance``'s search asks of each resource a spread of ``target_spread``, or one guest's step on
the smallest node where that is coarser (its *grain*: one vCPU on a 64-core node is 1.56 pp).
Below the grain, the nodes must sit at whole steps inside one window of ``target_spread``
(:mod:`.grain_window`, which says whether there is one and where). When the search has ended
balanced to its goals, this phase brings the nodes outside that window into it, one step at a
time, each step the one that does most for the fewest migrations:

- a **move** of a unit whose demand is a whole number of steps, from a node above its range to one
  with room below the top of its range (or from a node with steps to spare to one below its
  range);
- where no move will do, an **exchange** of two units whose demands differ by a whole number of
  steps (a guest against one of about the same memory and one vCPU fewer).

Its rule of its own, in place of the search's "pays for itself" (the objective does not see a
spread below the grain): a step must bring the nodes nearer their ranges (the steps outside them,
summed, fall) and move neither of its nodes past the other end of its range; it must keep every
other weighted resource's spread of the group within ``target_spread`` (or no wider than it is:
a memory spread of 0.98 pp may grow to 1 pp, not beyond), and the
objective no higher than it was when the balancing began (balancing never makes it worse); and it
keeps every hard constraint, as the search's moves and exchanges do (rules, capacity, and, for an
exchange, the measured headroom of :func:`.set_exchange.keeps_headroom`). Among the steps,
most steps fixed per migration added first (one that adds none counts four times its fall), then
the one that leaves the other resources' spread smallest, then the cheapest migration, then the
lowest node and unit indices: the same input, the same steps. A node for which no partner offers a
step is left; if any is left, the phase has not reached the window, and ``balance`` undoes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from opendrs.engine.usage import RESOURCES

from .grain_window import Window, common_step, levels, whole_step_window
from .set_exchange import keeps_headroom
from .state import BalanceState
from .steps import History, StepKind

#: Partner nodes a node outside its range looks at first (then all of its group).
PARTNERS = 16
#: Steps whose hard constraints are checked at once, best first.
CHECK_BLOCK = 64


@dataclass(frozen=True)
class Polish:
    """What the phase did for one resource: reached the window?, the units it moved, and why it
    stopped (one clause of ``balance``'s stop reason)."""

    reached: bool
    moved: int
    note: str


@dataclass
class _Group:
    """One architecture group's usable nodes and their ranges, in steps."""

    nodes: np.ndarray
    window: Window


def polish(
    state: BalanceState,
    r: int,
    width: float,
    ceiling: float,
    room: int,
    exchanges: bool,
    move: Callable[[int, int], None],
) -> Polish:
    """Bring resource ``r``'s spread within ``width`` in whole steps (see the module's docstring).

    ``ceiling`` is the objective no step may leave above; ``room`` the migrations left;
    ``exchanges``: exchanges of two units are allowed; ``move(unit, node)`` makes a move (and
    records it).
    """
    name = _name(r, width)
    units = state.units
    free = units.movable & ~state.broken
    demand = units.demand[free, r]
    positive = demand[demand > 0]
    step = common_step(positive)
    if step is None:
        return Polish(False, 0, f"{name}: the loads do not move in whole steps")
    groups = _groups(state, r, step, width, free)
    if groups is None:
        return Polish(False, 0, f"{name}: no window where whole steps per node add up to the total")
    done = 0
    for group in groups:
        search = _Search(state, r, step, group, width, exchanges, ceiling)
        left = search.run(room - done, move)
        done += search.moved
        if left:
            return Polish(
                False,
                done,
                f"{name}: the window was not reached ({left} nodes left outside it: no move or"
                " exchange that the rules, the capacity, the other spreads and max_moves allow)",
            )
    return Polish(True, done, f"{name}: within it in whole steps ({_moves(done)})")


def _moves(count: int) -> str:
    return f"{count} move" + ("" if count == 1 else "s")


def _name(r: int, width: float) -> str:
    return f"{RESOURCES[r]} below one step on the smallest node ({width * 100:.2f} pp)"


def _groups(
    state: BalanceState, r: int, step: float, width: float, free: np.ndarray
) -> list[_Group] | None:
    """Each architecture group's window (every group must have one), or None. A group already
    within ``width`` is left as it is."""
    units = state.units
    n_nodes = len(state.cap)
    movable_load = np.bincount(units.assign[free], weights=units.demand[free, r], minlength=n_nodes)
    out: list[_Group] = []
    for g in range(int(state.group.max(initial=-1)) + 1):
        nodes = np.nonzero(state.group == g)[0]
        if nodes.size < 2:
            continue
        f = state.kept_fractions()[nodes, r]
        if f.max() - f.min() <= width + 1e-12:
            continue
        load = state.node_load[nodes, r]
        fixed = np.maximum(load - movable_load[nodes], 0.0)
        window = whole_step_window(state.cap[nodes, r], load, step, width, fixed)
        if window is None:
            return None
        out.append(_Group(nodes, window))
    return out


class _Search:
    """The steps of one group, one at a time."""

    def __init__(
        self,
        state: BalanceState,
        r: int,
        step: float,
        group: _Group,
        width: float,
        exchanges: bool,
        ceiling: float,
    ) -> None:
        self.state = state
        self.r = r
        self.step = step
        self.nodes = group.nodes
        self.kmin = group.window.kmin
        self.kmax = group.window.kmax
        self.exchanges = exchanges
        self.others = [o for o in np.nonzero(state.weights > 0)[0].tolist() if o != r]
        f = state.kept_fractions()[self.nodes]
        spread = f.max(axis=0) - f.min(axis=0)
        #: What each other resource's spread may be after a step: the target (the width), or no
        #: wider than it is.
        self.allowed_spread = np.maximum(width, spread) + 1e-12
        self.ceiling = ceiling
        self.moved = 0

    def counts(self) -> np.ndarray:
        return levels(self.state.node_load[self.nodes, self.r], self.step)[1]

    def run(self, room: int, move: Callable[[int, int], None]) -> int:
        """Steps until every node is in its range, or none is left to take; the nodes left."""
        stuck = np.zeros(self.nodes.size, dtype=bool)
        while True:
            k = self.counts()
            dist = _outside(k, self.kmin, self.kmax)
            todo = np.where(stuck, 0, dist)
            if not dist.any() or not todo.any():
                return int(np.count_nonzero(dist))
            at = int(np.argmax(todo))
            found = self._step(at, k, dist, room - self.moved)
            if found is None:
                stuck[at] = True
                continue
            for u, t in found:
                move(u, t)
            self.moved += len(found)

    def _step(
        self, at: int, k: np.ndarray, dist: np.ndarray, room: int
    ) -> list[tuple[int, int]] | None:
        """The best step for the node at position ``at`` (outside its range), or None."""
        gives = bool(k[at] > self.kmax[at])
        spare = k - self.kmin  # steps each node may give
        space = self.kmax - k  # steps each node may take
        partner_room = space if gives else spare
        candidates = np.nonzero(partner_room > 0)[0]
        candidates = candidates[candidates != at]
        if candidates.size == 0 or room < 1:
            return None
        order = self._rank(at, candidates, dist, gives)
        for tier in (order[:PARTNERS], order[PARTNERS:]):
            for kind in ("move", "exchange") if self.exchanges and room >= 2 else ("move",):
                found = self._best(at, tier, k, gives, kind)
                if found is not None:
                    return found
        return None

    def _rank(self, at: int, candidates: np.ndarray, dist: np.ndarray, gives: bool) -> np.ndarray:
        """Partners: those outside their range (the other way) first, then those whose other
        resources take most easily what a move would carry, then by index."""
        f = self.state.kept_fractions()[self.nodes]
        sign = 1.0 if gives else -1.0
        ease = sign * (f[at, self.others] - f[candidates][:, self.others]).sum(axis=1)
        return candidates[np.lexsort((candidates, -ease, -dist[candidates]))]

    def _best(
        self, at: int, partners: np.ndarray, k: np.ndarray, gives: bool, kind: str
    ) -> list[tuple[int, int]] | None:
        """The best allowed move (or exchange) between the node at ``at`` and ``partners``."""
        rows: list[tuple[np.ndarray, ...]] = []
        for p in partners.tolist():
            giver, taker = (at, p) if gives else (p, at)
            found = self._offers(giver, taker, p, k, kind)
            if found is not None:
                rows.append(found)
        if not rows:
            return None
        score, spread, cost, node, xs, ys = (np.concatenate(c) for c in zip(*rows, strict=True))
        order = np.lexsort((ys, xs, node, cost, spread, -score))
        for begin in range(0, order.size, CHECK_BLOCK):
            for i in order[begin : begin + CHECK_BLOCK].tolist():
                giver, taker = self._pair(at, int(node[i]), gives)
                x, y = int(xs[i]), int(ys[i])
                if self._allowed(x, y, giver, taker):
                    return [(x, taker)] if y < 0 else [(x, taker), (y, giver)]
        return None

    def _pair(self, at: int, partner: int, gives: bool) -> tuple[int, int]:
        """(giver, taker) as node indices of the cluster."""
        a, p = int(self.nodes[at]), int(self.nodes[partner])
        return (a, p) if gives else (p, a)

    def _offers(
        self, giver: int, taker: int, partner: int, k: np.ndarray, kind: str
    ) -> tuple[np.ndarray, ...] | None:
        """The steps from the group's node ``giver`` to ``taker`` (positions in the group; one of
        them is ``partner``) that bring the nodes nearer their ranges and keep the other spreads:
        (score, the other resources' spread after, cost, ``partner``, unit given, unit taken back
        or −1), or None."""
        state, units, r = self.state, self.state.units, self.r
        g, t = int(self.nodes[giver]), int(self.nodes[taker])
        most = int(min(k[giver] - self.kmin[giver], self.kmax[taker] - k[taker]))
        xs = state.node_kinds(g).units
        xs = xs[units.static_ok[xs, t]] if xs.size else xs
        if most < 1 or xs.size == 0:
            return None
        qx = np.round(units.demand[xs, r] / self.step).astype(np.int64)
        if kind == "move":
            ys = np.full(xs.size, -1, dtype=np.intp)
            q = qx
            carried = units.demand[xs]
        else:
            on_t = state.node_kinds(t).units
            on_t = on_t[units.static_ok[on_t, g]] if on_t.size else on_t
            if on_t.size == 0:
                return None
            qy = np.round(units.demand[on_t, r] / self.step).astype(np.int64)
            diff = qx[:, None] - qy[None, :]
            ix, iy = np.nonzero((diff >= 1) & (diff <= most))
            xs, ys, q = xs[ix], on_t[iy], diff[ix, iy]
            carried = units.demand[xs] - units.demand[ys]
        keep = (q >= 1) & (q <= most)
        if not keep.any():
            return None
        xs, ys, q, carried = xs[keep], ys[keep], q[keep], carried[keep]
        fall = (
            _outside(k[giver], self.kmin[giver], self.kmax[giver])
            + _outside(k[taker], self.kmin[taker], self.kmax[taker])
            - _outside(k[giver] - q, self.kmin[giver], self.kmax[giver])
            - _outside(k[taker] + q, self.kmin[taker], self.kmax[taker])
        )
        spread = self._spread_after(giver, taker, carried)
        ok = (fall > 0) & np.all(spread <= self.allowed_spread[self.others], axis=1)
        if not ok.any():
            return None
        xs, ys, fall, spread = xs[ok], ys[ok], fall[ok], spread[ok]
        added = state.added_migrations(xs, np.full(xs.size, t))
        cost = np.where(state.moved_of(xs), 0.0, units.cost[xs])
        if kind == "exchange":
            added = added + state.added_migrations(ys, np.full(ys.size, g))
            cost = cost + np.where(state.moved_of(ys), 0.0, units.cost[ys])
        score = np.where(added > 0, fall / np.maximum(added, 1), 4.0 * fall)
        worst = spread.max(axis=1) if spread.shape[1] else np.zeros(xs.size)
        return score, worst, cost, np.full(xs.size, partner), xs, ys

    def _spread_after(self, giver: int, taker: int, carried: np.ndarray) -> np.ndarray:
        """(steps, others) the group's spread of each other resource after each step, which
        carries ``carried`` (steps, R) from ``giver`` to ``taker`` (positions in the group)."""
        state = self.state
        if not self.others:
            return np.zeros((carried.shape[0], 0))
        f = state.kept_fractions()[self.nodes][:, self.others]
        rest = np.delete(f, [giver, taker], axis=0)
        high = rest.max(axis=0) if rest.size else np.full(len(self.others), -np.inf)
        low = rest.min(axis=0) if rest.size else np.full(len(self.others), np.inf)
        g, t = int(self.nodes[giver]), int(self.nodes[taker])
        cap, load = state.cap[:, self.others], state.node_load[:, self.others]
        f_g = (load[g] - carried[:, self.others]) / cap[g]
        f_t = (load[t] + carried[:, self.others]) / cap[t]
        return np.maximum(np.maximum(f_g, f_t), high) - np.minimum(np.minimum(f_g, f_t), low)

    def _allowed(self, x: int, y: int, giver: int, taker: int) -> bool:
        """Whether moving ``x`` to ``taker`` (and ``y`` to ``giver``) keeps every hard constraint
        and the objective at most the ceiling."""
        state, units = self.state, self.state.units
        carried = units.demand[x] - (units.demand[y] if y >= 0 else 0.0)
        if state.objective() - _gain(state, giver, taker, carried) > self.ceiling:
            return False
        if y < 0:
            return state.allowed_one(x, taker)
        check = state.swap_check(giver, np.array([x]), np.array([y]))
        if not bool(check(np.array([0]), np.array([0]))[0]):
            return False
        return keeps_headroom(state, giver, taker, units.need[x] - units.need[y])


def _gain(state: BalanceState, a: int, b: int, t: np.ndarray) -> float:
    """The objective's fall when ``t`` (R,) moves from node ``a`` to node ``b`` of one group (see
    :mod:`.set_exchange`)."""
    f, inv, w = state.kept_fractions(), state.inv_cap, state.wnorm
    return float((2 * w * (f[a] - f[b]) * t - w * (inv[a] + inv[b]) * t * t).sum())


def _outside(k: np.ndarray | int, kmin: np.ndarray | int, kmax: np.ndarray | int) -> np.ndarray:
    """Steps outside the range ``[kmin, kmax]``."""
    return np.maximum(np.asarray(k) - kmax, 0) + np.maximum(kmin - np.asarray(k), 0)


def polish_below_grain(
    history: History,
    grain: np.ndarray,
    target_spread: float,
    ceiling: float,
    limit: int,
    exchanges: bool,
) -> list[str]:
    """The final phase of a balanced search: each weighted resource whose goal is its grain,
    coarser than ``target_spread``, and whose spread is above it, brought within it in whole
    steps where a window allows (:func:`polish`), each move recorded in ``history`` (at most
    ``limit`` steps), the objective never above ``ceiling``; a polish that does not reach the
    window is undone, and the resource keeps its grain goal. ``state.goal`` is tightened to
    ``target_spread`` for the resources polished. One clause per resource tried, for the stop
    reason."""
    state = history.state
    goal = state.goal
    clauses: list[str] = []
    # A goal looser than the grain (``cpu_commit_spread``) was asked for: no polish below it.
    coarse = (state.weights > 0) & (grain > target_spread) & (goal <= grain + 1e-9)
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
            lambda u, t: history.record(u, t, StepKind.BELOW_GRAIN),
        )
        if result.reached:
            goal[r] = target_spread + 1e-12
            clauses.append(result.note)
            continue
        history.undo_since(mark)
        clauses.append(result.note + f"; its goal stays one step ({grain[r] * 100:.2f} pp)")
    return clauses
