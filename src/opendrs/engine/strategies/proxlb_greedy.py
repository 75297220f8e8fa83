"""``proxlb-greedy``: ProxLB 2.3.0's own greedy balancer, on opendrs's model and constraints.

ProxLB (``models/calculations.py``) balances on **one** resource,
``method`` (``memory``, ``cpu`` or ``disk``), read in one ``mode``: ``used`` (measured use) or
``assigned`` (configured sizes). By default the method is the one the cluster balances: ``cpu``
when its settings weigh cpu alone (``weight_memory`` 0, as a proxlb-solver scenario with
``method: cpu`` is imported), read ``assigned`` in static mode; otherwise ``memory`` (ProxLB's
default), read ``used``. Its figures are percentages of each node's total, over the nodes
ProxLB sees — every online node, those in maintenance included. One run:

1. **Maintenance first** — every running guest on a node in maintenance goes, in guest order, to
   the *most free node* (the lowest percentage among the nodes not in maintenance, the first in
   node order on a tie), recomputed after each guest.
2. **Trigger** — balancing is needed when the spread (highest − lowest percentage) is more than
   ``balanciness`` percentage points, or when an affinity rule is broken (a group split over nodes
   or with a member on a maintenance node, two members of an anti-affinity group on one node: ProxLB
   overwrites ``enforce_affinity`` with "a violation exists").
3. **Groups** — every guest is in one affinity group (its hard-affinity bundle, or alone). Groups
   are sorted by (member count, memory used), ascending; with ``larger_first`` the memory goes
   descending; ties keep the guest order. For each group in turn:

   * the trigger is checked again: the run **stops** once balanced (and no rule is broken);
   * the most free node is taken;
   * if the group's node is no longer the one with the highest ``method`` *used* percentage (ProxLB
     reads the used figure in every mode), the group is skipped (ProxLB's ``break``);
   * ProxLB's only capacity check: each member's used memory must be **less than** the free memory
     of that most free node, else the group stays;
   * a member of an anti-affinity group is sent instead to the first node, in node order, that
     the group has not used yet in this run (not in maintenance);
   * a member with a node affinity (a ProxLB pin) goes to the most free of its pinned nodes; a
     non-strict affinity adds the most free node overall to that list, as ProxLB does;
   * the model is updated before the next group.

What opendrs changes, because its planner carries the result out for real:

* **Every hard constraint holds.** Each target ProxLB would consider is first filtered by
  :meth:`~opendrs.engine.placement.PlacementState.allowed` — capacity in every dimension, hard
  (anti-)affinity, strict node affinity, architecture, usable nodes and ``forbidden`` placements.
  ProxLB's choices (most free node, first unused node, most free pinned node) are made among the
  nodes left; when none is left the group stays. ProxLB's redirects after its memory check could
  overload a node (gyptazy #378); here they cannot.
* **Bundles move whole.** A group of guests kept together by hard affinity moves as one unit
  (its members' memory checked in turn against the same node); ProxLB moves members one by one and
  can leave a group split when it breaks off half way. Bundles already split are left to the
  repair of ``balance``.
* Guests that may not move (ignored, locked, local devices or disks, containers without restart
  migration, minimum uptime) stay — ProxLB still moves ignored guests in its model, which skews
  the rest of its run. A guest moves at most once per run.
* CPU is counted in cores on both sides (ProxLB mixes cores and fractions); the disk figures are
  the nodes' storage pools and the guests' local disks.
* ``max_moves`` caps the migrations (ProxLB has no cap); a bundle that would pass it is skipped.
* A broken rule counts wherever it is: ProxLB's ``validate_affinity_map`` sets its flag one guest
  late and so misses a violation by the last guest it checks.

Deterministic: groups, nodes and rules are visited in the cluster's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from opendrs.engine.constraints import movability
from opendrs.engine.distinct import distinct
from opendrs.engine.placement import PlacementState
from opendrs.engine.usage import MeasuredUsage
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster
from opendrs.model.rules import GuestAffinity, NodeAffinity

from .base import (
    Proposal,
    ProposedMove,
    Request,
    Stop,
    Strategy,
    StrategyOptions,
    bundle_moves,
    start,
)

NAME = "proxlb-greedy"
METHODS: tuple[str, ...] = ("memory", "cpu", "disk")
MODES: tuple[str, ...] = ("used", "assigned")
DEFAULT_BALANCINESS = 10.0
#: Resource columns of the ProxLB figures.
_COL = {"cpu": 0, "memory": 1, "disk": 2}
#: Notes kept about guests that stay (the rest are counted).
MAX_NOTES = 20


@dataclass
class _Figures:
    """ProxLB's node figures: totals, used and assigned amounts per (node, cpu|memory|disk)."""

    total: np.ndarray  # (N, 3)
    used: np.ndarray  # (N, 3)
    assigned: np.ndarray  # (N, 3)
    #: Per guest: used and assigned amounts (G, 3).
    g_used: np.ndarray
    g_assigned: np.ndarray

    def percent(self, amounts: np.ndarray, col: int) -> np.ndarray:
        total = self.total[:, col]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total > 0, amounts[:, col] / np.where(total > 0, total, 1.0), 0.0) * 100

    def move(self, members: list[int], src: int, dst: int) -> None:
        for j in members:
            self.used[src] -= self.g_used[j]
            self.used[dst] += self.g_used[j]
            self.assigned[src] -= self.g_assigned[j]
            self.assigned[dst] += self.g_assigned[j]


