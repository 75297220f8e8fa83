"""``optimal`` — exact placement with CP-SAT (proxlb-solver's model, on opendrs's).

**Variables.** One Boolean ``y[b][n]`` per *unit* ``b`` and allowed node ``n``, with
``Σ_n y[b][n] = 1``. A unit is a guest, or a bundle of guests kept together by hard positive
affinity (merged transitively): one set of variables per bundle, so its members share a node by
construction. A movable unit gets a variable for each node that passes the static constraints of
every member (usable, architecture, strict node affinity and pins, not forbidden); a unit that may
not move (ignored, locked, local devices, …; see :func:`~opendrs.engine.constraints.movability`) is
fixed on its node.

**Hard constraints.**

* Capacity, per node and per :class:`~opendrs.engine.usage.CapacityModel` dimension (configured
  vCPUs against cores × overcommit, configured memory, measured use in dynamic mode, each local
  storage pool — all net of reserves and of the host's own load). The integers are chosen so that
  an answer CP-SAT accepts is truly feasible: vCPUs and cores are counted in thousandths, bytes in
  the largest unit that divides every size of the dimension (exact in practice: sizes are whole
  MiB); whenever a value is not a whole number of units, a guest's demand is rounded **up** and a
  node's room **down**. Stopped guests commit only their disks.
* Hard anti-affinity: at most one member of a rule per node. Implicit negatives (a bundle inherits
  its members' negative partners) follow from the shared unit variables.
* Maintenance and offline nodes, pins and strict node affinity: through the variables' domains.

**Objective** (all integers)::

    w_balance · spread + w_stickiness · migration cost + 1,000,000 · broken soft rules

``spread`` is the max − min, over the usable nodes, of each node's load fraction scaled to 10,000
(100 %) and rounded down, summed over the method's terms with their weights:

* ``balance`` (opendrs's default) — the cpu and memory fractions of the cluster's usage mode
  (:class:`~opendrs.engine.usage.LoadModel`: basic, static or dynamic, net of reserves, the host's
  own load included), or of its guests' pressure with ``Settings.balance_source = "pressure"``,
  each scaled by its share of ``Settings.weight_cpu/weight_memory``.
* proxlb-solver's methods, exactly as its model (their terms, weights and levels are
  :mod:`opendrs.compat.proxlb.objective`): ``memory`` (configured memory in
  MiB), ``cpu`` (measured use, or vCPUs with ``usage="assigned"``), ``disk`` (local disks against
  the node's storage), ``cpu_psi``/``memory_psi``/``io_psi`` (the guests' pressure against 100),
  ``cpu_smart``/``memory_smart``/``io_smart`` (``w_X_usage · usage + w_X_psi · psi``) and
  ``global_smart`` (``Σ w_global_R · smart_R``). Each guest's footprint is multiplied by its
  ``priority`` (1–3), and ``usage="psi"`` makes the single methods use pressure.

The migration cost of a guest is :func:`~opendrs.engine.strategies.base.migration_cost`; a soft
rule is broken when a soft positive rule's guests use more than one node, when two guests of a soft
negative rule share one, or (per guest) when a non-strict node affinity is not met.

**Balanciness** 1–5 sets ``(w_balance, w_stickiness, gap threshold)``: 1 (0, 1, 100 %),
2 (1, 50, 25 %), 3 (10, 10, 15 %), 4 (50, 5, 5 %), 5 (100, 1, 0). ``w_balance`` becomes 0 — only
forced moves remain — when the initial spread (as proxlb-solver computes it: priority-weighted,
real-valued) is below the threshold, or when utilisation thresholds are given and no usable node
exceeds one.

**Warm start and determinism.** The default strategy's answer (run with the same ``forbidden``) is
given to CP-SAT as a hint, or the current placement when that fails. With one worker (the default)
the search is deterministic: a fixed seed, and the budget counted in CP-SAT's deterministic time,
which does not depend on machine load: ``time_limit / 5`` units, which take about 40–80 % of
``time_limit`` in seconds on one core. ``time_limit`` itself is a hard wall-clock cap; only if it
strikes first (a slow or busy machine) can two runs differ, and ``options["solver"]
["deterministic"]`` then says False. With ``workers > 1`` CP-SAT runs its parallel portfolio
(with large-neighbourhood search) under the wall-clock limit only: better on large clusters, but
**not** deterministic. Whatever CP-SAT
returns, the answer is never worse than the hint or the current placement when those are feasible.

**Ties.** Among placements with the same objective, a second CP-SAT pass (run only once the first
is proven optimal) prefers the least migration effort — the migration cost, then how busy (CPU) the
moved guests are — and then placing busy guests on nodes that report less pressure.

**Strictness.** By default contradictory rules are dropped with a message (as Proxmox does), and a
guest that cannot go anywhere allowed, or may not move, stays where it is (with a note). With
``strict=True`` (proxlb-solver's semantics) each of these makes the problem INFEASIBLE.

The result is reported in ``Proposal.options["solver"]``: status (OPTIMAL, FEASIBLE, INFEASIBLE or
UNKNOWN), objective, proven bound, gap, wall time and the objective's parts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from opendrs.compat.proxlb.objective import (
    BALANCINESS,
    DEFAULT_WEIGHTS,
    LOAD_SCALE,
    PROXLB_METHODS,
    SOFT_PENALTY,
    USAGES,
    load_term,
    method_parts,
    over_thresholds,
    utilisation,
)
from opendrs.compat.proxlb.objective import initial_spread as proxlb_initial_spread
from opendrs.engine.constraints import Constraints, fails_back, movability
from opendrs.engine.imbalance import Imbalance, resource_weights
from opendrs.engine.sparse_rows import RowMask
from opendrs.engine.usage import LoadModel
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster
from opendrs.model.units import format_bytes

from .base import (
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

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

    from opendrs.model.rules import GuestAffinity

#: Balancing methods: opendrs's own, then proxlb-solver's.
METHODS: tuple[str, ...] = ("balance", *PROXLB_METHODS)
DEFAULT_TIME_LIMIT = 10.0

_MIB = 1024**2
_CPU_DIMS = ("vcpus", "cpu_used")
#: Largest number of units a capacity dimension may sum to in the model (keeps CP-SAT exact).
_MAX_UNITS = 2**48
#: Tolerance, in model units, when turning a real value into whole units.
_EPS = 1e-9
_MAX_EXPLAIN = 8

STRATEGY = "optimal"


# --------------------------------------------------------------------------------------------
# Problem data (pure numpy/ints): shared by the CP-SAT model and the exact Python evaluation


@dataclass(frozen=True)
class _Term:
    """One spread term: ``weight · (max − min)`` over ``nodes`` of ``⌊scale·load/cap⌋``."""

    name: str
    weight: int
    coeffs: np.ndarray  # (G,) int64, 0 for guests that put no load
    base: np.ndarray  # (N,) int64
    cap: np.ndarray  # (N,) int64, ≥ 1
    scale: int
    nodes: np.ndarray  # node indices taking part

    def node_loads(self, assign: np.ndarray) -> np.ndarray:
        """Scaled, rounded-down loads of the term's nodes under ``assign`` (exact integers)."""
        total = self.base.copy()
        ok = assign >= 0
        np.add.at(total, assign[ok], self.coeffs[ok])
        return (self.scale * total[self.nodes]) // self.cap[self.nodes]

    def gap(self, assign: np.ndarray) -> int:
        if self.nodes.size < 2:
            return 0
        loads = self.node_loads(assign)
        return int(loads.max() - loads.min())


@dataclass(frozen=True)
class _Score:
    """The objective of a placement and its parts."""

    objective: int
    spread: int
    cost: int
    penalty: int


@dataclass
class _Problem:
    """Everything the model needs, as integers, after the rules have been checked."""

    cluster: Cluster
    cons: Constraints
    cur: np.ndarray  # (G,) node index, -1 unknown
    present: np.ndarray  # (G,) bool: in the model (its node is known)
    movable: np.ndarray  # (G,) bool
    held: np.ndarray  # (G,) bool: kept on its node (may not move, or nowhere else to go)
    why_fixed: list[str | None]
    units: list[np.ndarray]  # guest indices
    unit_of: np.ndarray  # (G,) unit index, -1 for absent guests
    domain: list[np.ndarray]  # per unit: allowed node indices (sorted)
    dims: tuple[str, ...]
    dem: np.ndarray  # (G, D) int64 capacity demand in model units
    cap: np.ndarray  # (N, D) int64 room in model units (after relaxations)
    units_of_dim: list[float]  # bytes (or cores) per model unit, per dimension
    neg_rules: list[tuple[str, np.ndarray, frozenset[int]]]  # name, members, relaxed nodes
    soft_pos: list[tuple[str, np.ndarray]]
    soft_neg: list[tuple[str, np.ndarray]]
    not_preferred: RowMask  # (G, N) bool: a non-strict node affinity is not met there
    cost: np.ndarray  # (G,) int64 migration cost (0 for guests that cannot move)
    terms: list[_Term]
    #: The balance loads of ``cluster`` (the tie-break's exposure reads which guests load a node).
    loads: LoadModel
    #: Whether the spread reads as a percentage (one term, or ``balance``'s normalised ones).
    percent: bool = True
    notes: list[str] = field(default_factory=list)
    infeasible: list[str] = field(default_factory=list)

    # -- exact evaluation ------------------------------------------------------------------

    def hard_ok(self, assign: np.ndarray) -> bool:
        """Whether ``assign`` satisfies the model's hard constraints (as CP-SAT sees them)."""
        if np.any(assign[self.present] < 0):
            return False
        for u, members in enumerate(self.units):
            where = assign[members]
            if np.any(where != where[0]) or not np.isin(where[0], self.domain[u]):
                return False
        n_nodes = len(self.cluster.nodes)
        committed = np.zeros((n_nodes, len(self.dims)), dtype=np.int64)
        idx = np.nonzero(self.present)[0]
        np.add.at(committed, assign[idx], self.dem[idx])
        if np.any(committed > self.cap):
            return False
        for _name, members, relaxed in self.neg_rules:
            counts = np.bincount(assign[members], minlength=n_nodes)
            for n in np.nonzero(counts > 1)[0].tolist():
                if n not in relaxed:
                    return False
                if np.any(assign[members[~self.held[members]]] == n):
                    return False
        return True

    def score(self, assign: np.ndarray, w_balance: int, w_stickiness: int) -> _Score:
        """The objective of ``assign`` (exactly as the model computes it)."""
        spread = sum(t.weight * t.gap(assign) for t in self.terms)
        moved = self.present & (assign != self.cur)
        cost = int(self.cost[moved].sum())
        penalty = 0
        for _name, members in self.soft_pos:
            penalty += int(len(set(assign[members].tolist())) > 1)
        for _name, members in self.soft_neg:
            where = assign[members]
            penalty += int(len(set(where.tolist())) < len(where))
        idx = np.nonzero(self.present)[0]
        penalty += int(self.not_preferred[idx, assign[idx]].sum())
        objective = w_balance * spread + w_stickiness * cost + SOFT_PENALTY * penalty
        return _Score(objective, spread, cost, penalty)


