"""The exact repair is repeatable or not used: a search the wall clock cut before its
deterministic budget gives no placement (the greedy repair's answer stands) and says so, and a
plan whose searches were not all repeatable never says ``deterministic: True``.

A cut is made without timing anything: the solver is the real one, run to its end, which then
reports what a wall-clock cut looks like — a first solution (FEASIBLE) and less deterministic
time spent than the budget.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from opendrs.engine.constraints import Constraints
from opendrs.engine.planner import Plan, PlannedMove, plan_with_retries
from opendrs.engine.policy import PolicyConfig, repair
from opendrs.engine.policy.repair import Repair, repair_within_guards, repairs_needed
from opendrs.engine.strategies import exact_repair as exact_module
from opendrs.engine.strategies.balance.options import BalanceOptions
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.strategies.base import Proposal, ProposedMove, cluster_imbalance
from opendrs.engine.strategies.exact_repair import (
    REPAIR_BUDGET,
    REPAIR_WALL_CAP,
    SKIPPED,
    repair_deadline,
    solve_repair,
)
from opendrs.engine.usage import Dimension, DimensionKind
from repairs import cluster

VCPUS = Dimension(DimensionKind.VCPUS)


class _CutSolver:
    """A real CP-SAT solver that, once its search is over, reports a wall-clock cut: FEASIBLE,
    with a tenth of the deterministic budget spent and its wall-clock cap reached."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.parameters = real.parameters

    def solve(self, model: Any) -> Any:
        from ortools.sat.python import cp_model

        self._real.solve(model)
        return cp_model.FEASIBLE

    @property
    def deterministic_time(self) -> float:
        return 0.1 * self.parameters.max_deterministic_time

    @property
    def wall_time(self) -> float:  # the search ran to its cap
        return float(self.parameters.max_time_in_seconds)

    def status_name(self, status: Any) -> str:
        return str(self._real.status_name(status))

    def boolean_value(self, var: Any) -> bool:
        return bool(self._real.boolean_value(var))


@pytest.fixture
def wall_clock_cuts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """Every exact repair search is cut by the wall clock; the (wall cap, budget) each got."""
    real_new_solver = exact_module.new_solver
    asked: list[tuple[float, float]] = []

    def cut_solver(wall: float, workers: int, seed: int, det: float | None = None) -> Any:
        asked.append((wall, det if det is not None else -1.0))
        return _CutSolver(real_new_solver(wall, workers, seed, det))

    monkeypatch.setattr(exact_module, "new_solver", cut_solver)
    return asked


class _InvalidSolver(_CutSolver):
    """A solver that finds the model invalid at once (a bug): MODEL_INVALID, no time spent."""

    def solve(self, model: Any) -> Any:
        from ortools.sat.python import cp_model

        return cp_model.MODEL_INVALID

    @property
    def deterministic_time(self) -> float:
        return 0.0

    @property
    def wall_time(self) -> float:
        return 0.0


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The wall-clock cap each exact repair search got (real solvers)."""
    real_new_solver = exact_module.new_solver
    asked: list[float] = []

    def recorded(wall: float, workers: int, seed: int, det: float | None = None) -> Any:
        asked.append(wall)
        return real_new_solver(wall, workers, seed, det)

    monkeypatch.setattr(exact_module, "new_solver", recorded)
    return asked


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The shared deadline's clock, set by the test (``now[0]`` seconds)."""
    at = [1000.0]
    monkeypatch.setattr(exact_module, "clock", lambda: at[0])
    return at


def _two_units() -> tuple[Any, ...]:
    need = np.array([[2.0], [2.0]])
    room = np.array([[4.0], [4.0]])
    domain = [np.array([0, 1]), np.array([0, 1])]
    return need, room, (VCPUS,), domain, [np.array([0, 5]), np.array([3, 1])], []


def test_the_solves_of_a_plan_share_one_deadline_then_are_skipped(
    solves: list[float], now: list[float]
) -> None:
    with repair_deadline(10.0):
        first = solve_repair(*_two_units())
        now[0] += 4.0
        with repair_deadline(100.0):  # within the plan's: adds nothing
            second = solve_repair(*_two_units())
        now[0] += 6.0
        third = solve_repair(*_two_units())
    assert solves == [10.0, 6.0]  # each got what was left; the third did not run
    assert first.deterministic and second.deterministic and first.choice is not None
    assert third.status == SKIPPED and third.choice is None and not third.deterministic
    assert solve_repair(*_two_units()).choice is not None  # outside: its own cap
    assert solves[-1] == REPAIR_WALL_CAP


def test_a_stop_asked_skips_the_solves_left(solves: list[float]) -> None:
    asked = [False]
    with repair_deadline(stop=lambda: asked[0]):
        assert solve_repair(*_two_units()).status == "OPTIMAL"
        asked[0] = True
        assert solve_repair(*_two_units()).status == SKIPPED
    assert len(solves) == 1


