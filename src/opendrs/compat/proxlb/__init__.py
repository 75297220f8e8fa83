"""proxlb-solver compatibility: its scenario files and its objective, in opendrs.

A proxlb-solver scenario (``scenarios/<folder>/<name>.yaml`` in credativ/proxlb-solver) is a small
cluster plus what a balancing solver is expected to make of it. opendrs loads it, runs a strategy
on it and checks the ``expect`` as proxlb-solver's reporter does; the ``optimal`` strategy models
proxlb-solver's objective exactly. The modules:

* :mod:`opendrs.engine.objective` (in the engine, which ``optimal`` builds on) —
  proxlb-solver's balancing methods, balanciness levels, term weights and load terms, the
  real-valued spread and utilisation thresholds;
* :mod:`.scenario` — the loaded scenario: proxlb-solver's records and the opendrs cluster;
* :mod:`.metric` — what opendrs's own strategies balance for a method (:func:`balance_metric`:
  ``memory`` balances configured memory alone, ``cpu`` measured CPU use or vCPUs alone,
  ``cpu_psi`` the guests' CPU pressure alone, …), so every strategy balances what the scenario
  asks for;
* :mod:`.loader` — reading a scenario file (proxlb-solver's loader defaults, one-line errors);
* :mod:`.expect` — the reporter's spread and expectation checks;
* :mod:`.check` — running scenarios, and their JUnit XML report.
"""

from __future__ import annotations

from opendrs.engine.objective import PROXLB_METHODS

from .check import (
    DEFAULT_CHECK_TIME_LIMIT,
    ScenarioResult,
    check_paths,
    check_scenario,
    junit_xml,
    scenario_files,
)
from .expect import Check, evaluate_expect, load_gap
from .loader import is_proxlb_scenario, load_scenario, loads_scenario, scenario_from_dict
from .metric import BalanceMetric, balance_metric
from .scenario import LOADER_WEIGHTS, Balancing, Expect, Scenario

__all__ = [
    "DEFAULT_CHECK_TIME_LIMIT",
    "LOADER_WEIGHTS",
    "PROXLB_METHODS",
    "BalanceMetric",
    "Balancing",
    "Check",
    "Expect",
    "Scenario",
    "ScenarioResult",
    "balance_metric",
    "check_paths",
    "check_scenario",
    "evaluate_expect",
    "is_proxlb_scenario",
    "junit_xml",
    "load_gap",
    "load_scenario",
    "loads_scenario",
    "scenario_files",
    "scenario_from_dict",
]