def _int_weight(value: float) -> int | None:
    """``value`` as an int when it is integral, else None."""
    return int(value) if float(value).is_integer() else None


def _as_units(dem: np.ndarray, room: np.ndarray, dim: str) -> tuple[np.ndarray, np.ndarray, float]:
    """Demands (G,) and room (N,) of one capacity dimension in whole model units.

    Returns the integer demands (rounded up), the integer room (rounded down) and how many of the
    dimension's units (cores, bytes) one model unit is. CPU dimensions are counted in thousandths;
    byte dimensions in the greatest common divisor of their sizes, coarsened if the sums would be
    too large for exact arithmetic.
    """
    if dim in _CPU_DIMS:
        per_unit = 1e-3
        dem_units, room_units = dem * 1000.0, room * 1000.0
    else:
        values = np.concatenate([dem, room[room > 0]])
        integral = values[np.abs(values - np.round(values)) <= _EPS]
        ints = np.round(integral).astype(np.int64)
        ints = ints[ints > 0]
        exact = ints.size and integral.size == values.size
        per_unit = float(np.gcd.reduce(ints)) if exact else 1.0
        dem_units, room_units = dem / per_unit, room / per_unit
    total = float(dem_units.sum() + max(float(room_units.max(initial=0.0)), 0.0))
    if total > _MAX_UNITS:
        coarser = total / _MAX_UNITS
        per_unit *= coarser
        dem_units, room_units = dem_units / coarser, room_units / coarser
    # Demands round up, room rounds down: whatever fits in whole units fits for real.
    dem_int = np.ceil(dem_units - _EPS).astype(np.int64)
    room_int = np.floor(room_units + _EPS).astype(np.int64)
    return np.maximum(dem_int, 0), room_int, per_unit


def _fmt_amount(dim: str, value: float) -> str:
    """``30 vCPUs``, ``3.5 cores in use``, ``72.0 GiB of memory``, ``100 GiB of storage local``."""
    if dim in _CPU_DIMS:
        number = f"{value:g}" if value == int(value) else f"{value:.2f}"
        return f"{number} vCPUs" if dim == "vcpus" else f"{number} cores in use"
    what = {"memory": "memory", "memory_used": "memory in use"}.get(dim, dim.replace(":", " "))
    return f"{format_bytes(value)} of {what}"


# --------------------------------------------------------------------------------------------
# Balance terms


def _term_balance(
    cluster: Cluster, usable: np.ndarray, loads: LoadModel
) -> list[tuple[_Term, float]]:
    """opendrs's ``balance``: cpu and memory fractions of the cluster's usage mode — or of its
    guests' pressure (``Settings.balance_source``), counted in thousandths of a percent (only
    bytes are counted in MiB); ``loads``: the cluster's balance loads."""
    settings = cluster.settings
    weights = resource_weights(settings)
    out = []
    memory_unit = float(_MIB) if loads.memory_is_bytes else 1e-3
    for r, (name, per_unit) in enumerate((("cpu", 1e-3), ("memory", memory_unit))):
        scale = round(LOAD_SCALE * weights[r])
        if scale <= 0:
            continue
        coeffs = np.where(loads.active, np.round(loads.demand[:, r] / per_unit), 0).astype(np.int64)
        base = np.round(loads.base[:, r] / per_unit).astype(np.int64)
        capacity = loads.capacity[:, r]
        cap = np.maximum(np.round(capacity / per_unit), 1).astype(np.int64)
        nodes = np.nonzero(usable & (capacity > 0))[0]
        out.append((_Term(name, 1, coeffs, base, cap, scale, nodes), 1.0))
    return out


def _terms(
    cluster: Cluster,
    method: str,
    usage: str,
    w: Mapping[str, float],
    usable: np.ndarray,
    loads: LoadModel,
) -> list[_Term]:
    """The spread terms of ``method`` with integer weights (fractional weights fold in);
    ``loads``: the cluster's balance loads."""
    if method == "balance":
        pairs = _term_balance(cluster, usable, loads)
    else:  # proxlb-solver's terms, on the usable nodes
        active = loads.active
        nodes = np.nonzero(usable)[0]
        pairs = []
        for kind, weight in method_parts(method, usage, w):
            coeffs, cap, scale = load_term(cluster, kind, usage, active)
            zero = np.zeros(len(cluster.nodes), dtype=np.int64)
            pairs.append((_Term(kind, 1, coeffs, zero, cap, scale, nodes), weight))
    out = []
    for term, weight in pairs:
        if weight <= 0:
            continue
        as_int = _int_weight(weight)
        if as_int is not None:
            out.append(
                _Term(term.name, as_int, term.coeffs, term.base, term.cap, term.scale, term.nodes)
            )
        else:
            coeffs = np.round(term.coeffs * weight).astype(np.int64)
            base = np.round(term.base * weight).astype(np.int64)
            out.append(_Term(term.name, 1, coeffs, base, term.cap, term.scale, term.nodes))
    return out


# --------------------------------------------------------------------------------------------
# Initial spread and utilisation thresholds (real-valued)


def initial_spread(
    cluster: Cluster,
    method: str,
    usage: str = "used",
    weights: Mapping[str, float] | None = None,
    loads: LoadModel | None = None,
) -> float:
    """The spread the balanciness threshold is compared with (a fraction; proxlb-solver's rule).

    ``balance``: the weighted spread of the cpu and memory fractions (cluster's usage mode).
    proxlb-solver's methods (:func:`opendrs.compat.proxlb.objective.initial_spread`): the
    priority-weighted spread of the method's resource; ``X_smart`` the weighted mean of its usage
    and pressure spreads; ``global_smart`` the mean of the three usage spreads weighted by
    ``w_global_*``. Only usable nodes count. ``loads``: the cluster's balance loads, when they are
    built already.
    """
    if method != "balance":
        return proxlb_initial_spread(cluster, method, usage, weights)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    loads = loads if loads is not None else LoadModel.build(cluster)
    frac = loads.fractions()
    ws = resource_weights(cluster.settings)
    total = 0.0
    for r in range(2):
        col = frac[usable & (loads.capacity[:, r] > 0), r]
        if col.size:
            total += ws[r] * float(col.max() - col.min())
    return total


def thresholds_exceeded(
    cluster: Cluster,
    method: str,
    thresholds: Mapping[str, float | None],
    loads: LoadModel | None = None,
) -> tuple[bool, list[str]]:
    """Whether any usable node's utilisation exceeds its threshold (percent), and which.

    Raw utilisation, without priorities: for proxlb-solver's methods measured CPU over cores,
    configured memory over memory and local disks over storage, without reserves (its rule,
    :func:`opendrs.compat.proxlb.objective.utilisation`); for ``balance`` the cpu and memory
    fractions of the cluster's usage mode, net of reserves (``loads``: the cluster's balance
    loads, when they are built already).
    """
    fractions = utilisation(cluster)
    if method == "balance":
        loads = loads if loads is not None else LoadModel.build(cluster)
        frac = loads.fractions()
        fractions["cpu"] = np.where(loads.capacity[:, 0] > 0, frac[:, 0], 0.0)
        fractions["memory"] = np.where(loads.capacity[:, 1] > 0, frac[:, 1], 0.0)
    return over_thresholds(cluster, fractions, thresholds)


# --------------------------------------------------------------------------------------------
# Building the problem


def _negative_conflicts(cons: Constraints) -> list[tuple[str, list[str]]]:
    """Hard negative rules with two or more guests in one hard-affinity bundle."""
    gidx = cons.cluster.guest_index
    out = []
    for rule in cons.rules.guest_affinity:
        if rule.positive or not rule.hard:
            continue
        groups = [int(cons.group_of[gidx[g]]) for g in rule.guests if g in gidx]
        seen: dict[int, int] = {}
        for grp in groups:
            if grp >= 0:
                seen[grp] = seen.get(grp, 0) + 1
        clashing = [grp for grp, count in seen.items() if count > 1]
        if clashing:
            members = cons.groups[clashing[0]]
            names = sorted(
                cons.cluster.guests[m].id
                for m in members.tolist()
                if cons.cluster.guests[m].id in rule.guests
            )
            out.append((rule.name, names))
    return out


def _rejection(cons: Constraints, j: int, n: int) -> str:
    """Why node ``n`` is not allowed for guest ``j`` by the static constraints."""
    node = cons.cluster.nodes[n]
    if not node.online:
        return "offline"
    if node.maintenance:
        return "maintenance"
    if not cons.arch_ok[j, n]:
        return f"architecture {node.arch}"
    if not cons.strict_ok[j, n]:
        guest = cons.cluster.guests[j]
        rules = cons.rules.node_rules_for(guest.id)
        names = [r.name for r in rules if r.strict]
        if not names and fails_back(guest):
            return "HA failback (" + ", ".join(r.name for r in rules) + ")"
        return "strict node affinity" + (f" ({', '.join(names)})" if names else "")
    if not cons.permitted[j, n]:
        return "forbidden"
    return "allowed"


@dataclass
class _Messages:
    """The notes and, in strict mode, the reasons for infeasibility found while building."""

    strict: bool
    notes: list[str] = field(default_factory=list)
    infeasible: list[str] = field(default_factory=list)

    def either(self, text: str, relaxed: str = "") -> None:
        """``text`` makes the problem infeasible in strict mode; else it is a note, ``relaxed``
        saying what happens instead."""
        if self.strict:
            self.infeasible.append(text)
        else:
            self.notes.append(text + relaxed)


