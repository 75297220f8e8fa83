"""The simulated cluster (:class:`.simulator.Simulator`), one module per job."""

from .simulator import (
    HOT,
    MigrationRecord,
    NodeEvent,
    NodeFractions,
    Scenario,
    SimStats,
    Simulator,
    builtin_scenario,
    load_scenario,
)

__all__ = [
    "HOT",
    "MigrationRecord",
    "NodeEvent",
    "NodeFractions",
    "Scenario",
    "SimStats",
    "Simulator",
    "builtin_scenario",
    "load_scenario",
]
