"""A scenario's ``expect``, evaluated exactly as proxlb-solver's reporter evaluates it.

:func:`load_gap` is the reporter's spread of a placement (``_compute_load_gap``);
:func:`evaluate_expect` gives the reporter's checks (:class:`Check`), in its order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from .scenario import Scenario

__all__ = ["Check", "evaluate_expect", "load_gap"]


class Check(NamedTuple):
    """One expectation check: (name, expected, passed, detail), as proxlb-solver reports it."""

    name: str
    expected: str
    passed: bool
    detail: str


def _single_gap(scenario: Scenario, placements: Mapping[str, str], metric: str) -> float:
    loads = []
    for node in scenario.nodes:
        if node.maintenance:
            continue
        here = [v for v in scenario.vms if placements.get(v.name) == node.name]
        if metric == "cpu":
            used, cap = sum(v.cpu_usage * v.priority for v in here), node.cpu_total
        elif metric == "io_usage":
            used = sum(sum(v.disks.values()) * v.priority for v in here)
            cap = sum(node.storage_free.values()) or 1
        elif metric.endswith("_psi"):
            attr = {
                "cpu_psi": "cpu_pressure",
                "memory_psi": "memory_pressure",
                "io_psi": "io_pressure",
            }[metric]
            used, cap = sum(getattr(v, attr) * v.priority for v in here), 100.0
        else:  # memory — and every other method, disk included
            used, cap = sum(v.memory * v.priority for v in here), node.memory_total
        loads.append(used / cap if cap else 0)
    return max(loads) - min(loads) if loads else 0.0


def _smart_gap(scenario: Scenario, placements: Mapping[str, str], resource: str) -> float:
    w = scenario.balancing.weights
    usage, psi, wu, wp = {
        "cpu": ("cpu", "cpu_psi", w["w_cpu_usage"], w["w_cpu_psi"]),
        "memory": ("memory", "memory_psi", w["w_mem_usage"], w["w_mem_psi"]),
        "io": ("io_usage", "io_psi", w["w_io_usage"], w["w_io_psi"]),
    }[resource]
    u = _single_gap(scenario, placements, usage)
    if not wu + wp:
        return u
    return (u * wu + _single_gap(scenario, placements, psi) * wp) / (wu + wp)


def load_gap(scenario: Scenario, placements: Mapping[str, str]) -> float:
    """proxlb-solver's reported spread of ``placements`` (its reporter's ``_compute_load_gap``).

    max − min over the nodes not in maintenance (``evacuate_node`` included) of Σ(metric ·
    priority) / capacity: configured memory / memory for ``memory`` and every method not listed
    here (``disk`` too), ``cpu_usage`` / cores for ``cpu``, pressure / 100 for ``*_psi``; the smart
    methods weigh usage and pressure spreads (io usage: disks / free storage), ``global_smart``
    the smart spreads by ``w_global_*``. No reserves.
    """
    method = scenario.balancing.method
    w = scenario.balancing.weights
    if method == "global_smart":
        parts = [
            (w["w_global_mem"], _smart_gap(scenario, placements, "memory")),
            (w["w_global_cpu"], _smart_gap(scenario, placements, "cpu")),
            (w["w_global_io"], _smart_gap(scenario, placements, "io")),
        ]
        total = sum(p[0] for p in parts)
        return sum(a * b for a, b in parts) / total if total else parts[0][1]
    if method.endswith("_smart"):
        return _smart_gap(scenario, placements, method.removesuffix("_smart"))
    if method in ("cpu", "cpu_psi", "memory_psi", "io_psi"):
        return _single_gap(scenario, placements, method)
    return _single_gap(scenario, placements, "memory")


def evaluate_expect(
    scenario: Scenario,
    *,
    feasible: bool,
    status: str,
    placements: Mapping[str, str],
    path_feasible: bool | None = None,
    unreachable: str = "",
) -> list[Check]:
    """The expectation checks of proxlb-solver's reporter, in its order and with its semantics.

    1. ``feasible`` (default true); an infeasible result ends the checks.
    2. ``constraints_satisfied`` (default true; false checks nothing): hard anti-affinity members
       apart, a hard affinity rule on one node, pinned guests on a pin node, nothing on a node in
       maintenance, ignored guests unmoved — on the final ``placements``. Capacity and
       ``evacuate_node`` are not checked.
    3. ``spread_improved``: ``final < initial or initial == 0`` (:func:`load_gap`).
    4. ``max_migrations``: guests whose final node differs from their initial one.
    5. ``node_empty``: no final placement on that node.
    6. ``placements``: a value ``"== other"`` wants the same node as ``other`` (two missing
       placements count as equal), any other value that node.
    7. ``path_feasible``: when given and a plan exists, it must equal the plan's feasibility; when
       not given, an unreachable plan fails the check.
    """
    expect = scenario.expect
    checks = [_feasible_check(expect.feasible, feasible, status)]
    if not feasible:
        return checks
    if expect.constraints_satisfied:
        errors = _constraint_errors(scenario, placements)
        checks.append(Check("constraints", "satisfied", not errors, "; ".join(errors) or "OK"))
    if expect.spread_improved is not None:
        checks.append(_spread_check(scenario, placements, expect.spread_improved))
    if expect.max_migrations is not None:
        checks.append(_migrations_check(scenario, placements, expect.max_migrations))
    if expect.node_empty is not None:
        here = [v for v, n in placements.items() if n == expect.node_empty]
        checks.append(
            Check("node_empty", expect.node_empty, not here, f"still has {here}" if here else "OK")
        )
    for vm, wanted in expect.placements.items():
        checks.append(_placement_check(placements, vm, wanted))
    path = _path_check(expect.path_feasible, path_feasible, unreachable)
    if path is not None:
        checks.append(path)
    return checks


def _feasible_check(expected: bool, feasible: bool, status: str) -> Check:
    if expected:
        return Check("feasible", "True", feasible, "OK" if feasible else status)
    return Check("feasible", "False", not feasible, "got feasible" if feasible else "OK")


def _constraint_errors(scenario: Scenario, placements: Mapping[str, str]) -> list[str]:
    """The hard rules, pins, maintenance nodes and ignored guests ``placements`` breaks."""
    errors: list[str] = []
    for rule in scenario.anti_affinity:
        if not rule.hard:
            continue
        used = [placements.get(v) for v in rule.vms if v in placements]
        if len(used) != len(set(used)):
            errors.append(f"anti-affinity '{rule.name}' violated")
    for rule in scenario.affinity:
        if not rule.hard:
            continue
        spread = {placements.get(v) for v in rule.vms if v in placements}
        if len(spread) > 1:
            errors.append(f"affinity '{rule.name}' violated: {sorted(map(str, spread))}")
    for vm, nodes in scenario.pins:
        placed = placements.get(vm)
        if placed and placed not in nodes:
            errors.append(f"pin {vm} on {placed}")
    for node in scenario.nodes:
        if node.maintenance:
            here = [v for v, n in placements.items() if n == node.name]
            if here:
                errors.append(f"VMs on maintenance {node.name}: {here}")
    initial = scenario.initial_placements
    for vm in scenario.ignore:
        if vm in initial and placements.get(vm) != initial[vm]:
            errors.append(f"ignored VM {vm} was moved")
    return errors


def _spread_check(scenario: Scenario, placements: Mapping[str, str], expected: bool) -> Check:
    before = load_gap(scenario, scenario.initial_placements)
    after = load_gap(scenario, placements)
    improved = after < before or before == 0
    detail = f"{before * 100:.1f}% → {after * 100:.1f}%"
    ok = improved if expected else not improved
    return Check("spread_improved", str(expected), ok, detail)


def _migrations_check(scenario: Scenario, placements: Mapping[str, str], most: int) -> Check:
    initial = scenario.initial_placements
    count = sum(1 for vm, node in placements.items() if vm in initial and initial[vm] != node)
    return Check("max_migrations", f"≤{most}", count <= most, f"got {count}")


def _placement_check(placements: Mapping[str, str], vm: str, wanted: str) -> Check:
    """``vm`` on node ``wanted``, or with ``"== other"`` on ``other``'s node."""
    actual = placements.get(vm)
    if wanted.startswith("== "):
        other = wanted[3:]
        ref = placements.get(other)
        return Check(f"placement:{vm}", f"== {other}", actual == ref, f"{actual} vs {ref}")
    return Check(f"placement:{vm}", wanted, actual == wanted, f"got {actual}")


def _path_check(
    expected: bool | None, path_feasible: bool | None, unreachable: str
) -> Check | None:
    """The plan's feasibility against ``expected`` (None: it must not be unreachable)."""
    if expected is not None and path_feasible is not None:
        if expected:
            detail = "OK" if path_feasible else f"unreachable: {unreachable}"
            return Check("path_feasible", "True", path_feasible, detail)
        detail = "OK" if not path_feasible else "path is feasible (expected infeasible)"
        return Check("path_feasible", "False", not path_feasible, detail)
    if path_feasible is False:
        return Check(
            "path_feasible",
            "reachable",
            False,
            f"UNREACHABLE: no executable migration path ({unreachable})",
        )
    return None
