"""How ``optimal`` reports its answer: the proposal (its moves, each with why it moves, its notes
and ``options["solver"]``, the solver's report), whichever way the search ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from opendrs.engine.imbalance import Imbalance
from opendrs.engine.objective import LOAD_SCALE
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import Cluster

from ..base import Proposal, ProposedMove, Stop, cluster_imbalance, migration_cost
from .problem import Problem, Score
from .units import phrase, rejection

_MAX_EXPLAIN = 8

STRATEGY = "optimal"


def spread_text(p: Problem, before: int, after: int) -> str:
    """``spread 40.0% -> 5.0%`` (a weighted sum of spreads is shown as a plain number)."""
    if p.percent:
        return f"spread {before / LOAD_SCALE:.1%} -> {after / LOAD_SCALE:.1%}"
    return f"weighted spread {before / LOAD_SCALE:.3f} -> {after / LOAD_SCALE:.3f}"


def _move_reason(p: Problem, g: int, current_ok_nodes: set[int]) -> str:
    """Why guest ``g`` moves: the hard rule its current node breaks, or balance."""
    cluster, cons = p.cluster, p.cons
    n = int(p.cur[g])
    node = cluster.nodes[n]
    if not node.online:
        return f"leaves {node.name}: offline"
    if node.maintenance:
        return f"leaves {node.name}: maintenance"
    refused = rejection(cons, g, n)
    if refused is not None:
        return f"leaves {node.name}: {phrase(refused)}"
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


@dataclass
class Outcome:
    """How :func:`propose_optimal` reports its answer, whichever way it ends: the proposal's
    options (``solver`` the solver's report, filled in as the search goes) and notes."""

    cluster: Cluster
    loads: LoadModel
    before: Imbalance
    options: dict[str, Any]
    notes: list[str]
    workers: int
    seed: int

    @property
    def solver(self) -> dict[str, Any]:
        solver: dict[str, Any] = self.options["solver"]
        return solver

    def finish(
        self,
        moves: tuple[ProposedMove, ...],
        after_assign: np.ndarray | None,
        stopped: str,
        stop: Stop,
    ) -> Proposal:
        """The proposal: ``moves`` to ``after_assign`` (None: nothing found), why it stopped (a
        sentence and a :class:`~..base.Stop`)."""
        info = self.solver
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
        summary += f"; {self.workers} worker{plural}, seed {self.seed}"
        notes = (*self.notes, summary)
        return Proposal(STRATEGY, moves, self.before, after, stopped, notes, self.options, stop)

    def infeasible(self, reasons: list[str]) -> Proposal:
        """The proposal when no placement keeps the hard constraints, for these ``reasons``."""
        self.solver["status"] = "INFEASIBLE"
        shown = reasons[:_MAX_EXPLAIN] + (
            [f"{len(reasons) - _MAX_EXPLAIN} more"] if len(reasons) > _MAX_EXPLAIN else []
        )
        self.solver["reasons"] = reasons
        said = "; ".join(shown)
        return self.finish(
            (),
            None,
            "infeasible: no placement satisfies the hard constraints: " + said,
            Stop("infeasible", {"reasons": said}),
        )


def solver_report(p: Problem, wb: int, ws: int, start_spread: float) -> dict[str, Any]:
    """The solver's report before the search (``Proposal.options["solver"]``)."""
    return {
        "status": "UNKNOWN",
        "feasible": False,
        "objective": None,
        "bound": None,
        "gap": None,
        "w_balance": wb,
        "w_stickiness": ws,
        "initial_spread": start_spread,
        "guests": int(p.present.sum()),
        "units": len(p.units),
        "nodes": len(p.cluster.nodes),
    }


def record_answer(
    info: dict[str, Any],
    final: Score,
    current: Score,
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


def proposed_moves(
    p: Problem, final: np.ndarray, scores: tuple[Score, Score], wb: int
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
                parts.append(spread_text(p, cur_score.spread, final_score.spread))
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


__all__ = [
    "STRATEGY",
    "Outcome",
    "proposed_moves",
    "record_answer",
    "solver_report",
    "spread_text",
]
