"""A proxlb-solver scenario as loaded: proxlb-solver's own view of it, and the opendrs cluster.

A scenario (``scenarios/<folder>/<name>.yaml`` in proxlb-solver) is a small cluster — ``nodes``,
``vms``, ``constraints``, ``balancing`` options, optionally an ``evacuate_node`` — plus what a
balancing solver is expected to make of it (``expect``). :class:`Scenario` keeps both the opendrs
cluster built from it and proxlb-solver's own records (:class:`ProxlbNode`, :class:`ProxlbVM`,
:class:`ProxlbRule`), which the expectation checks read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from opendrs.model.cluster import Cluster

__all__ = [
    "LOADER_WEIGHTS",
    "Balancing",
    "Expect",
    "ProxlbNode",
    "ProxlbRule",
    "ProxlbVM",
    "Scenario",
]

#: Smart-method weights as proxlb-solver's scenario loader defaults them.
LOADER_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        "w_cpu_usage": 1,
        "w_cpu_psi": 1,
        "w_mem_usage": 1,
        "w_mem_psi": 1,
        "w_io_usage": 1,
        "w_io_psi": 1,
        "w_global_mem": 10,
        "w_global_cpu": 10,
        "w_global_io": 1,
    }
)


@dataclass(frozen=True, slots=True)
class ProxlbNode:
    """A node as proxlb-solver sees it (bytes; ``storage_free`` as written)."""

    name: str
    cpu_total: float
    memory_total: int
    storage_free: Mapping[str, int]
    maintenance: bool


@dataclass(frozen=True, slots=True)
class ProxlbVM:
    """A guest as proxlb-solver sees it (bytes, percent)."""

    name: str
    node: str
    cpu: float
    memory: int
    cpu_usage: float
    cpu_pressure: float
    memory_pressure: float
    io_pressure: float
    disks: Mapping[str, int]
    priority: int
    type: str


@dataclass(frozen=True, slots=True)
class ProxlbRule:
    """An affinity or anti-affinity rule of the scenario (tags included)."""

    name: str
    vms: tuple[str, ...]
    hard: bool = True
    origin: str = "plb"


@dataclass(frozen=True)
class Balancing:
    """The scenario's ``balancing`` block, with proxlb-solver's loader defaults."""

    method: str = "memory"
    mode: str = "used"
    balanciness: int = 3
    cpu_overcommit: float = 2.0
    cpu_threshold: float | None = None
    memory_threshold: float | None = None
    disk_threshold: float | None = None
    w_balance: int | None = None
    w_stickiness: int | None = None
    weights: Mapping[str, float] = field(default_factory=lambda: dict(LOADER_WEIGHTS))
    max_parallel_migrations: int | None = None
    max_node_inflow: int = 1


@dataclass(frozen=True)
class Expect:
    """What the scenario expects; ``None`` means "not checked"."""

    feasible: bool = True
    constraints_satisfied: bool = True
    spread_improved: bool | None = None
    max_migrations: int | None = None
    node_empty: str | None = None
    placements: Mapping[str, str] = field(default_factory=dict)
    path_feasible: bool | None = None


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario: the opendrs cluster, the options for ``optimal`` and the expectations.

    ``nodes``, ``vms`` and the rule lists keep proxlb-solver's own view, which the expectation
    checks use (its spread has no reserves and uses free storage, its maintenance flags leave out
    ``evacuate_node``).
    """

    name: str
    path: str
    cluster: Cluster
    options: Mapping[str, Any]
    balancing: Balancing
    nodes: tuple[ProxlbNode, ...]
    vms: tuple[ProxlbVM, ...]
    affinity: tuple[ProxlbRule, ...]
    anti_affinity: tuple[ProxlbRule, ...]
    pins: tuple[tuple[str, tuple[str, ...]], ...]
    ignore: tuple[str, ...]
    expect: Expect
    evacuate_node: str | None = None
    description: str = ""
    notes: tuple[str, ...] = ()

    @property
    def initial_placements(self) -> dict[str, str]:
        return {vm.name: vm.node for vm in self.vms}
