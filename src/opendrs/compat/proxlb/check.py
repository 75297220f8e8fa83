"""Checking scenarios: run a strategy on each, evaluate its ``expect``, report JUnit XML.

:func:`check_scenario` runs a strategy (``optimal`` by default, with the scenario's balancing
options and ``strict=True`` — proxlb-solver's semantics for contradictory rules) through
:func:`~opendrs.engine.planner.plan_with_retries`, then evaluates ``expect``
(:func:`~.expect.evaluate_expect`); :func:`check_paths` does so for every scenario file under some
paths, and :func:`junit_xml` reports the results.
"""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opendrs.engine.planner import Plan, plan_with_retries
from opendrs.model.snapshot import SnapshotError

from .expect import Check, evaluate_expect
from .loader import load_scenario
from .scenario import Scenario

if TYPE_CHECKING:
    from opendrs.engine.strategies.base import StrategyInfo
    from opendrs.model.cluster import Cluster

__all__ = [
    "DEFAULT_CHECK_TIME_LIMIT",
    "ScenarioResult",
    "check_paths",
    "check_scenario",
    "junit_xml",
    "scenario_files",
]

#: CP-SAT budget per scenario when checking (they are tiny: a few milliseconds each).
DEFAULT_CHECK_TIME_LIMIT = 5.0


@dataclass(frozen=True)
class ScenarioResult:
    """The outcome of checking one scenario."""

    name: str
    path: str
    passed: bool
    checks: tuple[Check, ...]
    duration: float
    solver: Mapping[str, Any] = field(default_factory=dict)
    placements: Mapping[str, str] = field(default_factory=dict)
    migrations: int = 0
    stopped: str = ""
    plan: Plan | None = None

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": self.path,
            "passed": self.passed,
            "duration": self.duration,
            "checks": [c._asdict() for c in self.checks],
            "migrations": self.migrations,
            "placements": dict(self.placements),
            "stopped": self.stopped,
            "solver": dict(self.solver),
            "plan": self.plan.as_dict() if self.plan is not None else None,
        }


def _feasible(proposal: Any) -> bool:
    """Whether a proposal found a placement (``optimal`` says so in its solver report)."""
    solver = proposal.options.get("solver")
    return bool(solver.get("feasible", True)) if isinstance(solver, Mapping) else True


def check_scenario(
    scenario: Scenario,
    *,
    strategy: str = "optimal",
    time_limit: float = DEFAULT_CHECK_TIME_LIMIT,
    max_retries: int = 5,
) -> ScenarioResult:
    """Run ``strategy`` on the scenario (planning its moves), then evaluate its ``expect``.

    ``optimal`` gets the scenario's balancing options, ``strict=True`` and ``time_limit``; other
    strategies run with their defaults (and ``time_limit`` when they take one; ``scope: all``
    for those that move only HA resources by default, which a scenario has none of) on the cluster,
    whose settings carry the balancing method (:func:`~.metric.balance_metric`). A proposal whose
    moves cannot be ordered safely is re-proposed with those placements forbidden
    (:func:`~opendrs.engine.planner.plan_with_retries`); once a re-proposal is infeasible, the last
    feasible one stands, with its unreachable plan (proxlb-solver's ``solve_reachable``).
    """
    # Imported here: the strategies (``optimal``) import this package's objective terms.
    from opendrs.engine.policy import strategy_problem
    from opendrs.engine.strategies import get_strategy
    from opendrs.engine.strategies.optimal import STRATEGY as OPTIMAL

    started = time.perf_counter()
    info = get_strategy(strategy)
    kwargs = dict(scenario.options) if info.name == OPTIMAL else {}
    if "time_limit" in info.options.names():
        kwargs["time_limit"] = time_limit
    if "scope" in info.options.names():
        kwargs["scope"] = "all"  # a scenario has no HA resources: every guest is in scope
    refused = strategy_problem(info.name, kwargs) if kwargs else None
    if refused is not None:  # the scenario's options, not a bug: a failed check of this file
        check = Check("options", f"options {info.name} takes", False, refused[1])
        return ScenarioResult(
            scenario.name, scenario.path, False, (check,), time.perf_counter() - started
        )
    propose = _Proposer(info, scenario.cluster, kwargs)
    proposal, plan = plan_with_retries(scenario.cluster, propose, max_retries=max_retries)
    return _result(scenario, proposal, plan, propose.calls, started)