def _figures(
    cluster: Cluster, usage: MeasuredUsage, proxlb_guest: np.ndarray, assign: np.ndarray
) -> _Figures:
    """ProxLB's figures of ``cluster`` placed as ``assign``, measured use read from ``usage``."""
    nodes, guests = cluster.nodes, cluster.guests
    total = np.array(
        [
            [cluster.net_cpu(n), float(cluster.net_memory(n)), float(sum(n.storage.values()))]
            for n in nodes
        ],
        dtype=np.float64,
    ).reshape(len(nodes), 3)
    used = np.column_stack([usage.base_cpu, usage.base_memory, np.zeros(len(nodes))])
    local_disks = np.array([float(g.local_disk_bytes) for g in guests], dtype=np.float64)
    g_used = np.column_stack([usage.cpu, usage.memory, local_disks]).reshape(len(guests), 3)
    assigned = np.zeros((len(nodes), 3))
    g_assigned = np.array(
        [[g.cpu, float(g.memory), float(g.local_disk_bytes)] for g in guests], dtype=np.float64
    ).reshape(len(guests), 3)
    idx = np.nonzero(proxlb_guest)[0]
    for col in range(3):
        used[:, col] += np.bincount(assign[idx], weights=g_used[idx, col], minlength=len(nodes))
        assigned[:, col] += np.bincount(
            assign[idx], weights=g_assigned[idx, col], minlength=len(nodes)
        )
    # Local disks fill their node's pools whether the guest runs or not.
    stopped = np.nonzero(~proxlb_guest & (assign >= 0))[0]
    used[:, 2] += np.bincount(assign[stopped], weights=g_used[stopped, 2], minlength=len(nodes))
    return _Figures(total, used, assigned, g_used, g_assigned)