def _contradictions(cons: Constraints, say: _Messages) -> set[str]:
    """Report the contradictory rules (dropped in relaxed mode) and the hard negative rules
    that hard affinity contradicts; the names of those negative rules dropped."""
    for problem in cons.problems:
        if say.strict:
            quoted = ", ".join(f"'{r}'" for r in problem.rules)
            say.infeasible.append(
                f"rule{'s' if len(problem.rules) > 1 else ''} {quoted}: {problem.reason}"
            )
        else:
            say.notes.append(str(problem))
    dropped_neg: set[str] = set()
    for rule_name, members in _negative_conflicts(cons):
        together = ", ".join(f"'{m}'" for m in members)
        if say.strict:
            say.infeasible.append(
                f"rule '{rule_name}' keeps {together} apart, hard affinity together"
            )
        else:
            say.notes.append(
                f"Drop rule '{rule_name}', because hard affinity keeps {together} together"
            )
            dropped_neg.add(rule_name)
    return dropped_neg


def _current(
    cluster: Cluster, usable: np.ndarray, say: _Messages
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Each guest's node index (-1 unknown: left out, with a note), whether it is in the model,
    and why it may not move (None: it may)."""
    guests = cluster.guests
    cur = np.array([cluster.node_index.get(g.node, -1) for g in guests], dtype=np.intp)
    present = cur >= 0
    for j in np.nonzero(~present)[0].tolist():
        say.notes.append(f"guest {guests[j].id} is on unknown node {guests[j].node}: left out")
    why_fixed: list[str | None] = []
    for j, guest in enumerate(guests):
        if not present[j]:
            why_fixed.append("unknown node")
            continue
        purpose = "balance" if usable[cur[j]] else "evacuate"
        held = movability(guest, cluster, purpose)
        why_fixed.append(None if held is None else str(held))
    return cur, present, why_fixed


class _UnitBuilder:
    """Cuts the guests into units: hard-affinity bundles (merged) and single guests, with their
    domains. ``held`` marks guests kept on their node: they may not move, or (relaxed mode)
    cannot go anywhere."""

    def __init__(
        self,
        cons: Constraints,
        cur: np.ndarray,
        movable: np.ndarray,
        why_fixed: list[str | None],
        say: _Messages,
    ) -> None:
        self.cons = cons
        self.cur = cur
        self.movable = movable
        self.why_fixed = why_fixed
        self.say = say
        self.guests = cons.cluster.guests
        self.names = [n.name for n in cons.cluster.nodes]
        self.static = cons.static_ok()
        self.units: list[np.ndarray] = []
        self.domain: list[np.ndarray] = []
        self.held = np.zeros(len(self.guests), dtype=bool)

    def build(self, present: np.ndarray) -> np.ndarray:
        """Cut the guests ``present`` into units; the unit of each guest (-1: absent)."""
        n_guests = len(self.guests)
        in_group = np.zeros(n_guests, dtype=bool)
        for group in self.cons.groups:
            members = group[present[group]]
            in_group[members] = True
            if members.size:
                self.group(members)
        for j in range(n_guests):
            if present[j] and not in_group[j]:
                self.single(j)
        unit_of = np.full(n_guests, -1, dtype=np.intp)
        for u, members in enumerate(self.units):
            unit_of[members] = u
        return unit_of

    def add(self, members: np.ndarray, dom: np.ndarray) -> None:
        self.units.append(members)
        self.domain.append(dom)

    def hold(self, j: int) -> None:
        self.held[j] = True
        self.add(np.array([j], dtype=np.intp), np.array([self.cur[j]], dtype=np.intp))

    def single(self, j: int) -> None:
        """Guest ``j`` as a unit of its own."""
        cur, names, guest_id = self.cur, self.names, self.guests[j].id
        if not self.movable[j]:
            if self.say.strict and not self.static[j, cur[j]]:
                self.say.infeasible.append(
                    f"guest {guest_id} may not move ({self.why_fixed[j]}) but node "
                    f"{names[cur[j]]} is not allowed for it "
                    f"({_rejection(self.cons, j, int(cur[j]))})"
                )
            self.hold(j)
            return
        dom = np.nonzero(self.static[j])[0]
        if dom.size == 0:
            reasons = "; ".join(
                f"{names[n]}: {_rejection(self.cons, j, n)}" for n in range(len(names))
            )
            text = f"no node can take guest {guest_id} ({reasons or 'no nodes'})"
            self.say.either(text, f": it stays on {names[cur[j]]}")
            self.hold(j)
            return
        self.add(np.array([j], dtype=np.intp), dom)

    def apart(self, text: str, members: np.ndarray) -> None:
        self.say.either(text, ": kept apart")
        for m in members.tolist():
            self.single(m)

    def group(self, members: np.ndarray) -> None:
        """A hard-affinity group's guests ``members`` (present ones) as one unit where they can
        be: on the node of those that may not move, or anywhere all of them are allowed."""
        label = ", ".join(self.guests[m].id for m in members.tolist())
        movable = self.movable[members]
        fixed_nodes = sorted(set(self.cur[members[~movable]].tolist()))
        ok = np.all(self.static[members[movable]], axis=0)
        if len(fixed_nodes) > 1:
            where = ", ".join(self.names[n] for n in fixed_nodes)
            self.apart(
                f"hard affinity group {label}: guests that may not move sit on {where}", members
            )
        elif fixed_nodes:
            self.gather(members, label, fixed_nodes[0])
        elif np.any(ok):
            self.add(members, np.nonzero(ok)[0])
        else:
            text = f"no node can take hard affinity group {label} (no node is allowed for all)"
            self.say.either(text, ": its guests stay where they are")
            for m in members.tolist():
                self.hold(m)

    def gather(self, members: np.ndarray, label: str, f: int) -> None:
        """Gather the group on node ``f``, of its guests that may not move: those already there
        stay, the others join if they may go there."""
        cur, static, name = self.cur, self.static, self.names[f]
        joins = (cur[members] == f) | static[members, f]
        blocked = members[~joins]
        if self.say.strict and (blocked.size or not np.all(static[members, f])):
            self.say.infeasible.append(
                f"hard affinity group {label} cannot gather on {name}, "
                "where some of its guests may not move"
            )
        if blocked.size:
            who = ", ".join(self.guests[m].id for m in blocked.tolist())
            self.say.notes.append(
                f"hard affinity group {label}: {who} may not join {name}, where the "
                "others may not move: kept apart"
            )
        staying = members[joins]
        self.held[staying[cur[staying] == f]] = True
        self.add(staying, np.array([f], dtype=np.intp))
        for m in blocked.tolist():
            self.single(m)


def _model_capacity(
    cons: Constraints, cur: np.ndarray, held: np.ndarray, say: _Messages
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Each guest's demand (G, D) and node's room (N, D) in whole model units, and the size of
    a unit per dimension; in relaxed mode room is never below what held guests need."""
    cluster, capm = cons.cluster, cons.capacity
    guests, dims = cluster.guests, capm.dims
    n_guests, n_nodes = len(guests), len(cluster.nodes)
    raw_dem = (
        np.stack([cons.guest_demand(j) for j in range(n_guests)])
        if n_guests
        else np.zeros((0, len(dims)))
    )
    raw_room = capm.limit - capm.base
    dem = np.zeros((n_guests, len(dims)), dtype=np.int64)
    cap = np.zeros((n_nodes, len(dims)), dtype=np.int64)
    per_units: list[float] = []
    for d, dim in enumerate(dims):
        dem[:, d], cap[:, d], per_unit = _as_units(raw_dem[:, d], raw_room[:, d], dim)
        per_units.append(per_unit)
    fixed_load = np.zeros_like(cap)
    fidx = np.nonzero(held)[0]
    np.add.at(fixed_load, cur[fidx], dem[fidx])
    over = fixed_load > cap
    for n, d in zip(*np.nonzero(over), strict=True):
        who = [guests[j].id for j in fidx.tolist() if cur[j] == n and dem[j, d] > 0]
        say.either(
            f"guests that may not move ({', '.join(who)}) need "
            f"{_fmt_amount(dims[d], fixed_load[n, d] * per_units[d])} on node "
            f"{cluster.nodes[n].name}, "
            f"which has {_fmt_amount(dims[d], max(cap[n, d], 0) * per_units[d])}",
            ": nothing else may use it there",
        )
    if not say.strict:
        cap = np.maximum(cap, fixed_load)
    return dem, cap, per_units


def _rule_guests(cluster: Cluster, rule: GuestAffinity, present: np.ndarray) -> np.ndarray:
    """The indices of ``rule``'s guests in the model, sorted."""
    gidx = cluster.guest_index
    members = np.array(sorted({gidx[g] for g in rule.guests if g in gidx}), dtype=np.intp)
    return members[present[members]]


def _hard_negatives(
    cons: Constraints,
    cur: np.ndarray,
    present: np.ndarray,
    held: np.ndarray,
    dropped: set[str],
    say: _Messages,
) -> list[tuple[str, np.ndarray, frozenset[int]]]:
    """The hard anti-affinity rules kept (not ``dropped``): name, members, and the nodes where
    (relaxed mode) held members already share a node: they stay, no other member comes."""
    cluster = cons.cluster
    neg_rules: list[tuple[str, np.ndarray, frozenset[int]]] = []
    for rule in cons.rules.guest_affinity:
        if rule.positive or not rule.hard or rule.name in dropped:
            continue
        members = _rule_guests(cluster, rule, present)
        if members.size < 2:
            continue
        fixed_members = members[held[members]]
        counts = np.bincount(cur[fixed_members], minlength=len(cluster.nodes))
        relaxed = frozenset(np.nonzero(counts > 1)[0].tolist())
        for n in sorted(relaxed):
            who = ", ".join(cluster.guests[m].id for m in fixed_members.tolist() if cur[m] == n)
            say.either(
                f"hard anti-affinity '{rule.name}': {who} may not move and share node "
                f"{cluster.nodes[n].name}"
            )
        neg_rules.append((rule.name, members, relaxed))
    return neg_rules


def _implicit_negatives(
    cons: Constraints,
    neg_rules: list[tuple[str, np.ndarray, frozenset[int]]],
    cur: np.ndarray,
    present: np.ndarray,
    held: np.ndarray,
    unit_of: np.ndarray,
) -> list[tuple[str, np.ndarray, frozenset[int]]]:
    """Implicit negatives (a group member inherits its partners' negatives): automatic for a
    group that is one unit; explicit pairs for a group that had to be split."""
    pairs: set[tuple[int, int]] = set()
    out: list[tuple[str, np.ndarray, frozenset[int]]] = []
    for name, members, _relaxed in neg_rules:
        for r in members.tolist():
            grp = int(cons.group_of[r])
            if grp < 0:
                continue
            group = cons.groups[grp]
            if len({int(unit_of[q]) for q in group.tolist() if present[q]}) <= 1:
                continue
            for q in group.tolist():
                for other in members.tolist():
                    if q != r and other != r and q != other and present[q]:
                        pair = (min(q, other), max(q, other))
                        if pair not in pairs:
                            pairs.add(pair)
                            both = np.array(pair, dtype=np.intp)
                            on = cur[both[held[both]]]
                            shared = (
                                frozenset(on.tolist())
                                if on.size == 2 and on[0] == on[1]
                                else frozenset()
                            )
                            out.append((f"{name} (implicit)", both, shared))
    return out


def _soft_rules(
    cons: Constraints, present: np.ndarray
) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]:
    """The soft positive and soft negative rules with two or more guests in the model."""
    soft_pos: list[tuple[str, np.ndarray]] = []
    soft_neg: list[tuple[str, np.ndarray]] = []
    for rule in cons.rules.guest_affinity:
        if rule.hard:
            continue
        members = _rule_guests(cons.cluster, rule, present)
        if members.size >= 2:
            (soft_pos if rule.positive else soft_neg).append((rule.name, members))
    return soft_pos, soft_neg


