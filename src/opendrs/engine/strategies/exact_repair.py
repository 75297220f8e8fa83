"""The exact repair: the cheapest placement of some units that keeps every hard constraint, with
CP-SAT — the fallback of ``balance``'s greedy repair (and what ``opendrs plan`` bounds in time).

A small model of its own, on the units the caller hands it (their capacity demand, the nodes each
may end on and what each costs, the pairs kept apart): it knows nothing of the ``optimal``
strategy, whose CP-SAT habits it shares (:mod:`.cpsat`: one worker, a fixed seed, a deterministic
budget, capacities in whole units).

**Repeatable or not used.** The search ends on its deterministic budget (:data:`REPAIR_BUDGET`)
or a proof, which do not depend on machine load. The wall-clock cap (:data:`REPAIR_WALL_CAP`) is a
safety net far above what that budget takes; should it strike first (a very busy machine), what
CP-SAT had then would not repeat, so it is not used: no placement, ``deterministic`` False, and
the caller keeps the greedy repair's answer, which repeats.

**One deadline a plan.** A daemon cycle or a plan may solve many exact repairs (each attempt of a
guarded repair, each proposal a planner retries, the balance pass). Within
:func:`repair_deadline` they share one wall-clock deadline (:data:`REPAIR_SHARED_CAP`): each
solve gets at most what is left of it, and once it is spent (or the ``stop`` given asks) the
rest are skipped — status ``SKIPPED``, ``deterministic`` False, the greedy repair's answer stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from opendrs.engine.distinct import distinct
from opendrs.engine.usage import Dimension

from .cpsat import as_units, budget_spent, new_solver

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

#: Budget of an exact repair in CP-SAT's deterministic time: it ends the search, so that the
#: answer repeats. One core does about 0.25–0.9 units a second (2.3–4.9 s of CPU for these 2 on
#: a 20-node, 700-guest cluster; docs/performance.md).
REPAIR_BUDGET = 2.0
#: Wall-clock cap of an exact repair, seconds: a safety net 30 s per unit of the budget, so that
#: it strikes only on a machine more than about seven times slower than a free core.
REPAIR_WALL_CAP = 30.0 * REPAIR_BUDGET
#: Wall-clock seconds all the exact repairs within one :func:`repair_deadline` (a daemon cycle,
#: a plan) share: together they cannot run longer.
REPAIR_SHARED_CAP = REPAIR_WALL_CAP
#: The status of a solve skipped because the shared deadline was spent (or a stop asked).
SKIPPED = "SKIPPED"

#: The clock of the shared deadline (monotonic seconds; replaced in tests).
clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class _Deadline:
    """The shared deadline: the clock's time it ends at, and a stop request that ends it early."""

    ends: float
    stop: Callable[[], bool]

    def left(self) -> float:
        """Seconds left (0 once a stop is asked)."""
        return 0.0 if self.stop() else max(self.ends - clock(), 0.0)


_deadline: ContextVar[_Deadline | None] = ContextVar("exact_repair_deadline", default=None)


@contextmanager
def repair_deadline(
    seconds: float = REPAIR_SHARED_CAP, stop: Callable[[], bool] = lambda: False
) -> Iterator[None]:
    """Every exact repair solved within shares one deadline ``seconds`` from now, ended early by
    ``stop()``; within another one, the outer deadline holds (this one adds nothing)."""
    if _deadline.get() is not None:
        yield
        return
    token = _deadline.set(_Deadline(clock() + seconds, stop))
    try:
        yield
    finally:
        _deadline.reset(token)


def _wall_left(wall: float) -> float:
    """The wall-clock cap of the next solve: ``wall``, at most what the shared deadline leaves."""
    shared = _deadline.get()
    return wall if shared is None else min(wall, shared.left())


@dataclass(frozen=True)
class RepairSolution:
    """What the exact repair model found: the node of each unit, or None without a solution.

    ``status`` is CP-SAT's (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN); ``deterministic`` says that
    the deterministic budget or a proof, not the wall clock, ended the search (the answer
    repeats). Where the wall clock did (``wall_cut``: a FEASIBLE or UNKNOWN search that ran to its
    cap), ``choice`` is None whatever CP-SAT had found. ``status`` ``SKIPPED``: the shared deadline
    was spent, no search ran.
    """

    status: str
    choice: np.ndarray | None
    deterministic: bool
    wall_cut: bool = False