def test_a_repair_past_the_deadline_keeps_the_greedy_answer_and_says_so(
    solves: list[float], now: list[float]
) -> None:
    with repair_deadline(5.0):
        now[0] += 5.0
        proposal = propose_balance(cluster("maintenance"), BalanceOptions(target_spread=1e6))
        fixed = repair(cluster("maintenance"))
    assert solves == []
    info = proposal.options["repair"]
    assert info["deterministic"] is False and info["cut"] == "deadline"
    assert proposal.moves == ()  # the greedy repair's answer stands
    note = next(n for n in proposal.notes if n.startswith("exact repair"))
    assert note.count("skipped") == 1 and "wall-clock cap" not in note
    assert [g for g, _ in fixed.stuck] == ["1"]
    assert "the exact repair was skipped" in fixed.stuck[0][1]


def test_a_malformed_model_is_not_called_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    real_new_solver = exact_module.new_solver

    def invalid(wall: float, workers: int, seed: int, det: float | None = None) -> Any:
        return _InvalidSolver(real_new_solver(wall, workers, seed, det))

    monkeypatch.setattr(exact_module, "new_solver", invalid)
    found = solve_repair(*_two_units())
    assert found.status == "MODEL_INVALID" and not found.wall_cut and found.choice is None
    proposal = propose_balance(cluster("maintenance"), BalanceOptions(target_spread=1e6))
    info = proposal.options["repair"]
    assert info["exact"] == "MODEL_INVALID" and "cut" not in info
    assert info["deterministic"] is False
    note = next(n for n in proposal.notes if n.startswith("exact repair"))
    assert "busy machine" not in note
    fixed = repair(cluster("maintenance"))
    assert fixed.stuck[0][1].endswith(" — the exact repair found none within its search budget")


def test_a_search_the_wall_clock_cut_gives_no_placement(
    wall_clock_cuts: list[tuple[float, float]],
) -> None:
    need = np.array([[2.0], [2.0]])
    room = np.array([[4.0], [4.0]])
    domain = [np.array([0, 1]), np.array([0, 1])]
    found = solve_repair(need, room, (VCPUS,), domain, [np.array([0, 5]), np.array([3, 1])], [])
    assert wall_clock_cuts == [(REPAIR_WALL_CAP, REPAIR_BUDGET)]
    assert found.status == "FEASIBLE" and not found.deterministic and found.wall_cut
    assert found.choice is None  # what CP-SAT had then would not repeat


def test_a_repair_the_wall_clock_cut_keeps_the_greedy_answer_and_says_so(
    wall_clock_cuts: list[tuple[float, float]],
) -> None:
    proposal = propose_balance(cluster("maintenance"), BalanceOptions(target_spread=1e6))
    info = proposal.options["repair"]
    assert info["deterministic"] is False and info["cut"] == "wall clock"
    assert proposal.moves == ()  # the greedy repair places nothing here
    assert len(wall_clock_cuts) == 1  # no second, whole model after a cut
    note = next(n for n in proposal.notes if n.startswith("exact repair"))
    assert f"stopped by its wall-clock cap (at most {REPAIR_WALL_CAP:g} s)" in note
    fixed = repair(cluster("maintenance"))
    assert [g for g, _ in fixed.stuck] == ["1"]
    assert fixed.stuck[0][1].endswith(
        f" — the exact repair ran past its wall-clock cap (at most {REPAIR_WALL_CAP:g} s; a busy"
        " machine) and is not used, as it would not repeat"
    )


def test_a_repair_on_its_budget_says_it_repeats() -> None:
    proposal = propose_balance(cluster("maintenance"), BalanceOptions(target_spread=1e6))
    info = proposal.options["repair"]
    assert info["deterministic"] is True and "cut" not in info
    assert sorted((m.guest, m.target) for m in proposal.moves) == [("1", "t"), ("2", "s")]


def test_a_plan_is_repeatable_only_if_every_proposal_of_it_was() -> None:
    """The first proposal's search was cut and its placement unreachable; the second, made
    with that placement forbidden, ended on its budget: the plan is not repeatable (a quiet
    machine forbids other placements and gets another plan)."""
    swap = cluster("swap")
    same = cluster_imbalance(swap)
    asked: list[frozenset[tuple[str, str]]] = []

    def propose(forbidden: frozenset[tuple[str, str]]) -> Proposal:
        asked.append(forbidden)
        # 1 (6 GiB) onto b, full with 2 and 4: a target no order reaches.
        moves = () if forbidden else (ProposedMove("1", "a", "b", "m", 0.0, 0.0, 1),)
        repeatable = bool(forbidden)
        search = {"exact": "FEASIBLE", "deterministic": repeatable}
        return Proposal("test", moves, same, same, "done", options={"repair": search})

    proposal, plan = plan_with_retries(swap, propose)
    assert asked == [frozenset(), frozenset({("1", "b")})] and plan.feasible
    assert proposal.options["repair"] == {"exact": "FEASIBLE", "deterministic": False}


