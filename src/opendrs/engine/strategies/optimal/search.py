"""``optimal``'s search: CP-SAT from a warm start, never worse than the two reference
placements (the current one and the warm start's), the tie between equal placements broken in a
second pass once the first is proven optimal."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from opendrs.engine.view import CycleView

from ..base import Proposal, ProposedMove, Request, Stop
from ..cpsat import DETERMINISTIC_SHARE, budget_spent, new_solver
from .answer import STRATEGY, Outcome, proposed_moves, record_answer, spread_text
from .explain import explain
from .model import Model
from .problem import Problem, Score

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


def _hint_assign(
    view: CycleView, forbidden: frozenset[tuple[str, str]], hint: str | None, notes: list[str]
) -> tuple[np.ndarray, str]:
    """The warm start: the default (or named) strategy's placement on ``view``, else the current
    one."""
    # Imported here: the registry lists this strategy.
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


@dataclass(frozen=True)
class References:
    """The two placements the answer is never worse than (when they are feasible): the
    current one and the warm start's (``hint``, None when infeasible)."""

    cur: np.ndarray
    cur_ok: bool
    cur_score: Score
    hint: np.ndarray
    hint_score: Score | None

    @classmethod
    def build(
        cls,
        p: Problem,
        warm: CycleView,
        forbidden: frozenset[tuple[str, str]],
        hint: str | None,
        out: Outcome,
        weights: tuple[int, int],
    ) -> References:
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
class Budget:
    """The search's limits: wall-clock seconds, CP-SAT workers and seed."""

    time_limit: float
    workers: int
    seed: int


def _first_pass(
    model: Model, budget: Budget, info: dict[str, Any]
) -> tuple[cp_model.CpSolver, int]:
    """Solve ``model`` for the objective: the solver and its status (its figures go to the
    report ``info``)."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    solver = new_solver(budget.time_limit, budget.workers, budget.seed)
    status = solver.solve(model.model)
    info["deterministic_time"] = round(solver.deterministic_time, 6)
    # Repeatable unless the wall-clock cap, not the deterministic budget, ended the search.
    info["deterministic"] = budget.workers == 1 and (
        status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or budget_spent(solver, budget.time_limit)
    )
    return solver, status


def _solver_candidate(
    p: Problem, model: Model, solver: cp_model.CpSolver, status: int, weights: tuple[int, int]
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
    p: Problem,
    model: Model,
    first: cp_model.CpSolver,
    best: tuple[int, np.ndarray],
    budget: Budget,
    weights: tuple[int, int],
) -> tuple[np.ndarray, str]:
    """Second pass, in the time the ``first`` left: among placements as good as ``best``
    (objective, placement), the least migration effort and exposure; the placement and
    CP-SAT's status."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    best_obj, final = best
    limit = budget.time_limit
    det_left = max(limit * DETERMINISTIC_SHARE - first.deterministic_time, 0.03 * limit)
    wall_left = max(limit - first.wall_time, 0.1 * limit)
    model.model.add(model.objective <= best_obj)
    model.model.minimize(model.tie_break())
    model.hint(final)
    solver = new_solver(wall_left, budget.workers, budget.seed, det_left)
    status = solver.solve(model.model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        assign = model.read(solver)
        if p.score(assign, *weights).objective == best_obj:
            final = assign
    return final, solver.status_name(status)


def _stopped(
    p: Problem,
    moves: tuple[ProposedMove, ...],
    refs: References,
    final_score: Score,
    wb: int,
    proven: bool,
    balance_note: tuple[str, Stop] | None,
    bound: int | None,
) -> tuple[str, Stop]:
    """Why the search stopped and what it found (a sentence and a :class:`~..base.Stop`)."""
    cur_score = refs.cur_score
    quality = "optimal" if proven else "best found in the time limit"
    figures: dict[str, float | str] = {"proven": int(proven)}
    if not proven and bound is not None:
        figures["bound"] = bound
    if moves:
        stopped = (
            f"{quality}: {len(moves)} migration{'s' if len(moves) != 1 else ''}, objective "
            f"{cur_score.objective} -> {final_score.objective}"
            + (f", {spread_text(p, cur_score.spread, final_score.spread)}" if wb else "")
        )
        figures |= {"migrations": len(moves), "objective_before": cur_score.objective}
        stop = Stop("solved", figures | {"objective_after": final_score.objective})
    elif balance_note and refs.cur_ok:
        stopped = balance_note[0] + "; the current placement keeps every hard constraint"
        stop = balance_note[1]
    else:
        stopped = f"{quality}: the current placement is best (objective {final_score.objective})"
        stop = Stop("current_best", figures | {"objective": final_score.objective})
    if not proven and bound is not None:
        stopped += f"; bound {bound}"
    return stopped, stop


def search(
    p: Problem,
    refs: References,
    out: Outcome,
    budget: Budget,
    weights: tuple[int, int],
    balance_note: tuple[str, Stop] | None,
) -> Proposal:
    """Solve ``p`` with CP-SAT from ``refs``'s start; the best of its answer and ``refs``, the
    tie broken when it is proven optimal, as a proposal."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    model = Model(p, *weights)
    model.hint(refs.start())
    solver, status = _first_pass(model, budget, out.solver)
    if status == cp_model.INFEASIBLE:
        reasons = explain(p, budget.time_limit) or ["CP-SAT proved that no placement exists"]
        return out.infeasible(reasons)
    if status == cp_model.MODEL_INVALID:  # a bug, not an input problem
        raise RuntimeError(f"optimal: CP-SAT rejected the model: {model.model.validate()}")
    candidates, bound = _solver_candidate(p, model, solver, status, weights)
    candidates += refs.candidates()
    if not candidates:
        out.solver["status"] = solver.status_name(status)
        return out.finish(
            (),
            None,
            f"no feasible placement found within the time limit ({budget.time_limit:g} s)",
            Stop("no_feasible_placement", {"time_limit": budget.time_limit}),
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
    record_answer(out.solver, final_score, refs.cur_score, bound, proven, source)
    moves = proposed_moves(p, final, (refs.cur_score, final_score), weights[0])
    bound = out.solver["bound"]
    stopped, stop = _stopped(p, moves, refs, final_score, weights[0], proven, balance_note, bound)
    return out.finish(moves, final, stopped, stop)


__all__ = ["Budget", "References", "search"]