def _check_options(
    method: str, mode: str, balanciness: float, larger_first: bool, max_moves: int | None
) -> None:
    """ValueError naming the first bad option."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if mode not in MODES:
        hint = " (psi is not supported)" if mode == "psi" else ""
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}{hint}")
    if (
        isinstance(balanciness, bool)
        or not isinstance(balanciness, int | float)
        or not np.isfinite(balanciness)
        or balanciness < 0
    ):
        raise ValueError(f"balanciness: expected a finite number ≥ 0, got {balanciness!r}")
    if not isinstance(larger_first, bool):
        raise ValueError(f"larger_first: expected true or false, got {larger_first!r}")
    if max_moves is not None and (
        isinstance(max_moves, bool) or not isinstance(max_moves, int) or max_moves < 0
    ):
        raise ValueError(f"max_moves: expected a whole number ≥ 0, got {max_moves!r}")


class _Run:
    """One ProxLB run over a placement state."""

    def __init__(
        self,
        cluster: Cluster,
        state: PlacementState,
        usage: MeasuredUsage,
        method: str,
        mode: str,
        balanciness: float,
        max_moves: int | None,
    ) -> None:
        self.cluster = cluster
        self.state = state
        self.col = _COL[method]
        self.method, self.mode = method, mode
        self.balanciness = float(balanciness)
        self.limit = max_moves if max_moves is not None else len(cluster.guests) + 1
        nodes = cluster.nodes
        #: The nodes ProxLB sees: online ones, in maintenance or not.
        self.seen = np.array([n.online for n in nodes], dtype=bool)
        self.maint = np.array([n.maintenance for n in nodes], dtype=bool)
        #: Guests ProxLB sees: running (or paused) on a node it sees.
        assign = state.assign
        self.proxlb_guest = state.running & (assign >= 0) & self.seen[np.maximum(assign, 0)]
        self.fig = _figures(cluster, usage, self.proxlb_guest, assign)
        self._cache: tuple[np.ndarray, float, int] | None = None
        self.moves: list[ProposedMove] = []
        self.moved: set[int] = set()
        self.notes: list[str] = []
        self.untold = 0
        cons = state.constraints
        gidx = cluster.guest_index
        #: Anti-affinity groups (every negative rule), members ProxLB sees, in rule order.
        self.anti: list[tuple[GuestAffinity, list[int]]] = []
        for rule in cons.rules.guest_affinity:
            if rule.positive:
                continue
            members = [gidx[g] for g in rule.guests if g in gidx]
            self.anti.append((rule, [j for j in members if self.proxlb_guest[j]]))
        self.used_nodes: dict[str, list[int]] = {rule.name: [] for rule, _ in self.anti}
        self.node_rules: dict[int, list[NodeAffinity]] = {}
        for rule in cons.rules.node_affinity:
            for g in rule.guests:
                j = gidx.get(g)
                if j is not None:
                    self.node_rules.setdefault(j, []).append(rule)

    # -- figures (cached until the next move) ---------------------------------------------------

    def _figures(self) -> tuple[np.ndarray, float, int]:
        if self._cache is None:
            amounts = self.fig.used if self.mode == "used" else self.fig.assigned
            percent = self.fig.percent(amounts, self.col)
            values = percent[self.seen]
            spread = float(values.max() - values.min()) if values.size else 0.0
            used = np.where(self.seen, self.fig.percent(self.fig.used, self.col), -np.inf)
            self._cache = (percent, spread, int(np.argmax(used)))
        return self._cache

    def balance_percent(self) -> np.ndarray:
        """(N,) the ``method`` percentage in ``mode`` (what the trigger and most-free use)."""
        return self._figures()[0]

    def spread(self) -> float:
        """Highest − lowest :meth:`balance_percent` over the nodes ProxLB sees."""
        return self._figures()[1]

    def highest(self) -> int:
        """The node with the highest ``method`` *used* percentage (first in node order)."""
        return self._figures()[2]

    def most_free(self, mask: np.ndarray) -> int | None:
        """The node with the lowest percentage among ``mask`` (first in node order), or None."""
        ok = mask & self.seen & ~self.maint
        if not ok.any():
            return None
        return int(np.argmin(np.where(ok, self.balance_percent(), np.inf)))

    def memory_free(self, n: int) -> float:
        return max(0.0, float(self.fig.total[n, 1] - self.fig.used[n, 1]))

    # -- rules --------------------------------------------------------------------------------

    def violation(self) -> bool:
        """Whether an affinity or anti-affinity group is broken (ProxLB's ``enforce_affinity``).

        Every guest is in an affinity group (alone or not): a member on a node in maintenance, or
        members on several nodes, break it; so do two members of an anti-affinity group on one
        node, or one on a node in maintenance.
        """
        assign = self.state.assign
        placed = self.proxlb_guest
        if np.any(self.maint[assign[placed]]):
            return True
        for group in self.state.constraints.groups:
            members = group[placed[group]]
            if distinct(assign[members]).size > 1:
                return True
        for _rule, members in self.anti:
            where = assign[members]
            if distinct(where).size < where.size:
                return True
        return False

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self.untold += 1

    # -- moves --------------------------------------------------------------------------------

    def allowed(self, members: np.ndarray) -> np.ndarray:
        return self.state.allowed(members) & self.seen & ~self.maint

    def movable(self, members: list[int], purpose: str) -> str | None:
        guests = self.cluster.guests
        for m in members:
            if not self.proxlb_guest[m]:
                return f"{guests[m].id}: not running on a node ProxLB sees (its bundle stays)"
            why = movability(guests[m], self.cluster, purpose)  # type: ignore[arg-type]
            if why is not None:
                return f"{guests[m].id}: {why}"
            if m in self.moved:
                return f"{guests[m].id}: moved already in this run"
        return None

    def commit(self, members: np.ndarray, target: int, reason: str) -> None:
        cluster = self.cluster
        names = [n.name for n in cluster.nodes]
        before = self.spread()
        by_source: dict[int, list[int]] = {}
        for m in members.tolist():
            by_source.setdefault(int(self.state.assign[m]), []).append(m)
        for s, group in by_source.items():
            self.fig.move([m for m in group if self.proxlb_guest[m]], s, target)
        self._cache = None
        self.state.commit(members, target)
        after = self.spread()
        leader = min(cluster.guests[m].id for m in members.tolist())
        for s, group in sorted(by_source.items()):
            if s == target:
                continue
            self.moves += bundle_moves(
                cluster,
                group,
                leader,
                names[s],
                names[target],
                metric=f"{self.method} {self.mode} spread (pp)",
                before=before,
                after=after,
                reason=reason,
            )
        self.moved.update(members.tolist())

    def migrations(self) -> int:
        return len(self.moves)

    def room_for(self, members: np.ndarray) -> bool:
        current = np.asarray(self.state.assign[members])
        return self.migrations() + int(np.count_nonzero(current >= 0)) <= self.limit

    # -- the two phases -----------------------------------------------------------------------

    def maintenance(self) -> None:
        """Guests on maintenance nodes to the most free node, one by one (no memory check)."""
        names = [n.name for n in self.cluster.nodes]
        for j in range(len(self.cluster.guests)):
            src = int(self.state.assign[j])
            if not self.proxlb_guest[j] or j in self.moved or not self.maint[src]:
                continue
            members = self.state.bundle(j)
            why = self.movable(members.tolist(), "evacuate")
            if why is not None:
                self.note(f"maintenance: {why}, it stays on {names[src]}")
                continue
            if not self.room_for(members):
                self.note(f"maintenance: move limit {self.limit} reached")
                continue
            target = self.most_free(self.allowed(members))
            if target is None:
                label = self.cluster.guests[j].id
                self.note(f"maintenance: no allowed node for {label}, it stays")
                continue
            pct = self.balance_percent()
            self.commit(
                members,
                target,
                f"ProxLB: {names[src]} is in maintenance; {names[target]} is the most free "
                f"({self.method} {self.mode} {pct[target]:.1f} %)",
            )

    def groups(self, larger_first: bool) -> list[np.ndarray]:
        """Affinity groups (bundles) ProxLB sees, sorted by (members, memory used)."""
        cons = self.state.constraints
        memory = self.fig.g_used[:, 1]
        sign = -1.0 if larger_first else 1.0
        out: list[tuple[int, float, int, np.ndarray]] = []
        singles = np.nonzero(self.proxlb_guest & (cons.group_of < 0))[0]
        out.extend(
            (1, sign * float(memory[j]), j, np.array([j], dtype=np.intp)) for j in singles.tolist()
        )
        for group in cons.groups:
            running = group[self.proxlb_guest[group]]
            if running.size:
                key = (int(running.size), sign * float(memory[running].sum()), int(running[0]))
                out.append((*key, group))
        out.sort(key=lambda t: (t[0], t[1], t[2]))
        return [t[3] for t in out]

    def balanced(self, spread: float) -> tuple[str, Stop]:
        """Why a run stops at a ``spread`` within the balanciness (a sentence and a stop)."""
        said = (
            f"balanced: {self.method} {self.mode} spread {spread:.1f} pp ≤ "
            f"balanciness {self.balanciness:g} pp"
        )
        measure = f"{self.method} {self.mode} spread"
        figures: dict[str, float | str] = {"measure": measure, "unit": "pp", "value": spread}
        figures["threshold"] = self.balanciness
        return said, Stop("below_threshold", figures)

    def relocate(self, larger_first: bool, enforce: bool) -> tuple[str, Stop]:
        """ProxLB's relocation of the guests, group by group: why it stopped."""
        cluster = self.cluster
        names = [n.name for n in cluster.nodes]
        guests = cluster.guests
        for members in self.groups(larger_first):
            spread = self.spread()
            if spread <= self.balanciness and not enforce:
                return self.balanced(spread)
            if self.migrations() >= self.limit:
                stop = Stop("move_limit", {"max_moves": self.limit})
                return f"move limit {self.limit} reached", stop
            src = int(self.state.assign[members[0]])
            if self.highest() != src:
                continue  # ProxLB's break: the group's node is no longer the busiest
            if members.size > 1:
                if not self.proxlb_guest[members].all():
                    continue  # a stopped member: the bundle stays (ProxLB does not see it)
                if np.any(self.state.assign[members] != src):
                    continue  # split bundle: left to the repair of balance
            if self.movable(members.tolist(), "balance") is not None:
                continue
            label = min(guests[m].id for m in members.tolist())
            if not self.room_for(members):
                continue
            allowed = self.allowed(members)
            target = self.most_free(allowed)
            if target is None:
                self.note(f"{label}: no allowed node, it stays on {names[src]}")
                continue
            short = self.memory_short(members, target)
            if short is not None:
                self.note(short)
                continue
            pct = self.balance_percent()
            why = (
                f"ProxLB: {names[src]} is the busiest ({self.method} used "
                f"{self.fig.percent(self.fig.used, self.col)[src]:.1f} %); "
                f"{names[target]} is the most free ({self.method} {self.mode} {pct[target]:.1f} %)"
            )
            target, why = self.redirect(members, allowed, target, why)
            if target is None:
                self.note(f"{label}: no allowed pinned node, it stays on {names[src]}")
                continue
            if target == src:
                continue
            self.commit(members, target, why)
        return "every group visited", Stop("every_group_visited")

    def memory_short(self, members: np.ndarray, target: int) -> str | None:
        """ProxLB's only capacity check, against the most free node ``target``, member by
        member: why the first member that does not fit stays, or None when all fit."""
        free = self.memory_free(target)
        for m in members.tolist():
            need = float(self.fig.g_used[m, 1])
            if not need < free:
                return (
                    f"{self.cluster.guests[m].id}: ProxLB's memory check: needs "
                    f"{need / 2**30:.2f} GiB, {self.cluster.nodes[target].name} has "
                    f"{free / 2**30:.2f} GiB free; it stays"
                )
            free -= need
        return None

    def redirect(
        self, members: np.ndarray, allowed: np.ndarray, target: int, why: str
    ) -> tuple[int | None, str]:
        """ProxLB's anti-affinity and pin redirects, member by member, on allowed nodes."""
        names = [n.name for n in self.cluster.nodes]
        chosen: int | None = target
        for m in members.tolist():
            for rule, group in self.anti:
                if m not in group or len(group) < 2:
                    continue
                used = self.used_nodes[rule.name]
                for n in range(len(names)):
                    if n in used or not self.seen[n] or self.maint[n] or not allowed[n]:
                        continue
                    chosen = n
                    used.append(n)
                    why = (
                        f"ProxLB: anti-affinity group {rule.name}: {names[n]} is the first node "
                        "the group has not used yet"
                    )
                    break
            for rule in self.node_rules.get(m, []):
                pinned = np.array([n.name in rule.nodes for n in self.cluster.nodes], dtype=bool)
                if not rule.strict:
                    overall = self.most_free(allowed)
                    if overall is not None:
                        pinned[overall] = True
                chosen = self.most_free(allowed & pinned)
                if chosen is None:
                    return None, why
                pct = self.balance_percent()
                why = (
                    f"ProxLB: pinned by {rule.name}: {names[chosen]} is the most free "
                    f"({self.method} {self.mode} {pct[chosen]:.1f} %)"
                )
        return chosen, why


def propose_proxlb_greedy(
    view: CycleView, request: Request, options: ProxlbGreedyOptions
) -> Proposal:
    """ProxLB's greedy run (see the module docstring), within opendrs's hard constraints: the
    view's constraints, with the request's forbidden placements refused as well.

    ProxLB's figures are its own, from the guests' and nodes' measured usage the view balances
    on (:attr:`~opendrs.engine.view.CycleView.balancing_usage`) and their configured sizes. The
    options (:class:`ProxlbGreedyOptions`): ``method``, the one resource ProxLB balances:
    ``memory``, ``cpu`` or ``disk`` (default: the cluster's, see the module docstring);
    ``mode``, ``used`` (measured use) or ``assigned`` (configured sizes) (default: ``used``, or
    ``assigned`` for a cluster that weighs configured vCPUs alone); ``balanciness``, balance only
    while the spread of the method's percentages is above this many percentage points (ProxLB's
    default 10); ``larger_first``, visit the groups with the most memory first
    (``balance_larger_guests_first``); ``max_moves`` (the option when set, else the request's):
    at most this many migrations (None: no cap, as in ProxLB).

    Raises:
        ValueError: an option out of range (one line naming it).
    """
    method, mode = _method_and_mode(view.observed, options.method, options.mode)
    max_moves: int | None = options.pick("max_moves", request.max_moves)
    balanciness, larger_first = options.balanciness, options.larger_first
    _check_options(method, mode, balanciness, larger_first, max_moves)
    record: dict[str, object] = {
        "method": method,
        "mode": mode,
        "balanciness": balanciness,
        "larger_first": larger_first,
        "max_moves": max_moves,
    }
    begun = start(view, request.forbidden)
    usage = view.balancing_usage
    run = _Run(begun.cluster, begun.state, usage, method, mode, balanciness, max_moves)
    if not run.proxlb_guest.any():
        stopped, stop = "no running guest to balance", Stop("no_movable_guest")
    else:
        enforce = run.violation()
        run.maintenance()
        spread = run.spread()
        if spread <= run.balanciness and not enforce:
            stopped, stop = run.balanced(spread)
        else:
            stopped, stop = run.relocate(larger_first, enforce)
    if run.untold:
        run.notes.append(f"… and {run.untold} more guests that stay")
    notes = (*begun.notes, *run.notes)
    after = begun.imbalance()
    return Proposal(NAME, tuple(run.moves), begun.before, after, stopped, notes, record, stop)


def _method_and_mode(cluster: Cluster, method: str | None, mode: str | None) -> tuple[str, str]:
    """The method and mode asked, a default for what is not: the cluster's (see the module)."""
    if method is None:
        settings = cluster.settings
        cpu_alone = settings.weight_memory <= 0 < settings.weight_cpu
        method = "cpu" if cpu_alone else "memory"
        if mode is None:
            mode = "assigned" if cpu_alone and settings.mode == "static" else "used"
    return method, "used" if mode is None else mode


@dataclass(frozen=True)
class ProxlbGreedyOptions(StrategyOptions):
    """``proxlb-greedy``'s options (see :func:`propose_proxlb_greedy`)."""

    percents: ClassVar[frozenset[str]] = frozenset({"balanciness"})

    method: str | None = None
    mode: str | None = None
    balanciness: float = DEFAULT_BALANCINESS
    larger_first: bool = False
    max_moves: int | None = None

    def check(self) -> None:
        _check_options(
            METHODS[0] if self.method is None else self.method,
            MODES[0] if self.mode is None else self.mode,
            self.balanciness,
            self.larger_first,
            self.max_moves,
        )


class ProxlbGreedy:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = NAME
    summary = "ProxLB 2.3's greedy balancer: busiest node's guests to the most free node"
    Options = ProxlbGreedyOptions

    def propose(self, view: CycleView, request: Request, options: ProxlbGreedyOptions) -> Proposal:
        return propose_proxlb_greedy(view, request, options)


STRATEGIES: tuple[Strategy, ...] = (ProxlbGreedy(),)