def _build(
    cluster: Cluster,
    cons: Constraints,
    loads: LoadModel,
    method: str,
    usage: str,
    weights: Mapping[str, float],
    strict: bool,
) -> _Problem:
    """The model of ``cluster`` under ``cons`` (its hard constraints, the forbidden placements
    refused) with the spread terms of ``method`` on ``loads``."""
    say = _Messages(strict)
    dropped_neg = _contradictions(cons, say)
    cur, present, why_fixed = _current(cluster, cons.usable, say)
    movable = np.array([w is None for w in why_fixed], dtype=bool) & present
    cut = _UnitBuilder(cons, cur, movable, why_fixed, say)
    unit_of = cut.build(present)
    held = cut.held
    dem, cap, per_units = _model_capacity(cons, cur, held, say)
    neg_rules = _hard_negatives(cons, cur, present, held, dropped_neg, say)
    neg_rules += _implicit_negatives(cons, neg_rules, cur, present, held, unit_of)
    soft_pos, soft_neg = _soft_rules(cons, present)
    cost = np.array(
        [
            migration_cost(g, cluster.settings) if movable[j] else 0
            for j, g in enumerate(cluster.guests)
        ],
        dtype=np.int64,
    )
    terms = _terms(cluster, method, usage, weights, cons.usable, loads)
    return _Problem(
        cluster=cluster,
        cons=cons,
        cur=cur,
        present=present,
        movable=movable,
        held=held,
        why_fixed=why_fixed,
        units=cut.units,
        unit_of=unit_of,
        domain=cut.domain,
        dims=cons.capacity.dims,
        dem=dem,
        cap=cap,
        units_of_dim=per_units,
        neg_rules=neg_rules,
        soft_pos=soft_pos,
        soft_neg=soft_neg,
        not_preferred=~cons.preferred,
        cost=cost,
        terms=terms,
        loads=loads,
        percent=method == "balance" or (len(terms) == 1 and terms[0].weight == 1),
        notes=say.notes,
        infeasible=say.infeasible,
    )


def _capacity_shortfall(p: _Problem) -> list[str]:
    """Dimensions where the guests need more than every allowed node together has."""
    out = []
    reachable = np.zeros(len(p.cluster.nodes), dtype=bool)
    for dom in p.domain:
        reachable[dom] = True
    idx = np.nonzero(p.present)[0]
    for d, dim in enumerate(p.dims):
        need = int(p.dem[idx, d].sum())
        have = int(np.maximum(p.cap[reachable, d], 0).sum())
        if need > have:
            out.append(
                f"the guests need {_fmt_amount(dim, need * p.units_of_dim[d])}, "
                f"the nodes they may use have {_fmt_amount(dim, have * p.units_of_dim[d])}"
            )
    return out


# --------------------------------------------------------------------------------------------
# The CP-SAT model