class _Proposer:
    """Proposes with a strategy as proxlb-solver's ``solve_reachable`` does: once a re-proposal
    (with the unreachable placements forbidden) is infeasible, the last feasible proposal
    stands, unreachable. ``calls`` counts the proposals asked for."""

    def __init__(self, info: StrategyInfo, cluster: Cluster, options: Mapping[str, Any]) -> None:
        self.info = info
        self.cluster = cluster
        self.options = options
        self.calls = 0
        self.last_feasible: Any = None

    def __call__(self, forbidden: frozenset[tuple[str, str]]) -> Any:
        from opendrs.engine.strategies.base import Request

        self.calls += 1
        proposal = self.info.propose(self.cluster, Request(forbidden=forbidden), self.options)
        if _feasible(proposal):
            self.last_feasible = proposal
        elif self.last_feasible is not None:
            return self.last_feasible
        return proposal


def _result(
    scenario: Scenario, proposal: Any, plan: Plan, calls: int, started: float
) -> ScenarioResult:
    """The outcome of the scenario's check: ``proposal`` and its ``plan`` (after ``calls``
    proposals, the check ``started`` then) against its expectations."""
    solver = dict(proposal.options.get("solver") or {})
    feasible = _feasible(proposal)
    status = str(solver.get("status", "FEASIBLE"))
    placements = scenario.initial_placements
    for move in proposal.net_moves():
        placements[move.guest] = move.target
    unreachable = ", ".join(f"{g} → {n}" for g, n in plan.unreachable)
    checks = evaluate_expect(
        scenario,
        feasible=feasible,
        status=status if feasible else f"{status}: {proposal.stopped}",
        placements=placements,
        path_feasible=plan.feasible,
        unreachable=unreachable,
    )
    initial = scenario.initial_placements
    solver.update(
        proposals=calls,
        plan_feasible=plan.feasible,
        plan_steps=plan.steps,
        parking=sum(1 for m in plan.moves if m.parking),
    )
    return ScenarioResult(
        name=scenario.name,
        path=scenario.path,
        passed=all(c.passed for c in checks),
        checks=tuple(checks),
        duration=time.perf_counter() - started,
        solver=solver,
        placements=placements,
        migrations=sum(1 for vm, node in placements.items() if initial[vm] != node),
        stopped=proposal.stopped,
        plan=plan,
    )


def scenario_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Scenario files under ``paths``: files as given, directories searched for ``*.yaml``.

    ``*.yaml.disabled`` files are skipped (proxlb-solver's convention); the result is sorted.
    """
    found: set[Path] = set()
    for entry in paths:
        path = Path(entry)
        if path.is_dir():
            found.update(p for p in path.rglob("*.yaml") if p.is_file())
        else:
            found.add(path)
    return sorted(found)


def check_paths(
    paths: Iterable[str | os.PathLike[str]],
    *,
    strategy: str = "optimal",
    time_limit: float = DEFAULT_CHECK_TIME_LIMIT,
) -> list[ScenarioResult]:
    """Check every scenario under ``paths``; a file that cannot be loaded is a failed result."""
    results = []
    for path in scenario_files(paths):
        started = time.perf_counter()
        try:
            scenario = load_scenario(path)
        except SnapshotError as exc:
            check = Check("load", "a valid scenario", False, str(exc))
            results.append(
                ScenarioResult(path.stem, str(path), False, (check,), time.perf_counter() - started)
            )
            continue
        results.append(check_scenario(scenario, strategy=strategy, time_limit=time_limit))
    return results


def junit_xml(results: Sequence[ScenarioResult], *, suite: str = "proxlb-scenarios") -> str:
    """JUnit XML: one ``testcase`` per scenario, a ``failure`` listing its failing checks."""
    failures = sum(1 for r in results if not r.passed)
    total_time = sum(r.duration for r in results)
    root = ET.Element(
        "testsuites", tests=str(len(results)), failures=str(failures), time=f"{total_time:.3f}"
    )
    node = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(failures),
        errors="0",
        time=f"{total_time:.3f}",
    )
    for result in results:
        parent = Path(result.path).parent.name
        case = ET.SubElement(
            node,
            "testcase",
            name=result.name,
            classname=f"{suite}.{parent}" if parent else suite,
            file=result.path,
            time=f"{result.duration:.3f}",
        )
        failed = result.failures
        if failed:
            lines = [f"{c.name}: expected {c.expected}, {c.detail}" for c in failed]
            failure = ET.SubElement(case, "failure", message="; ".join(lines), type="expectation")
            failure.text = "\n".join(lines)
        status = result.solver.get("status")
        out = [f"stopped: {result.stopped}"] if result.stopped else []
        if status:
            objective = result.solver.get("objective")
            out.append(f"solver: {status}, objective {objective}, migrations {result.migrations}")
        if out:
            ET.SubElement(case, "system-out").text = "\n".join(out)
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
