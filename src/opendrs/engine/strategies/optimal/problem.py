"""``optimal``'s problem, read from the cycle's view: everything the CP-SAT model needs, as
integers — the current placement, the units and where each may go, capacity demand and room in
whole model units, the rules kept, migration costs and the spread terms — and the exact
evaluation of a placement (:meth:`Problem.hard_ok`, :meth:`Problem.score`) the model's answers
are checked against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from opendrs.engine.constraints import Constraints
from opendrs.engine.objective import SOFT_PENALTY
from opendrs.engine.sparse_rows import RowMask
from opendrs.engine.usage import Dimension, DimensionKind, LoadModel
from opendrs.model.cluster import Cluster
from opendrs.model.units import format_bytes

from ..base import migration_cost
from ..cpsat import as_units
from .terms import SpreadTerm, spread_terms
from .units import Messages, UnitBuilder, contradictions, current_nodes

if TYPE_CHECKING:
    from opendrs.model.rules import GuestAffinity


@dataclass(frozen=True)
class Score:
    """The objective of a placement and its parts."""

    objective: int
    spread: int
    cost: int
    penalty: int


@dataclass
class Problem:
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
    dims: tuple[Dimension, ...]
    dem: np.ndarray  # (G, D) int64 capacity demand in model units
    cap: np.ndarray  # (N, D) int64 room in model units (after relaxations)
    units_of_dim: list[float]  # bytes (or cores) per model unit, per dimension
    neg_rules: list[tuple[str, np.ndarray, frozenset[int]]]  # name, members, relaxed nodes
    soft_pos: list[tuple[str, np.ndarray]]
    soft_neg: list[tuple[str, np.ndarray]]
    not_preferred: RowMask  # (G, N) bool: a non-strict node affinity is not met there
    cost: np.ndarray  # (G,) int64 migration cost (0 for guests that cannot move)
    terms: list[SpreadTerm]
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

    def score(self, assign: np.ndarray, w_balance: int, w_stickiness: int) -> Score:
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
        return Score(objective, spread, cost, penalty)


def _fmt_amount(dim: Dimension, value: float) -> str:
    """``30 vCPUs``, ``3.5 cores in use``, ``72.0 GiB of memory``, ``100 GiB of storage local``."""
    if dim.kind.in_cores:
        number = f"{value:g}" if value == int(value) else f"{value:.2f}"
        return f"{number} vCPUs" if dim.kind is DimensionKind.VCPUS else f"{number} cores in use"
    what = {
        DimensionKind.MEMORY: "memory",
        DimensionKind.MEMORY_USED: "memory in use",
        DimensionKind.STORAGE: f"storage {dim.pool}",
    }[dim.kind]
    return f"{format_bytes(value)} of {what}"


def _model_capacity(
    cons: Constraints, cur: np.ndarray, held: np.ndarray, say: Messages
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Each guest's demand (G, D) and node's room (N, D) in whole model units, and the size of
    a unit per dimension; in relaxed mode room is never below what held guests need."""
    cluster, capm = cons.cluster, cons.capacity
    guests, dims = cluster.guests, capm.dimensions
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
        dem[:, d], cap[:, d], per_unit = as_units(raw_dem[:, d], raw_room[:, d], dim)
        per_units.append(per_unit)
    fixed_load = np.zeros_like(cap)
    fidx = np.nonzero(held)[0]
    np.add.at(fixed_load, cur[fidx], dem[fidx])
    over = fixed_load > cap
    for n, d in zip(*np.nonzero(over), strict=True):
        who = [guests[j].label for j in fidx.tolist() if cur[j] == n and dem[j, d] > 0]
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
    say: Messages,
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
            who = ", ".join(cluster.guests[m].label for m in fixed_members.tolist() if cur[m] == n)
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


def build_problem(
    cluster: Cluster,
    cons: Constraints,
    loads: LoadModel,
    method: str,
    usage: str,
    weights: Mapping[str, float],
    strict: bool,
) -> Problem:
    """The model of ``cluster`` under ``cons`` (its hard constraints, the forbidden placements
    refused) with the spread terms of ``method`` on ``loads``."""
    say = Messages(strict)
    dropped_neg = contradictions(cons, say)
    cur, present, why_fixed = current_nodes(cluster, cons.usable, say)
    movable = np.array([w is None for w in why_fixed], dtype=bool) & present
    cut = UnitBuilder(cons, cur, movable, why_fixed, say)
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
    terms = spread_terms(cluster, method, usage, weights, cons.usable, loads)
    return Problem(
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
        dims=cons.capacity.dimensions,
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


def capacity_shortfall(p: Problem) -> list[str]:
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


__all__ = ["Problem", "Score", "build_problem", "capacity_shortfall"]