class _Model:
    """The CP-SAT model of a problem, with its objective and tie-break expressions."""

    def __init__(self, p: _Problem, w_balance: int, w_stickiness: int) -> None:
        from ortools.sat.python import cp_model  # imported when solving: it is large

        self.p = p
        self.model = cp_model.CpModel()
        self._place_units()
        self._add_capacity()
        self._add_anti_affinity()
        penalties = self._soft_penalties()
        cost_terms = self._migration_cost()
        #: Per term: the term, its (node, load variable) pairs, and its max and min variables.
        self.load_vars: list[tuple[_Term, list[tuple[int, Any]], Any, Any]] = []
        spread_terms = self._spread() if w_balance > 0 else []
        self.objective = (
            w_balance * cp_model.LinearExpr.sum(spread_terms)
            + w_stickiness * cp_model.LinearExpr.sum(cost_terms)
            + SOFT_PENALTY * cp_model.LinearExpr.sum(penalties)
        )
        self.model.minimize(self.objective)

    def _place_units(self) -> None:
        """One Boolean per unit and allowed node, exactly one true per unit (``y``), and the
        units that may go to each node (``on_node``)."""
        m = self.model
        self.y: list[dict[int, cp_model.IntVar]] = []
        for u, dom in enumerate(self.p.domain):
            row = {int(n): m.new_bool_var(f"y{u}_{n}") for n in dom.tolist()}
            m.add_exactly_one(row.values())
            self.y.append(row)
        self.on_node: list[list[int]] = [[] for _ in range(len(self.p.cluster.nodes))]
        for u, dom in enumerate(self.p.domain):
            for n in dom.tolist():
                self.on_node[n].append(u)

    def _add_capacity(self) -> None:
        """Capacity of every node and dimension (only where the units could overflow it)."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p, m = self.p, self.model
        unit_dem = (
            np.stack([p.dem[members].sum(axis=0) for members in p.units])
            if p.units
            else np.zeros((0, len(p.dims)), dtype=np.int64)
        )
        for n in range(len(p.cluster.nodes)):
            here = self.on_node[n]
            if not here:
                continue
            for d in range(len(p.dims)):
                coeffs = unit_dem[here, d]
                if int(coeffs.sum()) <= int(p.cap[n, d]):
                    continue
                nz = [(u, int(c)) for u, c in zip(here, coeffs.tolist(), strict=True) if c > 0]
                m.add(
                    cp_model.LinearExpr.weighted_sum(
                        [self.y[u][n] for u, _ in nz], [c for _, c in nz]
                    )
                    <= int(p.cap[n, d])
                )

    def _add_anti_affinity(self) -> None:
        """Hard anti-affinity: at most one member per node, except that on a relaxed node only
        the held members stay."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p, m = self.p, self.model
        for _name, members, relaxed in p.neg_rules:
            for n in range(len(p.cluster.nodes)):
                lits = [self.x(int(g), n) for g in members.tolist()]
                if n in relaxed:
                    for g in members[~p.held[members]].tolist():
                        lit = self.x(int(g), n)
                        if not isinstance(lit, int):
                            m.add(lit == 0)
                    continue
                # Members of one unit share a literal: count it once per member.
                vars_ = [lit for lit in lits if not isinstance(lit, int)]
                const = sum(lit for lit in lits if isinstance(lit, int))
                if len(vars_) + const > 1:
                    m.add(cp_model.LinearExpr.sum(vars_) + const <= 1)

    def _soft_penalties(self) -> list[Any]:
        """One 0/1 term per broken soft rule: a Boolean per soft guest-affinity rule
        (``soft_vars``), the literal of each guest on a node its node affinity does not prefer."""
        p, m = self.p, self.model
        n_nodes = len(p.cluster.nodes)
        penalties: list[Any] = []
        self.soft_vars: list[tuple[Any, bool, np.ndarray]] = []  # (var, positive, members)
        for name, members in p.soft_pos:
            v = m.new_bool_var(f"soft_pos_{name}")
            self.soft_vars.append((v, True, members))
            first = int(members[0])
            for g in members[1:].tolist():
                for n in range(n_nodes):
                    a, b = self.x(first, n), self.x(int(g), n)
                    if isinstance(a, int) and isinstance(b, int):
                        if a != b:
                            m.add(v == 1)
                        continue
                    m.add(a - b <= v)
            penalties.append(v)
        for name, members in p.soft_neg:
            v = m.new_bool_var(f"soft_neg_{name}")
            self.soft_vars.append((v, False, members))
            k = len(members)
            for n in range(n_nodes):
                lits = [self.x(int(g), n) for g in members.tolist()]
                if sum(1 for lit in lits if not isinstance(lit, int) or lit) > 1:
                    m.add(sum(lits) <= 1 + (k - 1) * v)
            penalties.append(v)
        for g in np.nonzero(p.present & p.not_preferred.row_any())[0].tolist():
            for n in np.nonzero(p.not_preferred[g])[0].tolist():
                lit = self.x(int(g), n)
                if not isinstance(lit, int) or lit:
                    penalties.append(lit)
        return penalties

    def _migration_cost(self) -> list[Any]:
        """The cost terms of the movable guests; ``moved``: whether each one moves."""
        p = self.p
        cost_terms: list[Any] = []
        self.moved: dict[int, Any] = {}
        for g in np.nonzero(p.movable)[0].tolist():
            stay = self.x(g, int(p.cur[g]))
            self.moved[g] = 1 - stay
            cost_terms.append(int(p.cost[g]) * (1 - stay))
        return cost_terms

    def _spread(self) -> list[Any]:
        """``weight · (max − min)`` of each term with two nodes or more (``load_vars``)."""
        spread_terms: list[Any] = []
        for t_i, term in enumerate(self.p.terms):
            if term.nodes.size < 2:
                continue
            node_vars, hi, lo = self._term_loads(t_i, term)
            spread_terms.append(term.weight * (hi - lo))
            self.load_vars.append((term, node_vars, hi, lo))
        return spread_terms

    def _term_loads(self, t_i: int, term: _Term) -> tuple[list[tuple[int, Any]], Any, Any]:
        """Term ``t_i``'s scaled, rounded-down load on each of its nodes (a variable where some
        unit may come, else a constant) and its max and min variables."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        m = self.model
        unit_coef = [int(term.coeffs[members].sum()) for members in self.p.units]
        total = sum(unit_coef)
        loads = []
        node_vars: list[tuple[int, Any]] = []
        ub_all = 0
        for n in term.nodes.tolist():
            here = [(u, unit_coef[u]) for u in self.on_node[n] if unit_coef[u]]
            base, cap = int(term.base[n]), int(term.cap[n])
            ub = term.scale * (base + total) // cap
            ub_all = max(ub_all, ub)
            if not here:
                loads.append(term.scale * base // cap)
                continue
            lv = m.new_int_var(0, max(ub, 0), f"l{t_i}_{n}")
            used = (
                cp_model.LinearExpr.weighted_sum(
                    [self.y[u][n] for u, _ in here], [term.scale * c for _, c in here]
                )
                + term.scale * base
            )
            m.add(cap * lv <= used)
            m.add(used <= cap * lv + cap - 1)
            loads.append(lv)
            node_vars.append((n, lv))
        hi = m.new_int_var(0, max(ub_all, 0), f"max{t_i}")
        lo = m.new_int_var(0, max(ub_all, 0), f"min{t_i}")
        for lv in loads:
            m.add(hi >= lv)
            m.add(lo <= lv)
        return node_vars, hi, lo

    def x(self, g: int, n: int) -> Any:
        """The literal "guest ``g`` on node ``n``" (a unit's variable, or the constant 0)."""
        u = int(self.p.unit_of[g])
        if u < 0:
            return 0
        return self.y[u].get(n, 0)

    def hint(self, assign: np.ndarray) -> None:
        """Hint a placement: every variable when it is complete (CP-SAT then starts from it at
        once), else the units whose hinted node is in their domain."""
        self.model.clear_hints()
        complete = True
        for u, members in enumerate(self.p.units):
            n = int(assign[members[0]])
            if n in self.y[u]:
                for node, var in self.y[u].items():
                    self.model.add_hint(var, 1 if node == n else 0)
            else:
                complete = False
        if not complete:
            return
        for term, node_vars, hi, lo in self.load_vars:
            loads = dict(zip(term.nodes.tolist(), term.node_loads(assign).tolist(), strict=True))
            for n, lv in node_vars:
                self.model.add_hint(lv, loads[n])
            self.model.add_hint(hi, max(loads.values()))
            self.model.add_hint(lo, min(loads.values()))
        for var, positive, members in self.soft_vars:
            where = assign[members].tolist()
            broken = len(set(where)) > 1 if positive else len(set(where)) < len(where)
            self.model.add_hint(var, int(broken))

    def read(self, solver: cp_model.CpSolver) -> np.ndarray:
        assign = self.p.cur.copy()
        for u, members in enumerate(self.p.units):
            for n, var in self.y[u].items():
                if solver.boolean_value(var):
                    assign[members] = n
                    break
        return assign

    def tie_break(self) -> Any:
        """Migration effort (cost, then CPU activity), then pressure exposure — integers."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p = self.p
        guests, nodes = p.cluster.guests, p.cluster.nodes
        busy_raw = np.array([g.cpu_load for g in guests], dtype=float)
        busy = (
            np.round(10 * busy_raw / busy_raw.max()).astype(np.int64)
            if busy_raw.max(initial=0) > 0
            else np.zeros(len(guests), dtype=np.int64)
        )
        effort_terms = []
        effort_max = 0
        for g, moved in self.moved.items():
            coef = 11 * int(p.cost[g]) + int(busy[g])
            effort_max += coef
            effort_terms.append(coef * moved)
        effort = cp_model.LinearExpr.sum(effort_terms)
        # Exposure: busy guests (cpu, memory, disk) on nodes reporting pressure.
        loads = p.loads
        sizes = np.array(
            [[g.cpu_load, g.memory, g.local_disk_bytes] for g in guests], dtype=float
        ).reshape(len(guests), 3)
        top = sizes.max(axis=0, initial=0)
        level = np.where(top > 0, np.round(10 * sizes / np.where(top > 0, top, 1)), 0)
        pressure = np.array(
            [[n.pressure.cpu, n.pressure.memory, n.pressure.io] for n in nodes], dtype=float
        ).reshape(len(nodes), 3)
        plevel = np.round(np.clip(pressure, 0, 100) / 10)
        exposure = (level * loads.active[:, None]) @ plevel.T  # (G, N)
        exposure = exposure.astype(np.int64)
        ex_terms = []
        ex_max = 0
        for g in np.nonzero(p.present & p.movable)[0].tolist():
            row = exposure[g]
            if not row.any():
                continue
            u = int(p.unit_of[g])
            ex_max += int(row[p.domain[u]].max())
            for n, var in self.y[u].items():
                if row[n]:
                    ex_terms.append(int(row[n]) * var)
        if not ex_terms or (ex_max + 1) * max(effort_max, 1) > 2**52:
            return effort
        return (ex_max + 1) * effort + cp_model.LinearExpr.sum(ex_terms)


#: One core does about 0.25–0.5 units of CP-SAT's deterministic time per wall-clock second
#: (measured on the benchmark clusters): a fifth of the limit normally ends the search first.
_DETERMINISTIC_SHARE = 0.2


def _solver(wall: float, workers: int, seed: int, det: float | None = None) -> cp_model.CpSolver:
    """A CP-SAT solver: ``wall`` seconds at most; with one worker also ``det`` deterministic units
    (default ``wall`` × :data:`_DETERMINISTIC_SHARE`), which normally strike first and keep the
    search repeatable."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = workers
    params.random_seed = seed
    params.log_search_progress = False
    params.max_time_in_seconds = max(wall, 0.001)
    if workers == 1:
        params.max_deterministic_time = max(
            wall * _DETERMINISTIC_SHARE if det is None else det, 0.001
        )
    return solver


# --------------------------------------------------------------------------------------------
# Explaining infeasibility


class _Explainer:
    """The hard constraints of a problem alone, on one Boolean per (guest, node) and each group
    of them behind an assumption literal named for what it is: an infeasible core names them."""

    def __init__(self, p: _Problem) -> None:
        from ortools.sat.python import cp_model  # imported when solving: it is large

        self.p = p
        self.m = cp_model.CpModel()
        self.labels: dict[int, str] = {}
        self.lits: dict[str, Any] = {}
        self.n_nodes = len(p.cluster.nodes)
        self.present = np.nonzero(p.present)[0].tolist()
        self.x = {
            g: [self.m.new_bool_var(f"x{g}_{n}") for n in range(self.n_nodes)] for g in self.present
        }
        for g in self.present:
            self.m.add_exactly_one(self.x[g])

    def lit(self, label: str) -> Any:
        """The assumption literal of the constraints called ``label``."""
        if label not in self.lits:
            var = self.m.new_bool_var(f"a{len(self.lits)}")
            self.lits[label] = var
            self.labels[var.index] = label
        return self.lits[label]

    def add_units(self) -> None:
        """Each guest held on its node or kept off the nodes it may not use; a unit's guests
        on one node."""
        p, x = self.p, self.x
        guests, nodes = p.cluster.guests, p.cluster.nodes
        for members in p.units:
            for g in members.tolist():
                if p.held[g]:
                    why = p.why_fixed[g] or "kept in place"
                    label = f"guest {guests[g].id} stays on {nodes[p.cur[g]].name} ({why})"
                    self.m.add(x[g][int(p.cur[g])] == 1).only_enforce_if(self.lit(label))
                    continue
                self._rejections(g)
            if len(members) > 1:
                label = "hard affinity " + ", ".join(guests[g].id for g in members.tolist())
                first = int(members[0])
                for g in members[1:].tolist():
                    for n in range(self.n_nodes):
                        self.m.add(x[first][n] == x[g][n]).only_enforce_if(self.lit(label))

    def _rejections(self, g: int) -> None:
        """Guest ``g`` off each node the static constraints refuse it, labelled by why."""
        guests, nodes = self.p.cluster.guests, self.p.cluster.nodes
        for n in range(self.n_nodes):
            reason = _rejection(self.p.cons, g, n)
            if reason == "allowed":
                continue
            if reason in ("offline", "maintenance"):
                label = f"node {nodes[n].name} is {reason}"
            elif reason == "forbidden":
                label = "forbidden placements (no safe migration order)"
            else:
                label = f"guest {guests[g].id}: {reason}"
            self.m.add(self.x[g][n] == 0).only_enforce_if(self.lit(label))

    def add_capacity(self) -> None:
        """Each node's capacity, per dimension, where the guests could overflow it."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p, x = self.p, self.x
        for n in range(self.n_nodes):
            for d, dim in enumerate(p.dims):
                coeffs = [(g, int(p.dem[g, d])) for g in self.present if p.dem[g, d] > 0]
                if sum(c for _, c in coeffs) <= int(p.cap[n, d]):
                    continue
                self.m.add(
                    cp_model.LinearExpr.weighted_sum(
                        [x[g][n] for g, _ in coeffs], [c for _, c in coeffs]
                    )
                    <= int(p.cap[n, d])
                ).only_enforce_if(self.lit(f"{dim} capacity of {p.cluster.nodes[n].name}"))

    def add_anti_affinity(self) -> None:
        """Each hard anti-affinity rule: at most one member per node (on a relaxed node, only
        its held members)."""
        p, x = self.p, self.x
        for name, members, relaxed in p.neg_rules:
            label = f"hard anti-affinity '{name}'"
            for n in range(self.n_nodes):
                if n in relaxed:
                    for g in members[~p.held[members]].tolist():
                        self.m.add(x[g][n] == 0).only_enforce_if(self.lit(label))
                else:
                    apart = sum(x[g][n] for g in members.tolist()) <= 1
                    self.m.add(apart).only_enforce_if(self.lit(label))

    def core(self, time_limit: float) -> list[str]:
        """The labels of a set of constraints that admit no placement together (sorted; none
        when CP-SAT does not prove infeasibility within ``time_limit``, 5 s at most)."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        self.m.add_assumptions(list(self.lits.values()))
        solver = _solver(min(time_limit, 5.0), 1, 0)
        status = solver.solve(self.m)
        if status != cp_model.INFEASIBLE:
            return []
        found = solver.sufficient_assumptions_for_infeasibility()
        return sorted({self.labels[i] for i in found if i in self.labels})


def _explain(p: _Problem, time_limit: float) -> list[str]:
    """A small set of hard constraints that together admit no placement (CP-SAT assumptions)."""
    explainer = _Explainer(p)
    explainer.add_units()
    explainer.add_capacity()
    explainer.add_anti_affinity()
    return explainer.core(time_limit)


# --------------------------------------------------------------------------------------------
# The strategy


def _hint_assign(
    view: CycleView, forbidden: frozenset[tuple[str, str]], hint: str | None, notes: list[str]
) -> tuple[np.ndarray, str]:
    """The warm start: the default (or named) strategy's placement on ``view``, else the current
    one."""
    from opendrs.engine.strategies import DEFAULT_STRATEGY, get_strategy

    cluster = view.cluster
    cur = np.array([cluster.node_index.get(g.node, -1) for g in cluster.guests], dtype=np.intp)
    name = DEFAULT_STRATEGY if hint is None else hint
    if name in ("current", STRATEGY):
        return cur, "current"
    try:
        proposal = get_strategy(name).propose(view, Request(forbidden=forbidden))
    except Exception as exc:  # a failing warm start is not fatal: start from the current placement
        notes.append(
            f"warm start {name} failed ({type(exc).__name__}: {exc}); hint: current placement"
        )
        return cur, "current"
    assign = cur.copy()
    for guest_id, target in proposal.placement.items():
        j = cluster.guest_index.get(guest_id)
        n = cluster.node_index.get(target)
        if j is not None and n is not None:
            assign[j] = n
    return assign, name


def _term_weights(given: Mapping[str, float | None]) -> dict[str, float]:
    """The smart methods' term weights: the defaults, overridden where ``given``."""
    chosen = {**DEFAULT_WEIGHTS, **{k: v for k, v in given.items() if v is not None}}
    return {k: float(v) for k, v in chosen.items()}


def _validate(
    method: str,
    usage: str,
    balanciness: int,
    w_balance: int | None,
    w_stickiness: int | None,
    time_limit: float,
    workers: int,
    weights: Mapping[str, float],
    thresholds: Mapping[str, float | None],
    seed: int,
    hint: str | None,
) -> None:
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r} (known: {', '.join(METHODS)})")
    if usage not in USAGES:
        raise ValueError(f"usage: expected one of {', '.join(USAGES)}, got {usage!r}")
    if isinstance(balanciness, bool) or balanciness not in BALANCINESS:
        raise ValueError(f"balanciness: expected 1 to 5, got {balanciness!r}")
    for key, value in (("w_balance", w_balance), ("w_stickiness", w_stickiness)):
        if value is not None and (
            isinstance(value, bool) or not float(value).is_integer() or value < 0
        ):
            raise ValueError(f"{key}: expected a whole number ≥ 0, got {value!r}")
    for key, value in weights.items():
        if isinstance(value, bool) or not math.isfinite(float(value)) or value < 0:
            raise ValueError(f"{key}: expected a number ≥ 0, got {value!r}")
    if not time_limit > 0 or not math.isfinite(time_limit):
        raise ValueError(f"time_limit: expected seconds > 0, got {time_limit!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a whole number ≥ 1, got {workers!r}")
    for key, value in thresholds.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0
        ):
            raise ValueError(f"{key}_threshold: expected a percentage ≥ 0, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed: expected a whole number from 0 to 2³¹ − 1, got {seed!r}")
    if hint is not None:
        from opendrs.engine.strategies import REGISTRY

        if hint != "current" and hint not in REGISTRY:
            known = ", ".join(["current", *sorted(REGISTRY)])
            raise ValueError(f"hint: unknown strategy {hint!r} (known: {known})")


