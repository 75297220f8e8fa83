"""CP-SAT as opendrs's exact models use it (the ``optimal`` strategy and the exact repair): a
solver whose search repeats, and capacities in whole model units.

**Determinism.** With one worker a solver runs on a fixed seed and a budget counted in CP-SAT's
deterministic time, which does not depend on machine load; the wall-clock limit is a hard cap that
strikes first only on a slow or busy machine (then two runs can differ).

**Whole units.** CP-SAT takes integers. A capacity dimension is counted in units chosen so that
an answer CP-SAT accepts is truly feasible: vCPUs and cores in thousandths, bytes in the largest
unit that divides every size of the dimension; a demand is rounded **up** and a room **down**.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from opendrs.engine.usage import Dimension

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

#: The CPU dimensions of a capacity model (counted in thousandths of a core).
#: Largest number of units a capacity dimension may sum to in the model (keeps CP-SAT exact).
_MAX_UNITS = 2**48
#: Tolerance, in model units, when turning a real value into whole units.
_EPS = 1e-9

#: One core does about 0.25–0.5 units of CP-SAT's deterministic time per wall-clock second
#: (measured on the benchmark clusters): a fifth of the limit normally ends the search first.
DETERMINISTIC_SHARE = 0.2


def new_solver(wall: float, workers: int, seed: int, det: float | None = None) -> cp_model.CpSolver:
    """A CP-SAT solver: ``wall`` seconds at most; with one worker also ``det`` deterministic units
    (default ``wall`` × :data:`DETERMINISTIC_SHARE`), which normally strike first and keep the
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
            wall * DETERMINISTIC_SHARE if det is None else det, 0.001
        )
    return solver


def budget_spent(solver: cp_model.CpSolver, time_limit: float, det: float | None = None) -> bool:
    """Whether ``solver`` (one worker, limited by :func:`new_solver` to ``time_limit``, and
    ``det`` deterministic units where given) used up its deterministic budget: then that budget,
    not the wall clock, ended the search."""
    budget = time_limit * DETERMINISTIC_SHARE if det is None else det
    return solver.deterministic_time >= budget * 0.999


def as_units(
    dem: np.ndarray, room: np.ndarray, dim: Dimension
) -> tuple[np.ndarray, np.ndarray, float]:
    """Demands (G,) and room (N,) of one capacity dimension in whole model units.

    Returns the integer demands (rounded up), the integer room (rounded down) and how many of the
    dimension's units (cores, bytes) one model unit is. CPU dimensions are counted in thousandths;
    byte dimensions in the greatest common divisor of their sizes, coarsened if the sums would be
    too large for exact arithmetic.
    """
    if dim.kind.in_cores:
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


__all__ = ["DETERMINISTIC_SHARE", "as_units", "budget_spent", "new_solver"]