def solve_repair(
    need: np.ndarray,
    room: np.ndarray,
    dims: tuple[Dimension, ...],
    domain: list[np.ndarray],
    cost: list[np.ndarray],
    apart: list[tuple[int, int]],
    *,
    budget: float = REPAIR_BUDGET,
    wall: float = REPAIR_WALL_CAP,
    seed: int = 0,
) -> RepairSolution:
    """The cheapest placement of some units that keeps every hard constraint, with CP-SAT.

    ``need`` (U, D) is each unit's capacity demand, ``room`` (N, D) what the guests left out of
    the model leave free on each node (negative where they alone are over a limit); ``domain[u]``
    the nodes unit ``u`` may end on and ``cost[u]`` the migration cost of each of them (0 where
    it is now); ``apart`` pairs of units that may not share a node. One worker, a fixed seed and
    ``budget`` units of deterministic time: the same input gives the same answer — or, where the
    ``wall`` seconds cap (at most what the shared deadline leaves) strikes first, no answer;
    none either, status ``SKIPPED``, once that deadline is spent (see the module's
    documentation).
    """
    from ortools.sat.python import cp_model  # imported when solving: it is large

    if _repair_short(need, room, domain):
        return RepairSolution("INFEASIBLE", None, True)
    wall = _wall_left(wall)
    if wall <= 0:
        return RepairSolution(SKIPPED, None, False)
    m = cp_model.CpModel()
    y = _placement_vars(m, domain)
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
    solver = new_solver(wall, 1, seed, budget)
    status = solver.solve(m)
    deterministic = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or budget_spent(
        solver, wall, budget
    )
    if not deterministic or status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # Only a search that ran to its cap was cut by the wall clock (not MODEL_INVALID).
        cut = status in (cp_model.FEASIBLE, cp_model.UNKNOWN) and solver.wall_time >= wall * 0.99
        return RepairSolution(solver.status_name(status), None, deterministic, cut)
    choice = np.array(
        [next(n for n, var in row.items() if solver.boolean_value(var)) for row in y],
        dtype=np.intp,
    )
    return RepairSolution(solver.status_name(status), choice, deterministic)


def _placement_vars(m: cp_model.CpModel, domain: list[np.ndarray]) -> list[dict[int, Any]]:
    """One Boolean per unit and node of its ``domain``, exactly one true per unit."""
    y: list[dict[int, Any]] = []
    for u, dom in enumerate(domain):
        row = {int(n): m.new_bool_var(f"y{u}_{n}") for n in dom.tolist()}
        m.add_exactly_one(row.values())
        y.append(row)
    return y


def _repair_short(need: np.ndarray, room: np.ndarray, domain: list[np.ndarray]) -> bool:
    """Whether the units need more, in some dimension, than all their nodes have together (a
    proof of infeasibility CP-SAT may take long to find)."""
    if not domain:
        return False
    nodes = distinct(np.concatenate(domain))
    have = np.maximum(room[nodes], 0.0).sum(axis=0)
    return bool(np.any(need.sum(axis=0) > have * (1 + 1e-9) + 1e-9))


def _repair_capacity(
    m: cp_model.CpModel,
    y: list[dict[int, Any]],
    need: np.ndarray,
    room: np.ndarray,
    dims: tuple[Dimension, ...],
) -> None:
    """Capacity of every node and dimension, in whole model units (see :func:`.cpsat.as_units`)."""
    from ortools.sat.python import cp_model  # imported when solving: it is large

    on_node: dict[int, list[int]] = {}
    for u, row in enumerate(y):
        for n in row:
            on_node.setdefault(n, []).append(u)
    for d, dim in enumerate(dims):
        dem, cap, _per_unit = as_units(need[:, d], room[:, d], dim)
        for n, here in sorted(on_node.items()):
            terms = [(y[u][n], int(dem[u])) for u in here if dem[u] > 0]
            if sum(c for _, c in terms) > int(cap[n]):
                m.add(
                    cp_model.LinearExpr.weighted_sum([v for v, _ in terms], [c for _, c in terms])
                    <= int(cap[n])
                )


__all__ = [
    "REPAIR_BUDGET",
    "REPAIR_SHARED_CAP",
    "REPAIR_WALL_CAP",
    "SKIPPED",
    "RepairSolution",
    "repair_deadline",
    "solve_repair",
]