def _spread_text(p: _Problem, before: int, after: int) -> str:
    """``spread 40.0% -> 5.0%`` (a weighted sum of spreads is shown as a plain number)."""
    if p.percent:
        return f"spread {before / LOAD_SCALE:.1%} -> {after / LOAD_SCALE:.1%}"
    return f"weighted spread {before / LOAD_SCALE:.3f} -> {after / LOAD_SCALE:.3f}"


def _move_reason(p: _Problem, g: int, current_ok_nodes: set[int]) -> str:
    """Why guest ``g`` moves: the hard rule its current node breaks, or balance."""
    cluster, cons = p.cluster, p.cons
    n = int(p.cur[g])
    node = cluster.nodes[n]
    if not node.online:
        return f"leaves {node.name}: offline"
    if node.maintenance:
        return f"leaves {node.name}: maintenance"
    reason = _rejection(cons, g, n)
    if reason != "allowed":
        return f"leaves {node.name}: {reason}"
    if n not in current_ok_nodes:
        return f"leaves {node.name}: over capacity"
    u = int(p.unit_of[g])
    members = p.units[u]
    if members.size > 1 and np.any(p.cur[members] != n):
        return "joins its hard affinity partners"
    for name, rule_members, _relaxed in p.neg_rules:
        if g in rule_members and np.sum(p.cur[rule_members] == n) > 1:
            return f"hard anti-affinity '{name}'"
    return "better balance"


#: The options echoed in ``Proposal.options`` before the smart methods' term weights, and after.
_ECHOED_FIRST = (
    "method",
    "balanciness",
    "w_balance",
    "w_stickiness",
    "cpu_threshold",
    "memory_threshold",
    "disk_threshold",
    "usage",
)
_ECHOED_LAST = ("time_limit", "workers", "seed", "strict", "hint")


def _read_arguments(
    arguments: Mapping[str, Any],
) -> tuple[dict[str, float], dict[str, float | None], dict[str, Any]]:
    """The term weights, the utilisation thresholds and the options to echo, from
    :func:`propose_optimal`'s ``arguments`` (by name); ValueError naming a bad one."""
    given = {key: arguments[key] for key in _TERM_WEIGHTS}
    weights = _term_weights(given)
    thresholds = {r: arguments[f"{r}_threshold"] for r in ("cpu", "memory", "disk")}
    _validate(
        arguments["method"],
        arguments["usage"],
        arguments["balanciness"],
        arguments["w_balance"],
        arguments["w_stickiness"],
        arguments["time_limit"],
        arguments["workers"],
        weights,
        thresholds,
        arguments["seed"],
        arguments["hint"],
    )
    options = {key: arguments[key] for key in _ECHOED_FIRST}
    if arguments["method"].endswith("_smart"):
        options.update({key: weights[key] for key in given})
    options.update({key: arguments[key] for key in _ECHOED_LAST})
    return weights, thresholds, options


def _objective_weights(
    cluster: Cluster,
    method: str,
    usage: str,
    weights: Mapping[str, float],
    thresholds: Mapping[str, float | None],
    loads: LoadModel,
    level: tuple[int, int | None, int | None],
) -> tuple[int, int, float, str | None]:
    """``(w_balance, w_stickiness, initial spread, note)``: the weights of the balanciness
    ``level`` (with the given ``w_balance``, ``w_stickiness`` overrides), ``w_balance`` 0 — and
    a note why — below the level's gap threshold or when no node exceeds a utilisation
    threshold."""
    balanciness, w_balance, w_stickiness = level
    level_wb, level_ws, gap_threshold = BALANCINESS[balanciness]
    wb = int(w_balance) if w_balance is not None else level_wb
    ws = int(w_stickiness) if w_stickiness is not None else level_ws
    start_spread = initial_spread(cluster, method, usage, weights, loads)
    balance_note = None
    if wb and start_spread < gap_threshold:
        balance_note = (
            f"balancing off: initial spread {start_spread:.1%} is below the level-{balanciness} "
            f"threshold {gap_threshold:.0%}"
        )
        wb = 0
    if wb and any(v is not None for v in thresholds.values()):
        exceeded, _which = thresholds_exceeded(cluster, method, thresholds, loads)
        if not exceeded:
            set_ = ", ".join(f"{k} {v:g}%" for k, v in thresholds.items() if v is not None)
            balance_note = f"balancing off: no usable node exceeds a threshold ({set_})"
            wb = 0
    return wb, ws, start_spread, balance_note


@dataclass
class _Outcome:
    """How :func:`propose_optimal` reports its answer, whichever way it ends: the proposal's
    options (``solver`` the solver's report, filled in as the search goes) and notes."""

    cluster: Cluster
    loads: LoadModel
    before: Imbalance
    started: float
    options: dict[str, Any]
    notes: list[str]
    workers: int
    seed: int

    @property
    def solver(self) -> dict[str, Any]:
        solver: dict[str, Any] = self.options["solver"]
        return solver

    def finish(
        self, moves: tuple[ProposedMove, ...], after_assign: np.ndarray | None, stopped: str
    ) -> Proposal:
        """The proposal: ``moves`` to ``after_assign`` (None: nothing found), why it stopped."""
        info = self.solver
        info["wall_time"] = round(time.perf_counter() - self.started, 6)
        after = (
            self.before
            if after_assign is None
            else cluster_imbalance(self.cluster, after_assign, self.loads)
        )
        summary = f"CP-SAT {info['status']}"
        if info["objective"] is not None:
            summary += f": objective {info['objective']}, bound {info['bound']}"
            if info["gap"] is not None:
                summary += f", gap {info['gap']:.2%}"
        plural = "s" if self.workers > 1 else ""
        summary += (
            f"; {info['wall_time'] * 1000:.0f} ms, {self.workers} worker{plural}, seed {self.seed}"
        )
        notes = (*self.notes, summary)
        return Proposal(STRATEGY, moves, self.before, after, stopped, notes, self.options)

    def infeasible(self, reasons: list[str]) -> Proposal:
        """The proposal when no placement keeps the hard constraints, for these ``reasons``."""
        self.solver["status"] = "INFEASIBLE"
        shown = reasons[:_MAX_EXPLAIN] + (
            [f"{len(reasons) - _MAX_EXPLAIN} more"] if len(reasons) > _MAX_EXPLAIN else []
        )
        self.solver["reasons"] = reasons
        return self.finish(
            (), None, "infeasible: no placement satisfies the hard constraints: " + "; ".join(shown)
        )


def _solver_report(p: _Problem, wb: int, ws: int, start_spread: float) -> dict[str, Any]:
    """The solver's report before the search (``Proposal.options["solver"]``)."""
    return {
        "status": "UNKNOWN",
        "feasible": False,
        "objective": None,
        "bound": None,
        "gap": None,
        "wall_time": 0.0,
        "w_balance": wb,
        "w_stickiness": ws,
        "initial_spread": start_spread,
        "guests": int(p.present.sum()),
        "units": len(p.units),
        "nodes": len(p.cluster.nodes),
    }