def test_the_daemon_s_repair_is_repeatable_only_if_both_its_attempts_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within the guards the repair leaves 1 stuck; kept off the failed targets only, its search
    was cut and leaves more: the first is chosen, but a quiet machine might choose the second."""
    maintenance = cluster("maintenance")
    cons = Constraints.build(maintenance)
    same = cluster_imbalance(maintenance)
    needed = repairs_needed(maintenance, cons)

    def made(repeatable: bool, stuck: int) -> Repair:
        search = {"exact": "FEASIBLE", "deterministic": repeatable}
        proposal = Proposal("repair", (), same, same, "done", options={"repair": search})
        return Repair(needed, proposal, None, tuple((str(k), "stuck") for k in range(stuck)))

    def kept_off(*args: Any) -> Repair:
        forbidden = args[-1]
        return made(True, 1) if forbidden else made(False, 2)

    # The module, not the package's function of the same name.
    repair_module = importlib.import_module("opendrs.engine.policy.repair")
    monkeypatch.setattr(repair_module, "repair_kept_off", kept_off)
    guarded = frozenset({("1", "t")})
    chosen, kept = repair_within_guards(maintenance, cons, PolicyConfig(), guarded, frozenset())
    assert kept == guarded and len(chosen.stuck) == 1
    assert chosen.proposal is not None
    assert chosen.proposal.options["repair"] == {"exact": "FEASIBLE", "deterministic": False}


def test_the_daemon_s_repair_is_not_repeatable_if_its_return_kept_off_was_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept off the failed targets only, the repair sends 1 back to t, a node it left; kept off
    that return too, its search was cut and leaves more stuck: the return is chosen, but a quiet
    machine might have found the other way — so the repair chosen says it is not repeatable."""
    maintenance = cluster("maintenance")
    cons = Constraints.build(maintenance)
    same = cluster_imbalance(maintenance)
    needed = repairs_needed(maintenance, cons)
    back = frozenset({("1", "t")})
    guarded = back | {("1", "x")}

    def made(repeatable: bool, stuck: int, moves: tuple[PlannedMove, ...] = ()) -> Repair:
        search = {"exact": "FEASIBLE", "deterministic": repeatable}
        proposal = Proposal("repair", (), same, same, "done", options={"repair": search})
        stuck_ids = tuple((str(k), "stuck") for k in range(stuck))
        return Repair(needed, proposal, Plan(moves, True), stuck_ids)

    def kept_off(*args: Any) -> Repair:
        forbidden = args[-1]
        if forbidden == guarded:
            return made(True, 2)
        if forbidden == back:
            return made(False, 3)
        return made(True, 1, (PlannedMove("1", "m", "t", 1),))

    repair_module = importlib.import_module("opendrs.engine.policy.repair")
    monkeypatch.setattr(repair_module, "repair_kept_off", kept_off)
    chosen, kept = repair_within_guards(
        maintenance, cons, PolicyConfig(), guarded, frozenset(), back
    )
    assert kept == frozenset() and len(chosen.stuck) == 1
    assert chosen.plan is not None and chosen.plan.moves[0].target == "t"
    assert chosen.proposal is not None
    assert chosen.proposal.options["repair"] == {"exact": "FEASIBLE", "deterministic": False}


def test_returns_are_kept_off_for_a_few_rounds_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each plan with a return kept off sends another guest back, as stuck as before: the
    rounds stop at RETURN_ROUNDS; a return proposed again although kept off ends them at once."""
    maintenance = cluster("maintenance")
    cons = Constraints.build(maintenance)
    same = cluster_imbalance(maintenance)
    needed = repairs_needed(maintenance, cons)
    back = frozenset((str(k), "t") for k in range(10))
    calls: list[frozenset[tuple[str, str]]] = []
    again = [False]

    def kept_off(*args: Any) -> Repair:
        forbidden = args[-1]
        calls.append(forbidden)
        proposal = Proposal("repair", (), same, same, "done", options={})
        if forbidden == frozenset({("x", "y")}):  # the guarded attempt
            return Repair(needed, proposal, Plan((), True), (("a", "s"), ("b", "s")))
        guest = "0" if again[0] else str(len(forbidden & back))
        move = PlannedMove(guest, "m", "t", 1)
        return Repair(needed, proposal, Plan((move,), True), (("a", "s"),))

    repair_module = importlib.import_module("opendrs.engine.policy.repair")
    monkeypatch.setattr(repair_module, "repair_kept_off", kept_off)
    guarded = frozenset({("x", "y")})
    args = (maintenance, cons, PolicyConfig(), guarded, frozenset(), back)
    repair_within_guards(*args)
    assert len(calls) == 2 + repair_module.RETURN_ROUNDS
    calls.clear()
    again[0] = True
    _chosen, kept = repair_within_guards(*args)
    assert len(calls) == 3 and kept == frozenset({("0", "t")})
