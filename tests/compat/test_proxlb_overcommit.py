"""proxlb-solver's capacity limits under every balancing method and ``cpu_overcommit``.

proxlb-solver checks CPU only as configured vCPUs against cores × ``cpu_overcommit`` and memory
as configured memory against the node's memory (no memory overcommit), whatever the method. The
scenarios in ``scenarios/overcommit/`` put, for every method (``cpu`` in both usage modes) and
``cpu_overcommit`` 1 and 2, a guest of 2 vCPUs under the limit (feasible; a 60 GB guest on the
other 64 GB node keeps both where they are) or 2 over it (no node fits: infeasible) on one of two
16-core nodes. The ``cpu`` methods in ``used`` mode import as dynamic mode, whose measured use
(``cpu_usage``, by default the vCPUs) is checked against the same overcommitted cores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opendrs.compat.proxlb import check_scenario, load_scenario
from opendrs.engine.constraints import Constraints
from opendrs.engine.strategies import DEFAULT_STRATEGY
from opendrs.engine.usage import DimensionKind

HERE = Path(__file__).resolve().parent / "scenarios" / "overcommit"
FILES = sorted(HERE.glob("*.yaml"))
IDS = [p.stem for p in FILES]
GiB = 2**30


def test_every_method_and_overcommit_has_its_scenarios() -> None:
    methods = {"memory", "cpu", "cpu_assigned", "disk", "cpu_psi", "memory_psi", "io_psi"}
    methods |= {"cpu_smart", "memory_smart", "io_smart", "global_smart"}
    expected = {
        f"{m}_oc{oc}_{kind}"
        for m in methods
        for oc in ("1", "2")
        for kind in ("at_limit", "over_limit")
    }
    assert set(IDS) == expected


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_capacity_limits_are_proxlb_solvers(path: Path) -> None:
    scenario = load_scenario(path)
    overcommit = scenario.balancing.cpu_overcommit
    capacity = Constraints.build(scenario.cluster).capacity
    limits = {d.kind: capacity.limit[:, i] for i, d in enumerate(capacity.dimensions)}
    np.testing.assert_allclose(limits[DimensionKind.VCPUS], 16 * overcommit)
    np.testing.assert_allclose(limits[DimensionKind.MEMORY], 64 * GiB)
    # Only method cpu in used mode balances measured use here (the smart methods' pressure
    # parts weigh as much as their usage parts, so they balance pressure, in static mode).
    dynamic = scenario.cluster.settings.mode == "dynamic"
    assert dynamic == path.stem.startswith("cpu_oc")
    if dynamic:
        np.testing.assert_allclose(limits[DimensionKind.CPU_USED], 16 * overcommit)
        np.testing.assert_allclose(limits[DimensionKind.MEMORY_USED], 64 * GiB)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_optimal_meets_the_expectations(path: Path) -> None:
    result = check_scenario(load_scenario(path), strategy="optimal")
    assert not result.failures, result.failures


@pytest.mark.parametrize("path", [p for p in FILES if "at_limit" in p.stem], ids=lambda p: p.stem)
def test_the_default_strategy_plans_at_the_limit(path: Path) -> None:
    result = check_scenario(load_scenario(path), strategy=DEFAULT_STRATEGY)
    assert not result.failures, result.failures