@dataclass(frozen=True)
class _References:
    """The two placements the answer is never worse than (when they are feasible): the
    current one and the warm start's (``hint``, None when infeasible)."""

    cur: np.ndarray
    cur_ok: bool
    cur_score: _Score
    hint: np.ndarray
    hint_score: _Score | None

    @classmethod
    def build(
        cls,
        p: _Problem,
        warm: CycleView,
        forbidden: frozenset[tuple[str, str]],
        hint: str | None,
        out: _Outcome,
        weights: tuple[int, int],
    ) -> _References:
        """Both placements scored with ``weights`` (w_balance, w_stickiness); the warm start
        is ``hint``'s answer on ``warm`` (its notes go to ``out``), recorded in its report."""
        hint_assign, hint_name = _hint_assign(warm, forbidden, hint, out.notes)
        out.solver["hint"] = hint_name
        cur = p.cur
        cur_ok = p.hard_ok(cur)
        cur_score = p.score(cur, *weights)
        hint_ok = p.hard_ok(hint_assign)
        hint_score = p.score(hint_assign, *weights) if hint_ok else None
        out.solver["current_objective"] = cur_score.objective
        out.solver["current_feasible"] = cur_ok
        out.solver["hint_objective"] = hint_score.objective if hint_score else None
        return cls(cur, cur_ok, cur_score, hint_assign, hint_score)

    def start(self) -> np.ndarray:
        """The placement to hint: the warm start's unless the current one is better."""
        hint_score, cur_ok = self.hint_score, self.cur_ok
        if hint_score is not None and (
            not cur_ok or hint_score.objective <= self.cur_score.objective
        ):
            return self.hint
        return self.cur if cur_ok else self.hint

    def candidates(self) -> list[tuple[int, int, np.ndarray, str]]:
        """``(objective, rank, placement, source)`` of those that are feasible."""
        out: list[tuple[int, int, np.ndarray, str]] = []
        if self.hint_score is not None:
            out.append((self.hint_score.objective, 1, self.hint, "hint"))
        if self.cur_ok:
            out.append((self.cur_score.objective, 2, self.cur, "current"))
        return out


@dataclass(frozen=True)
class _Budget:
    """The search's limits: wall-clock seconds, CP-SAT workers and seed."""

    time_limit: float
    workers: int
    seed: int


def _first_pass(
    model: _Model, budget: _Budget, info: dict[str, Any]
) -> tuple[cp_model.CpSolver, int]:
    """Solve ``model`` for the objective: the solver and its status (its figures go to the
    report ``info``)."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    solver = _solver(budget.time_limit, budget.workers, budget.seed)
    status = solver.solve(model.model)
    det_used = solver.deterministic_time
    info["phase1_wall_time"] = round(solver.wall_time, 6)
    info["deterministic_time"] = round(det_used, 6)
    # Repeatable unless the wall-clock cap, not the deterministic budget, ended the search.
    info["deterministic"] = budget.workers == 1 and (
        status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
        or det_used >= budget.time_limit * _DETERMINISTIC_SHARE * 0.999
    )
    return solver, status


def _solver_candidate(
    p: _Problem, model: _Model, solver: cp_model.CpSolver, status: int, weights: tuple[int, int]
) -> tuple[list[tuple[int, int, np.ndarray, str]], int | None]:
    """The solver's placement as a candidate (none without a solution) and its proven bound."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = solver.best_objective_bound
        return [], math.floor(bound + 1e-6) if math.isfinite(bound) else None
    assign = model.read(solver)
    score = p.score(assign, *weights)
    # The spread's max/min variables may hold slack in a solution not proven optimal, so the
    # model's value is an upper bound of the exact one; at the optimum they agree.
    model_value = round(solver.objective_value)
    if score.objective > model_value or (
        status == cp_model.OPTIMAL and score.objective != model_value
    ):
        raise RuntimeError(
            f"optimal: model and evaluation disagree ({score.objective} vs {model_value})"
        )
    return [(score.objective, 0, assign, "solver")], math.floor(solver.best_objective_bound + 1e-6)


def _tie_break(
    p: _Problem,
    model: _Model,
    first: cp_model.CpSolver,
    best: tuple[int, np.ndarray],
    budget: _Budget,
    weights: tuple[int, int],
) -> tuple[np.ndarray, str]:
    """Second pass, in the time the ``first`` left: among placements as good as ``best``
    (objective, placement), the least migration effort and exposure; the placement and
    CP-SAT's status."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    best_obj, final = best
    limit = budget.time_limit
    det_left = max(limit * _DETERMINISTIC_SHARE - first.deterministic_time, 0.03 * limit)
    wall_left = max(limit - first.wall_time, 0.1 * limit)
    model.model.add(model.objective <= best_obj)
    model.model.minimize(model.tie_break())
    model.hint(final)
    solver = _solver(wall_left, budget.workers, budget.seed, det_left)
    status = solver.solve(model.model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        assign = model.read(solver)
        if p.score(assign, *weights).objective == best_obj:
            final = assign
    return final, solver.status_name(status)


def _record_answer(
    info: dict[str, Any],
    final: _Score,
    current: _Score,
    bound: int | None,
    proven: bool,
    source: str,
) -> None:
    """The answer's figures in the solver's report ``info``: ``final``'s score against the
    ``current`` placement's, the ``bound`` and gap, where it came from."""
    info.update(
        status="OPTIMAL" if proven else "FEASIBLE",
        feasible=True,
        objective=final.objective,
        bound=min(bound, final.objective) if bound is not None else None,
        spread=final.spread,
        migration_cost=final.cost,
        soft_penalties=final.penalty,
        current_spread=current.spread,
        source=source,
    )
    if proven:
        info["bound"] = final.objective
    b = info["bound"]
    info["gap"] = (final.objective - b) / max(1, abs(final.objective)) if b is not None else None


def _moves(
    p: _Problem, final: np.ndarray, scores: tuple[_Score, _Score], wb: int
) -> tuple[ProposedMove, ...]:
    """The migrations from the current placement to ``final``, each with why it moves;
    ``scores``: the current and final placements' (``wb``: the balance weight)."""
    cur_score, final_score = scores
    cluster, cur = p.cluster, p.cur
    moved = np.nonzero(p.present & (final != cur))[0].tolist()
    committed = np.zeros_like(p.cap)
    idx = np.nonzero(p.present)[0]
    np.add.at(committed, cur[idx], p.dem[idx])
    ok_nodes = set(np.nonzero(np.all(committed <= p.cap, axis=1))[0].tolist())
    nodes = cluster.nodes
    moves = []
    for g in moved:
        guest = cluster.guests[g]
        reason = _move_reason(p, g, ok_nodes)
        if reason == "better balance":
            parts = []
            if wb and final_score.spread < cur_score.spread:
                parts.append(_spread_text(p, cur_score.spread, final_score.spread))
            if final_score.penalty < cur_score.penalty:
                parts.append(f"broken soft rules {cur_score.penalty} -> {final_score.penalty}")
            reason = ", ".join(parts) or reason
        moves.append(
            ProposedMove(
                guest=guest.id,
                source=nodes[cur[g]].name,
                target=nodes[final[g]].name,
                metric="objective",
                before=float(cur_score.objective),
                after=float(final_score.objective),
                cost=migration_cost(guest, cluster.settings),
                reason=reason,
            )
        )
    return tuple(moves)


def _stopped(
    p: _Problem,
    moves: tuple[ProposedMove, ...],
    refs: _References,
    final_score: _Score,
    wb: int,
    proven: bool,
    balance_note: str | None,
    bound: int | None,
) -> str:
    """Why the search stopped and what it found."""
    cur_score = refs.cur_score
    quality = "optimal" if proven else "best found in the time limit"
    if moves:
        stopped = (
            f"{quality}: {len(moves)} migration{'s' if len(moves) != 1 else ''}, objective "
            f"{cur_score.objective} -> {final_score.objective}"
            + (f", {_spread_text(p, cur_score.spread, final_score.spread)}" if wb else "")
        )
    elif balance_note and refs.cur_ok:
        stopped = balance_note + "; the current placement keeps every hard constraint"
    else:
        stopped = f"{quality}: the current placement is best (objective {final_score.objective})"
    if not proven and bound is not None:
        stopped += f"; bound {bound}"
    return stopped


def _search(
    p: _Problem,
    refs: _References,
    out: _Outcome,
    budget: _Budget,
    weights: tuple[int, int],
    balance_note: str | None,
) -> Proposal:
    """Solve ``p`` with CP-SAT from ``refs``'s start; the best of its answer and ``refs``, the
    tie broken when it is proven optimal, as a proposal."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    model = _Model(p, *weights)
    model.hint(refs.start())
    solver, status = _first_pass(model, budget, out.solver)
    if status == cp_model.INFEASIBLE:
        reasons = _explain(p, budget.time_limit) or ["CP-SAT proved that no placement exists"]
        return out.infeasible(reasons)
    if status == cp_model.MODEL_INVALID:  # a bug, not an input problem
        raise RuntimeError(f"optimal: CP-SAT rejected the model: {model.model.validate()}")
    candidates, bound = _solver_candidate(p, model, solver, status, weights)
    candidates += refs.candidates()
    if not candidates:
        out.solver["status"] = solver.status_name(status)
        return out.finish(
            (), None, f"no feasible placement found within the time limit ({budget.time_limit:g} s)"
        )
    best_obj, _rank, final, source = min(candidates, key=lambda c: (c[0], c[1]))
    proven = status == cp_model.OPTIMAL and source == "solver"
    if source != "solver":
        out.notes.append(f"kept the {source} placement: CP-SAT found nothing better in time")
    if proven:
        final, out.solver["tie_break"] = _tie_break(
            p, model, solver, (best_obj, final), budget, weights
        )
    final_score = p.score(final, *weights)
    _record_answer(out.solver, final_score, refs.cur_score, bound, proven, source)
    moves = _moves(p, final, (refs.cur_score, final_score), weights[0])
    bound = out.solver["bound"]
    stopped = _stopped(p, moves, refs, final_score, weights[0], proven, balance_note, bound)
    return out.finish(moves, final, stopped)


def propose_optimal(
    cluster: Cluster,
    *,
    forbidden: Iterable[tuple[str, str]] = (),
    constraints: Constraints | None = None,
    loads: LoadModel | None = None,
    method: str = "balance",
    balanciness: int = 3,
    w_balance: int | None = None,
    w_stickiness: int | None = None,
    cpu_threshold: float | None = None,
    memory_threshold: float | None = None,
    disk_threshold: float | None = None,
    usage: str = "used",
    w_cpu_usage: float | None = None,
    w_cpu_psi: float | None = None,
    w_mem_usage: float | None = None,
    w_mem_psi: float | None = None,
    w_io_usage: float | None = None,
    w_io_psi: float | None = None,
    w_global_mem: float | None = None,
    w_global_cpu: float | None = None,
    w_global_io: float | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    workers: int = 1,
    seed: int = 0,
    strict: bool = False,
    hint: str | None = None,
) -> Proposal:
    """The placement that minimises the objective (see the module docstring), with CP-SAT.

    Args:
        forbidden: (guest, node) placements that must not be chosen (no safe order reaches them).
        constraints, loads: the models a cycle view built already — its constraints, capacity
            on the usage it checks, ``forbidden`` not yet refused (:func:`constraints_for`), and
            ``cluster``'s balance loads; without them they are built from ``cluster``. The
            warm start's strategy gets them too.
        method: ``balance`` (default) or one of proxlb-solver's methods (:data:`METHODS`).
        balanciness: 1 (conservative: only forced moves) to 5 (aggressive).
        w_balance, w_stickiness: override the level's weights (whole numbers).
        cpu_threshold, memory_threshold, disk_threshold: utilisation in percent; when any is set,
            balancing happens only if some usable node exceeds one.
        usage: proxlb-solver's ``mode``: ``used`` (measured CPU), ``assigned`` (vCPUs) or ``psi``.
        w_*: term weights of the smart methods (defaults: :data:`DEFAULT_WEIGHTS`).
        time_limit: CP-SAT's budget in wall-clock seconds (with one worker, a fifth of it in
            deterministic time normally ends the search first, so that runs repeat).
        workers: CP-SAT search workers; more than one is faster but not deterministic.
        seed: CP-SAT's random seed.
        strict: proxlb-solver's semantics — contradictory rules, guests that cannot be placed
            anywhere allowed and fixed guests that break a hard rule make the problem infeasible.
        hint: the strategy whose answer warms the search (default: the default strategy);
            ``current`` starts from the current placement.
    """
    arguments = dict(locals())  # every argument by name (nothing else is defined yet)
    started = time.perf_counter()
    weights, thresholds, options = _read_arguments(arguments)
    forbidden_set = frozenset((str(g), str(n)) for g, n in forbidden)
    options["forbidden"] = len(forbidden_set)
    loads = loads if loads is not None else LoadModel.build(cluster)
    before = cluster_imbalance(cluster, loads=loads)
    level = (balanciness, w_balance, w_stickiness)
    wb, ws, start_spread, balance_note = _objective_weights(
        cluster, method, usage, weights, thresholds, loads, level
    )

    # Built once without the forbidden placements: the warm start's strategy refuses them too.
    constraints = constraints if constraints is not None else Constraints.build(cluster)
    cons = constraints_for(cluster, forbidden_set, constraints)
    p = _build(cluster, cons, loads, method, usage, weights, strict)
    notes = list(p.notes)
    if balance_note:
        notes.append(balance_note)
    options["solver"] = _solver_report(p, wb, ws, start_spread)
    out = _Outcome(cluster, loads, before, started, options, notes, workers, seed)
    if p.infeasible:
        return out.infeasible(p.infeasible)
    shortfall = _capacity_shortfall(p)
    if shortfall:
        return out.infeasible(shortfall)

    # Warm start and the two reference placements (never return worse than them).
    warm = CycleView.holding(cluster, constraints=constraints, loads=loads)
    refs = _References.build(p, warm, forbidden_set, hint, out, (wb, ws))
    return _search(p, refs, out, _Budget(time_limit, workers, seed), (wb, ws), balance_note)


# --------------------------------------------------------------------------------------------
# Exact repairs (the fallback of ``balance``'s greedy repair)

#: Wall-clock bound of an exact repair, seconds. With one worker a fifth of it in deterministic
#: time normally ends the search first, so that the answer repeats (see ``_solver``).
REPAIR_TIME_LIMIT = 10.0


@dataclass(frozen=True)
class RepairSolution:
    """What the exact repair model found: the node of each unit, or None without a solution.

    ``status`` is CP-SAT's (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN); ``deterministic`` says that
    the deterministic budget, not the wall clock, ended the search (the answer repeats).
    """

    status: str
    choice: np.ndarray | None
    deterministic: bool


def solve_repair(
    need: np.ndarray,
    room: np.ndarray,
    dims: tuple[str, ...],
    domain: list[np.ndarray],
    cost: list[np.ndarray],
    apart: list[tuple[int, int]],
    *,
    time_limit: float = REPAIR_TIME_LIMIT,
    seed: int = 0,
) -> RepairSolution:
    """The cheapest placement of some units that keeps every hard constraint, with CP-SAT.

    ``need`` (U, D) is each unit's capacity demand, ``room`` (N, D) what the guests left out of
    the model leave free on each node (negative where they alone are over a limit); ``domain[u]``
    the nodes unit ``u`` may end on and ``cost[u]`` the migration cost of each of them (0 where
    it is now); ``apart`` pairs of units that may not share a node. One worker, a fixed seed and a
    deterministic budget: the same input gives the same answer.
    """
    from ortools.sat.python import cp_model  # imported when solving: it is large

    if _repair_short(need, room, domain):
        return RepairSolution("INFEASIBLE", None, True)
    m = cp_model.CpModel()
    y: list[dict[int, Any]] = []
    for u, dom in enumerate(domain):
        row = {int(n): m.new_bool_var(f"y{u}_{n}") for n in dom.tolist()}
        m.add_exactly_one(row.values())
        y.append(row)
    _repair_capacity(m, y, need, room, dims)
    for a, b in apart:
        for n in set(y[a]) & set(y[b]):
            m.add(y[a][n] + y[b][n] <= 1)
    terms = [
        int(c) * y[u][int(n)]
        for u, dom in enumerate(domain)
        for n, c in zip(dom.tolist(), cost[u].tolist(), strict=True)
        if c
    ]
    m.minimize(cp_model.LinearExpr.sum(terms))
    for u, dom in enumerate(domain):
        stay = dom[cost[u] == 0]
        for n, var in y[u].items():
            m.add_hint(var, int(stay.size > 0 and n == int(stay[0])))
    solver = _solver(time_limit, 1, seed)
    status = solver.solve(m)
    deterministic = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or (
        solver.deterministic_time >= time_limit * _DETERMINISTIC_SHARE * 0.999
    )
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return RepairSolution(solver.status_name(status), None, deterministic)
    choice = np.array(
        [next(n for n, var in row.items() if solver.boolean_value(var)) for row in y],
        dtype=np.intp,
    )
    return RepairSolution(solver.status_name(status), choice, deterministic)


def _repair_short(need: np.ndarray, room: np.ndarray, domain: list[np.ndarray]) -> bool:
    """Whether the units need more, in some dimension, than all their nodes have together (a
    proof of infeasibility CP-SAT may take long to find)."""
    if not domain:
        return False
    nodes = np.unique(np.concatenate(domain))
    have = np.maximum(room[nodes], 0.0).sum(axis=0)
    return bool(np.any(need.sum(axis=0) > have * (1 + 1e-9) + 1e-9))


def _repair_capacity(
    m: cp_model.CpModel,
    y: list[dict[int, Any]],
    need: np.ndarray,
    room: np.ndarray,
    dims: tuple[str, ...],
) -> None:
    """Capacity of every node and dimension, in whole model units (see :func:`_as_units`)."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    on_node: dict[int, list[int]] = {}
    for u, row in enumerate(y):
        for n in row:
            on_node.setdefault(n, []).append(u)
    for d, dim in enumerate(dims):
        dem, cap, _per_unit = _as_units(need[:, d], room[:, d], dim)
        for n, here in sorted(on_node.items()):
            terms = [(y[u][n], int(dem[u])) for u in here if dem[u] > 0]
            if sum(c for _, c in terms) > int(cap[n]):
                m.add(
                    cp_model.LinearExpr.weighted_sum([v for v, _ in terms], [c for _, c in terms])
                    <= int(cap[n])
                )


_TERM_WEIGHTS: tuple[str, ...] = (
    "w_cpu_usage",
    "w_cpu_psi",
    "w_mem_usage",
    "w_mem_psi",
    "w_io_usage",
    "w_io_psi",
    "w_global_mem",
    "w_global_cpu",
    "w_global_io",
)


@dataclass(frozen=True)
class OptimalOptions(StrategyOptions):
    """``optimal``'s options (see :func:`propose_optimal`)."""

    method: str = "balance"
    balanciness: int = 3
    w_balance: int | None = None
    w_stickiness: int | None = None
    cpu_threshold: float | None = None
    memory_threshold: float | None = None
    disk_threshold: float | None = None
    usage: str = "used"
    w_cpu_usage: float | None = None
    w_cpu_psi: float | None = None
    w_mem_usage: float | None = None
    w_mem_psi: float | None = None
    w_io_usage: float | None = None
    w_io_psi: float | None = None
    w_global_mem: float | None = None
    w_global_cpu: float | None = None
    w_global_io: float | None = None
    time_limit: float = DEFAULT_TIME_LIMIT
    workers: int = 1
    seed: int = 0
    strict: bool = False
    hint: str | None = None

    def check(self) -> None:
        try:
            weights = _term_weights({k: getattr(self, k) for k in _TERM_WEIGHTS})
        except (TypeError, ValueError):
            bad = next(k for k in _TERM_WEIGHTS if not _is_number(getattr(self, k)))
            raise ValueError(f"{bad}: expected a number ≥ 0, got {getattr(self, bad)!r}") from None
        thresholds = {
            "cpu": self.cpu_threshold,
            "memory": self.memory_threshold,
            "disk": self.disk_threshold,
        }
        _validate(
            self.method,
            self.usage,
            self.balanciness,
            self.w_balance,
            self.w_stickiness,
            self.time_limit,
            self.workers,
            weights,
            thresholds,
            self.seed,
            self.hint,
        )


def _is_number(value: object) -> bool:
    return value is None or (not isinstance(value, bool) and isinstance(value, int | float))


class Optimal:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = STRATEGY
    summary = (
        "Exact placement with CP-SAT: spread, migration cost and soft rules (proxlb-solver's model)"
    )
    Options = OptimalOptions

    def propose(self, view: CycleView, request: Request, options: OptimalOptions) -> Proposal:
        return spread_options(propose_optimal, view.cluster, view, request, options)


STRATEGIES: tuple[Strategy, ...] = (Optimal(),)

__all__ = [
    "BALANCINESS",
    "DEFAULT_WEIGHTS",
    "LOAD_SCALE",
    "METHODS",
    "REPAIR_TIME_LIMIT",
    "SOFT_PENALTY",
    "USAGES",
    "RepairSolution",
    "initial_spread",
    "propose_optimal",
    "solve_repair",
    "thresholds_exceeded",
]
