"""proxlb-solver scenario files: load them into opendrs, run a strategy, check their ``expect``.

A proxlb-solver scenario (``scenarios/<folder>/<name>.yaml`` in credativ/proxlb-solver) is a small
cluster — ``nodes``, ``vms``, ``constraints``, ``balancing`` options, optionally an
``evacuate_node`` — plus what a balancing solver is expected to make of it (``expect``).

**Loading** (:func:`load_scenario`) follows proxlb-solver's loader: GB means GiB
(``int(v · 2³⁰)`` bytes); ``cpu_usage`` defaults to ``cpu``, ``priority`` to 2, ``type`` to ``vm``,
``balanciness`` to 3 (1–5), ``cpu_overcommit`` to 2.0, ``max_node_inflow`` to 1 and
``max_parallel_migrations`` to unlimited; the smart weights default to the loader's values
(``w_*_usage`` 1, ``w_*_psi`` 1, ``w_global_mem`` 10, ``w_global_cpu`` 10, ``w_global_io`` 1).
Rules: a ``plb_affinity_*`` / ``plb_anti_affinity_*`` tag shared by two or more guests is a hard
rule; a guest's ``plb_pin_<node>`` tags form one pin set (unknown nodes skipped); every ``pin``
entry restricts its guest further (the allowed nodes are the intersection); ``affinity`` and
``anti_affinity`` rules are hard unless ``hard: false``; ``ignore`` keeps a guest where it is.
Unknown keys are ignored, as proxlb-solver does (each is listed in :attr:`Scenario.notes`).

The opendrs cluster's usage mode, balance source and resource weights are the scenario's
``balancing.method`` (:func:`balance_metric`: ``memory`` balances configured memory alone, ``cpu``
measured CPU use or vCPUs alone, ``cpu_psi`` the guests' CPU pressure alone, …), so every strategy
balances what the scenario asks for; ``cpu_usage`` is the
measured CPU use, containers may move by restart and local disks may be copied. ``evacuate_node``
puts that node in maintenance. Node reserves become node reserves. **Storage**: proxlb-solver takes
a node's *free* space as its capacity, so guests that already sit on a pool count twice and a valid
state turns infeasible (three 40 GB containers on a node with 50 GB free). opendrs's capacity of a
pool is what it really is: ``storage_free`` plus what the node's own guests use there, less the
reserve.

**Checking** (:func:`check_scenario`) runs a strategy (``optimal`` by default, with the scenario's
balancing options and ``strict=True`` — proxlb-solver's semantics for contradictory rules) through
:func:`~opendrs.engine.planner.plan_with_retries`, then evaluates ``expect`` exactly as
proxlb-solver's reporter does (:func:`evaluate_expect`).
"""

from __future__ import annotations

import inspect
import math
import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from opendrs.engine.planner import Plan, plan_with_retries
from opendrs.engine.policy import strategy_problem
from opendrs.engine.strategies import get_strategy
from opendrs.engine.strategies import optimal as _optimal  # registers "optimal"
from opendrs.model.cluster import (
    BalanceSource,
    Cluster,
    Disk,
    Guest,
    Node,
    Pressure,
    Settings,
    UsageMode,
)
from opendrs.model.document import Reader, describe, parse, read_file, render_path
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.model.snapshot import MAX_BYTES, MAX_CORES, MAX_RATIO, MIN_NODE_CORES, SnapshotError

__all__ = [
    "LOADER_WEIGHTS",
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
    "scenario_from_dict",
]

GIB = 1024**3
#: Largest size in GiB (8 PiB, as in snapshots) and largest w_balance / w_stickiness.
MAX_GIB = MAX_BYTES // GIB
MAX_WEIGHT = 10**6
#: The methods proxlb-solver knows (opendrs's ``balance`` is not one of them).
PROXLB_METHODS: tuple[str, ...] = tuple(m for m in _optimal.METHODS if m != "balance")
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
#: CP-SAT budget per scenario when checking (they are tiny: a few milliseconds each).
DEFAULT_CHECK_TIME_LIMIT = 5.0
#: A single method read in ``mode: psi`` is the pressure of its resource (as ``optimal`` reads it).
_PSI_OF = {"memory": "memory_psi", "cpu": "cpu_psi", "disk": "io_psi"}

_TOP_KEYS = (
    "name",
    "description",
    "balancing",
    "nodes",
    "vms",
    "constraints",
    "evacuate_node",
    "expect",
)
_BALANCING_KEYS = (
    "method",
    "mode",
    "balanciness",
    "cpu_overcommit",
    "cpu_threshold",
    "memory_threshold",
    "disk_threshold",
    "w_balance",
    "w_stickiness",
    *LOADER_WEIGHTS,
    "max_parallel_migrations",
    "max_node_inflow",
)
_NODE_KEYS = (
    "cpu_total",
    "memory_total_gb",
    "storage_free",
    "reserve",
    "cpu_pressure",
    "memory_pressure",
    "io_pressure",
    "maintenance",
)
_RESERVE_KEYS = ("cpu", "memory_gb", "storage_gb")
_VM_KEYS = (
    "node",
    "cpu",
    "memory_gb",
    "cpu_usage",
    "cpu_pressure",
    "memory_pressure",
    "io_pressure",
    "disks",
    "priority",
    "type",
    "tags",
)
_CONSTRAINT_KEYS = ("affinity", "anti_affinity", "pin", "ignore")
_RULE_KEYS = ("name", "vms", "hard", "origin")
_PIN_KEYS = ("vm", "nodes", "strict")
_EXPECT_KEYS = (
    "feasible",
    "constraints_satisfied",
    "spread_improved",
    "max_migrations",
    "node_empty",
    "placements",
    "path_feasible",
)
_MISSING = object()

# --------------------------------------------------------------------------------------------
# The scenario


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


class Check(NamedTuple):
    """One expectation check: (name, expected, passed, detail), as proxlb-solver reports it."""

    name: str
    expected: str
    passed: bool
    detail: str


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


@dataclass(frozen=True, slots=True)
class BalanceMetric:
    """What the imported cluster's :class:`Settings` balance for a scenario's method.

    ``mode`` is the usage mode, ``weight_cpu``/``weight_memory`` the resource weights and
    ``source`` the balance source (``usage`` or ``pressure``) every opendrs strategy reads
    (:func:`balance_metric`); ``note`` says where that only approximates proxlb-solver's
    objective (``None``: it is the same up to a constant factor).
    """

    mode: UsageMode
    weight_cpu: float
    weight_memory: float
    note: str | None = None
    source: BalanceSource = "usage"


def balance_metric(
    balancing: Balancing, has_pressure: Mapping[str, bool] | None = None
) -> BalanceMetric:
    """The scenario's ``balancing.method`` (and ``mode``) as the cluster's balance settings.

    Every opendrs strategy balances the cpu and memory columns of the cluster's
    :class:`~opendrs.engine.usage.LoadModel` — the usage mode's load, or with ``balance_source:
    pressure`` each guest's pressure × priority / 2 against 100 per node — weighted by
    ``Settings.weight_cpu/weight_memory``; the method picks them:

    * ``memory``: configured memory alone (static mode, weights 0 / 1) — proxlb-solver's spread.
    * ``cpu``: the cpu fraction alone (weights 1 / 0) — measured use (``cpu_usage``, dynamic mode)
      in ``used`` mode, vCPUs (static mode) in ``assigned`` mode, as proxlb-solver counts it.
    * ``cpu_psi``, ``memory_psi`` (and ``cpu``/``memory`` in ``mode: psi``): that pressure alone
      (``pressure``, weights 1 / 0 or 0 / 1) — proxlb-solver's footprint Σ pressure · priority /
      100, halved (the same placements balance). Static mode: the hard capacity checks are
      configured vCPUs × overcommit and configured memory, proxlb-solver's.
    * ``cpu_smart``, ``memory_smart``: proxlb-solver adds two spreads, ``w_X_usage`` · the usage
      spread + ``w_X_psi`` · the pressure spread; a cluster balances one source. Exact when one
      part is constant — its weight is 0, or no guest has that pressure (``has_pressure``, by
      resource: ``None`` means every resource has some): then the other alone. Otherwise the part
      with the larger weight (pressure on a tie), with a note: the other part is left out.
    * ``global_smart``: cpu and memory weighted ``w_global_cpu · (w_cpu_usage + w_cpu_psi)`` and
      ``w_global_mem · (w_mem_usage + w_mem_psi)`` (a psi weight counts only where a guest has
      that pressure); pressure is balanced when its weighted parts weigh at least as much as the
      usage parts (``w_global_R · w_R_psi`` against ``w_global_R · w_R_usage``), usage otherwise.
      Exact when the other source's parts all weigh 0 and there is no io part.
    * ``disk``, ``io_psi``, ``io_smart`` (and ``disk`` in ``mode: psi``): opendrs's strategies
      have no disk or io balance; they keep opendrs's own (configured vCPUs and memory, equal
      weights). Only ``optimal`` balances them.

    ``optimal`` itself always gets the method and models it exactly, priorities included.
    """
    method, mode, w = balancing.method, balancing.mode, balancing.weights
    if mode == "psi" and method in _PSI_OF:
        method = _PSI_OF[method]
    present = {"cpu": True, "memory": True, "io": True, **(has_pressure or {})}
    cpu_mode: UsageMode = "static" if mode == "assigned" else "dynamic"
    if method == "memory":
        return BalanceMetric("static", 0.0, 1.0)
    if method == "cpu":
        return BalanceMetric(cpu_mode, 1.0, 0.0)
    if method == "cpu_psi":
        return BalanceMetric("static", 1.0, 0.0, source="pressure")
    if method == "memory_psi":
        return BalanceMetric("static", 0.0, 1.0, source="pressure")
    if method in ("cpu_smart", "memory_smart"):
        resource = method.removesuffix("_smart")
        key = "mem" if resource == "memory" else "cpu"
        w_usage, w_psi = w[f"w_{key}_usage"], w[f"w_{key}_psi"]
        cols = (1.0, 0.0) if resource == "cpu" else (0.0, 1.0)
        usage_mode: UsageMode = cpu_mode if resource == "cpu" else "static"
        used = "measured CPU use" if cpu_mode == "dynamic" else "vCPUs"
        what = used if resource == "cpu" else "configured memory"
        if w_psi <= 0 or not present[resource]:
            return BalanceMetric(usage_mode, *cols)
        if w_usage <= 0:
            return BalanceMetric("static", *cols, source="pressure")
        if w_psi >= w_usage:
            note = (
                f"opendrs's own strategies balance {resource} pressure alone (w_{key}_psi "
                f"{w_psi:g} ≥ w_{key}_usage {w_usage:g}), leaving out the {what} spread; only "
                "optimal balances both"
            )
            return BalanceMetric("static", *cols, note, "pressure")
        note = (
            f"opendrs's own strategies balance {what} alone (w_{key}_usage {w_usage:g} > "
            f"w_{key}_psi {w_psi:g}), leaving out the {resource} pressure spread; only optimal "
            "balances both"
        )
        return BalanceMetric(usage_mode, *cols, note)
    if method == "global_smart":
        psi_cpu = w["w_cpu_psi"] if present["cpu"] else 0.0
        psi_mem = w["w_mem_psi"] if present["memory"] else 0.0
        usage_part = w["w_global_cpu"] * w["w_cpu_usage"] + w["w_global_mem"] * w["w_mem_usage"]
        psi_part = w["w_global_cpu"] * psi_cpu + w["w_global_mem"] * psi_mem
        cpu = w["w_global_cpu"] * (w["w_cpu_usage"] + psi_cpu)
        memory = w["w_global_mem"] * (w["w_mem_usage"] + psi_mem)
        pressure = psi_part > 0 and psi_part >= usage_part
        parts = []
        if pressure and usage_part > 0:
            parts.append("pressure standing in for the usage parts")
        elif not pressure and psi_part > 0:
            parts.append("the usage standing in for the pressure parts")
        if w["w_global_io"] > 0:
            parts.append("no io part")
        source = "pressure" if pressure else "usage"
        note = (
            f"opendrs's own strategies balance cpu and memory {source} weighted "
            f"{cpu:g} / {memory:g} ({', '.join(parts)}); only optimal balances the whole method"
            if parts
            else None
        )
        if cpu <= 0 and memory <= 0:
            return BalanceMetric("static", 1.0, 1.0, note)
        if pressure:
            return BalanceMetric("static", float(cpu), float(memory), note, "pressure")
        return BalanceMetric(cpu_mode if cpu > 0 else "static", float(cpu), float(memory), note)
    # disk, io_psi, io_smart
    return BalanceMetric(
        "static",
        1.0,
        1.0,
        "opendrs's own strategies have no disk or io balance: they balance configured vCPUs "
        "and memory; only optimal balances local disks and io pressure",
    )


# --------------------------------------------------------------------------------------------
# Detection


def is_proxlb_scenario(data: object) -> bool:
    """Whether a parsed document is a proxlb-solver scenario rather than an opendrs snapshot.

    A scenario has top-level ``vms`` and ``nodes`` whose entries carry ``cpu_total`` or
    ``memory_total_gb``; an opendrs snapshot has ``version`` and ``guests`` instead.
    """
    if not isinstance(data, Mapping) or "vms" not in data:
        return False
    if "version" in data or "guests" in data:
        return False
    nodes = data.get("nodes")
    if not isinstance(nodes, Mapping):
        return False
    return any(
        isinstance(n, Mapping) and ("cpu_total" in n or "memory_total_gb" in n)
        for n in nodes.values()
    ) or (not nodes and any(k in data for k in ("balancing", "expect", "constraints")))


# --------------------------------------------------------------------------------------------
# Loading

PathT = tuple[str | int, ...]


class _Reader(Reader):
    """Walks a parsed scenario, checking each field; every problem is a one-line SnapshotError.

    proxlb-solver's loader is more lenient than opendrs's documents, and so is this reader:
    unknown keys are ignored (each noted in :attr:`notes`), a null value counts as missing, a
    name may be a number, and a whole number may be written as ``4.0``.
    """

    def __init__(self, filename: str) -> None:
        super().__init__(filename)
        self.notes: list[str] = []

    def mapping(
        self, value: object, path: PathT, allowed: Sequence[str] | None = None
    ) -> Mapping[Any, Any]:
        mapping = super().mapping(value, path)
        if allowed is not None:
            for key in mapping:
                if key not in allowed:
                    where = render_path((*path, str(key))) or str(key)
                    self.notes.append(f"unknown key {where} ignored")
        return mapping

    def optional_mapping(
        self, parent: Mapping[Any, Any], key: str, path: PathT, allowed: Sequence[str] | None = None
    ) -> Mapping[Any, Any]:
        value = parent.get(key)
        if value is None:
            return {}
        return self.mapping(value, (*path, key), allowed)

    def name(self, value: object, path: PathT) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            self.fail(path, f"expected a name, got {describe(value)}")
        return str(value)

    def amount(
        self, value: object, path: PathT, *, above: bool = False, maximum: float = MAX_RATIO
    ) -> float:
        """A finite number ≥ 0 (> 0 when ``above``), at most ``maximum`` (physically sensible:
        :data:`MAX_CORES` for cores, :data:`MAX_GIB` for GiB, 100 for pressures, else 1000)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"expected a number, got {describe(value)}")
        if not math.isfinite(value) or abs(value) > 1e15:
            self.fail(path, f"expected a finite number, got {describe(value)}")
        if value < 0 or (above and value == 0):
            self.fail(path, f"expected a number {'>' if above else '≥'} 0, got {describe(value)}")
        if value > maximum:
            most = int(maximum) if float(maximum).is_integer() else maximum
            self.fail(path, f"expected a number ≤ {most}, got {describe(value)}")
        return value

    def cores(self, value: object, path: PathT) -> float:
        return self.amount(value, path, maximum=MAX_CORES)

    def percent(self, value: object, path: PathT) -> float:
        return self.amount(value, path, maximum=100.0)

    def count(
        self, value: object, path: PathT, *, minimum: int = 0, maximum: int | None = None
    ) -> int:
        """A whole number (``4.0`` counts) from ``minimum`` to ``maximum``."""
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                self.fail(path, f"expected a whole number, got {describe(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"{minimum} to {maximum}" if maximum is not None else f"≥ {minimum}"
            self.fail(path, f"expected a whole number {bounds}, got {describe(value)}")
        return value

    def gib(self, value: object, path: PathT) -> int:
        """GB (meaning GiB, as proxlb-solver reads it) to bytes: ``int(v · 2³⁰)``."""
        return int(self.amount(value, path, maximum=MAX_GIB) * GIB)

    def parallel(self, value: object, path: PathT) -> int:
        return self.count(value, path, minimum=1, maximum=100_000)

    def weight(self, value: object, path: PathT) -> int:
        return self.count(value, path, maximum=MAX_WEIGHT)

    def gib_map(self, value: object, path: PathT) -> dict[str, int]:
        if value is None:
            return {}
        mapping = self.mapping(value, path)
        return {
            self.name(k, (*path, str(k))): self.gib(v, (*path, str(k))) for k, v in mapping.items()
        }

    def optional(
        self, parent: Mapping[Any, Any], key: str, path: PathT, read: Any, default: Any = None
    ) -> Any:
        value = parent.get(key, _MISSING)
        if value is _MISSING or value is None:
            return default
        return read(value, (*path, key))

    def require(self, parent: Mapping[Any, Any], key: str, path: PathT) -> Any:
        """``parent[key]``; a null value counts as missing, as proxlb-solver reads it."""
        value = parent.get(key, _MISSING)
        if value is _MISSING or value is None:
            self.fail((*path, key), "required key is missing")
        return value

    # -- sections ----------------------------------------------------------------------------

    def balancing(self, data: Mapping[Any, Any]) -> Balancing:
        path: PathT = ("balancing",)
        b = self.optional_mapping(data, "balancing", (), _BALANCING_KEYS)
        method = self.optional(b, "method", path, self.name, "memory")
        if method not in PROXLB_METHODS:
            self.fail(
                (*path, "method"), f"unknown method {method!r} (known: {', '.join(PROXLB_METHODS)})"
            )
        mode = self.optional(b, "mode", path, self.name, "used")
        if mode not in _optimal.USAGES:
            self.fail(
                (*path, "mode"), f"unknown mode {mode!r} (known: {', '.join(_optimal.USAGES)})"
            )
        balanciness = self.optional(
            b, "balanciness", path, lambda v, p: self.count(v, p, minimum=1, maximum=5), 3
        )
        overcommit = self.optional(
            b, "cpu_overcommit", path, lambda v, p: self.amount(v, p, above=True), 2.0
        )
        weights = {
            k: self.optional(b, k, path, self.amount, default)
            for k, default in LOADER_WEIGHTS.items()
        }
        return Balancing(
            method=method,
            mode=mode,
            balanciness=balanciness,
            cpu_overcommit=float(overcommit),
            cpu_threshold=self.optional(b, "cpu_threshold", path, self.amount),
            memory_threshold=self.optional(b, "memory_threshold", path, self.amount),
            disk_threshold=self.optional(b, "disk_threshold", path, self.amount),
            w_balance=self.optional(b, "w_balance", path, self.weight),
            w_stickiness=self.optional(b, "w_stickiness", path, self.weight),
            weights=weights,
            max_parallel_migrations=self.optional(
                b, "max_parallel_migrations", path, self.parallel
            ),
            max_node_inflow=self.optional(b, "max_node_inflow", path, self.parallel, 1),
        )

    def expect(self, data: Mapping[Any, Any]) -> Expect:
        path: PathT = ("expect",)
        e = self.optional_mapping(data, "expect", (), _EXPECT_KEYS)
        raw = self.optional(e, "placements", path, self.mapping, {})
        placements = {}
        for k, v in raw.items():
            where = (*path, "placements", str(k))
            if v is None or isinstance(v, Mapping | list):
                self.fail(where, f"expected a node or '== other-vm', got {describe(v)}")
            placements[self.name(k, where)] = str(v)
        return Expect(
            feasible=self.optional(e, "feasible", path, self.boolean, True),
            constraints_satisfied=self.optional(
                e, "constraints_satisfied", path, self.boolean, True
            ),
            spread_improved=self.optional(e, "spread_improved", path, self.boolean),
            max_migrations=self.optional(e, "max_migrations", path, self.count),
            node_empty=self.optional(e, "node_empty", path, self.name),
            placements=placements,
            path_feasible=self.optional(e, "path_feasible", path, self.boolean),
        )

    def nodes(self, data: Mapping[Any, Any]) -> tuple[list[ProxlbNode], dict[str, dict[str, Any]]]:
        raw = self.mapping(self.require(data, "nodes", ()), ("nodes",))
        if not raw:
            self.fail(("nodes",), "a scenario needs at least one node")
        out: list[ProxlbNode] = []
        extra: dict[str, dict[str, Any]] = {}
        for key, value in raw.items():
            name = self.name(key, ("nodes",))
            path: PathT = ("nodes", name)
            nd = self.mapping(value, path, _NODE_KEYS)
            reserve = self.optional_mapping(nd, "reserve", path, _RESERVE_KEYS)
            rpath = (*path, "reserve")
            out.append(
                ProxlbNode(
                    name=name,
                    cpu_total=self.cores(self.require(nd, "cpu_total", path), (*path, "cpu_total")),
                    memory_total=self.gib(
                        self.require(nd, "memory_total_gb", path), (*path, "memory_total_gb")
                    ),
                    storage_free=MappingProxyType(
                        self.gib_map(nd.get("storage_free"), (*path, "storage_free"))
                    ),
                    maintenance=self.optional(nd, "maintenance", path, self.boolean, False),
                )
            )
            extra[name] = {
                "reserve_cpu": float(self.optional(reserve, "cpu", rpath, self.cores, 0)),
                "reserve_memory": self.optional(reserve, "memory_gb", rpath, self.gib, 0),
                "reserve_storage": self.gib_map(reserve.get("storage_gb"), (*rpath, "storage_gb")),
                "pressure": Pressure(
                    cpu=float(self.optional(nd, "cpu_pressure", path, self.percent, 0.0)),
                    memory=float(self.optional(nd, "memory_pressure", path, self.percent, 0.0)),
                    io=float(self.optional(nd, "io_pressure", path, self.percent, 0.0)),
                ),
            }
            node = out[-1]
            for key, own, capacity, unit in (
                ("cpu", extra[name]["reserve_cpu"], node.cpu_total, "cpu_total"),
                ("memory_gb", extra[name]["reserve_memory"], node.memory_total, "memory_total_gb"),
            ):
                if capacity <= 0 or (key == "cpu" and capacity < MIN_NODE_CORES):
                    least = f"at least {MIN_NODE_CORES:g}" if key == "cpu" else "more than 0"
                    self.fail((*path, unit), f"a node needs {least}, got {describe(capacity)}")
                if own >= capacity:
                    self.fail(
                        (*rpath, key),
                        f"a reserve must leave some capacity: less than {unit}, got "
                        f"{describe(reserve[key])}",
                    )
        return out, extra

    def vms(
        self, data: Mapping[Any, Any], node_names: set[str]
    ) -> tuple[list[ProxlbVM], dict[str, list[str]]]:
        raw = self.optional_mapping(data, "vms", ())
        out: list[ProxlbVM] = []
        tags: dict[str, list[str]] = {}
        for key, value in raw.items():
            name = self.name(key, ("vms",))
            path: PathT = ("vms", name)
            vd = self.mapping(value, path, _VM_KEYS)
            node = self.name(self.require(vd, "node", path), (*path, "node"))
            if node not in node_names:
                self.fail((*path, "node"), f"unknown node {node!r}")
            cpu = self.cores(self.require(vd, "cpu", path), (*path, "cpu"))
            kind = self.optional(vd, "type", path, self.name, "vm")
            if kind not in ("vm", "ct"):
                self.fail((*path, "type"), f"expected 'vm' or 'ct', got {kind!r}")
            tag_list = self.optional(vd, "tags", path, self.sequence, [])
            tags[name] = [self.name(t, (*path, "tags", i)) for i, t in enumerate(tag_list)]
            out.append(
                ProxlbVM(
                    name=name,
                    node=node,
                    cpu=cpu,
                    memory=self.gib(self.require(vd, "memory_gb", path), (*path, "memory_gb")),
                    cpu_usage=float(self.optional(vd, "cpu_usage", path, self.cores, float(cpu))),
                    cpu_pressure=float(self.optional(vd, "cpu_pressure", path, self.percent, 0.0)),
                    memory_pressure=float(
                        self.optional(vd, "memory_pressure", path, self.percent, 0.0)
                    ),
                    io_pressure=float(self.optional(vd, "io_pressure", path, self.percent, 0.0)),
                    disks=MappingProxyType(self.gib_map(vd.get("disks"), (*path, "disks"))),
                    priority=self.optional(
                        vd, "priority", path, lambda v, p: self.count(v, p, maximum=3), 2
                    ),
                    type=kind,
                )
            )
        return out, tags

    def rules(self, cd: Mapping[Any, Any], key: str) -> list[ProxlbRule]:
        path: PathT = ("constraints", key)
        out = []
        for i, value in enumerate(self.optional(cd, key, ("constraints",), self.sequence, [])):
            rd = self.mapping(value, (*path, i), _RULE_KEYS)
            vms = self.sequence(self.require(rd, "vms", (*path, i)), (*path, i, "vms"))
            origin = self.optional(rd, "origin", (*path, i), self.name, "plb")
            if origin not in ("plb", "pve"):
                self.fail((*path, i, "origin"), f"expected 'plb' or 'pve', got {origin!r}")
            out.append(
                ProxlbRule(
                    name=self.optional(rd, "name", (*path, i), self.name, f"{key}[{i}]"),
                    vms=tuple(self.name(v, (*path, i, "vms", k)) for k, v in enumerate(vms)),
                    hard=self.optional(rd, "hard", (*path, i), self.boolean, True),
                    origin=origin,
                )
            )
        return out

    def pins(self, cd: Mapping[Any, Any]) -> list[tuple[str, tuple[str, ...]]]:
        path: PathT = ("constraints", "pin")
        out = []
        for i, value in enumerate(self.optional(cd, "pin", ("constraints",), self.sequence, [])):
            pd = self.mapping(value, (*path, i), _PIN_KEYS)
            vm = self.name(self.require(pd, "vm", (*path, i)), (*path, i, "vm"))
            nodes = self.sequence(self.require(pd, "nodes", (*path, i)), (*path, i, "nodes"))
            out.append(
                (vm, tuple(self.name(n, (*path, i, "nodes", k)) for k, n in enumerate(nodes)))
            )
        return out

    def ignore(self, cd: Mapping[Any, Any]) -> list[str]:
        path: PathT = ("constraints", "ignore")
        out = []
        for i, value in enumerate(self.optional(cd, "ignore", ("constraints",), self.sequence, [])):
            if isinstance(value, Mapping):
                out.append(self.name(self.require(value, "vm", (*path, i)), (*path, i, "vm")))
            else:
                out.append(self.name(value, (*path, i)))
        return out

    # -- the whole document ------------------------------------------------------------------

    def scenario(self, data: object, default_name: str) -> Scenario:
        doc = self.mapping(data, (), _TOP_KEYS)
        balancing = self.balancing(doc)
        nodes, node_extra = self.nodes(doc)
        node_names = {n.name for n in nodes}
        vms, tags = self.vms(doc, node_names)
        vm_names = {v.name for v in vms}
        cd = self.optional_mapping(doc, "constraints", (), _CONSTRAINT_KEYS)
        affinity = self.rules(cd, "affinity")
        anti_affinity = self.rules(cd, "anti_affinity")
        pins = self.pins(cd)
        ignore = self.ignore(cd)
        evacuate = self.optional(doc, "evacuate_node", (), self.name)
        if evacuate is not None and evacuate not in node_names:
            self.fail(("evacuate_node",), f"unknown node {evacuate!r}")
        expect = self.expect(doc)
        name = self.optional(doc, "name", (), self.name, default_name)
        description = str(doc.get("description") or "").strip()

        # Tags: plb_affinity_* / plb_anti_affinity_* shared by ≥ 2 guests, plb_pin_<node> sets.
        tag_aff: dict[str, list[str]] = {}
        tag_anti: dict[str, list[str]] = {}
        tag_pins: dict[str, set[str]] = {}
        for vm in vms:
            for tag in tags[vm.name]:
                if tag.startswith("plb_affinity_"):
                    tag_aff.setdefault(tag, []).append(vm.name)
                elif tag.startswith("plb_anti_affinity_"):
                    tag_anti.setdefault(tag, []).append(vm.name)
                elif tag.startswith("plb_pin_"):
                    target = tag[len("plb_pin_") :]
                    pinned = tag_pins.setdefault(vm.name, set())
                    if target in node_names:
                        pinned.add(target)
                    else:
                        self.notes.append(f"vms.{vm.name}: tag {tag} names no node: skipped")
        affinity += [ProxlbRule(t, tuple(m)) for t, m in tag_aff.items() if len(m) > 1]
        anti_affinity += [ProxlbRule(t, tuple(m)) for t, m in tag_anti.items() if len(m) > 1]
        pins += [(vm, tuple(sorted(s))) for vm, s in tag_pins.items() if s]

        cluster = self._cluster(
            name,
            balancing,
            nodes,
            node_extra,
            vms,
            affinity,
            anti_affinity,
            pins,
            ignore,
            evacuate,
            vm_names,
        )
        options: dict[str, Any] = {
            "method": balancing.method,
            "usage": balancing.mode,
            "balanciness": balancing.balanciness,
            "w_balance": balancing.w_balance,
            "w_stickiness": balancing.w_stickiness,
            "cpu_threshold": balancing.cpu_threshold,
            "memory_threshold": balancing.memory_threshold,
            "disk_threshold": balancing.disk_threshold,
            **balancing.weights,
            "strict": True,
        }
        return Scenario(
            name=name,
            path=self.filename,
            cluster=cluster,
            options=MappingProxyType(options),
            balancing=balancing,
            nodes=tuple(nodes),
            vms=tuple(vms),
            affinity=tuple(affinity),
            anti_affinity=tuple(anti_affinity),
            pins=tuple(pins),
            ignore=tuple(ignore),
            expect=expect,
            evacuate_node=evacuate,
            description=description,
            notes=tuple(self.notes),
        )

    def _cluster(
        self,
        name: str,
        balancing: Balancing,
        nodes: list[ProxlbNode],
        node_extra: dict[str, dict[str, Any]],
        vms: list[ProxlbVM],
        affinity: list[ProxlbRule],
        anti_affinity: list[ProxlbRule],
        pins: list[tuple[str, tuple[str, ...]]],
        ignore: list[str],
        evacuate: str | None,
        vm_names: set[str],
    ) -> Cluster:
        used: dict[tuple[str, str], int] = {}
        for vm in vms:
            for pool, size in vm.disks.items():
                used[vm.node, pool] = used.get((vm.node, pool), 0) + size
        opendrs_nodes = []
        for node in nodes:
            extra = node_extra[node.name]
            pools = set(node.storage_free) | set(extra["reserve_storage"])
            pools |= {p for (n, p) in used if n == node.name}
            storage = {
                p: max(
                    0,
                    node.storage_free.get(p, 0)
                    + used.get((node.name, p), 0)
                    - extra["reserve_storage"].get(p, 0),
                )
                for p in sorted(pools)
            }
            opendrs_nodes.append(
                Node(
                    name=node.name,
                    cpu=node.cpu_total,
                    memory=node.memory_total,
                    storage=storage,
                    maintenance=node.maintenance or node.name == evacuate,
                    reserve_cpu=extra["reserve_cpu"],
                    reserve_memory=extra["reserve_memory"],
                    pressure=extra["pressure"],
                )
            )
        guests = tuple(
            Guest(
                id=vm.name,
                node=vm.node,
                kind="ct" if vm.type == "ct" else "vm",
                cpu=vm.cpu,
                memory=vm.memory,
                disks=tuple(Disk(pool, size) for pool, size in sorted(vm.disks.items())),
                cpu_used=vm.cpu_usage,
                pressure=Pressure(
                    cpu=vm.cpu_pressure, memory=vm.memory_pressure, io=vm.io_pressure
                ),
                tags=tuple(),
                priority=vm.priority,
            )
            for vm in vms
        )
        # Rules: guests the cluster lacks are skipped (proxlb-solver does the same); a rule left
        # with fewer than two guests does nothing.
        guest_rules: list[GuestAffinity] = []
        seen_names: set[str] = set()

        def unique(rule_name: str) -> str:
            out, k = rule_name, 2
            while out in seen_names:
                out, k = f"{rule_name}#{k}", k + 1
            seen_names.add(out)
            return out

        for rules, positive in ((affinity, True), (anti_affinity, False)):
            for rule in rules:
                members = tuple(dict.fromkeys(v for v in rule.vms if v in vm_names))
                missing = [v for v in rule.vms if v not in vm_names]
                if missing:
                    self.notes.append(
                        f"rule {rule.name}: unknown guests {', '.join(missing)} skipped"
                    )
                if len(members) < 2:
                    continue
                guest_rules.append(GuestAffinity(unique(rule.name), members, positive, rule.hard))
        allowed: dict[str, set[str]] = {}
        node_names = {n.name for n in nodes}
        for vm, pin_nodes in pins:
            if vm not in vm_names:
                self.notes.append(f"pin of unknown guest {vm} skipped")
                continue
            known = {n for n in pin_nodes if n in node_names}
            allowed[vm] = allowed[vm] & known if vm in allowed else known
        node_rules = tuple(
            NodeAffinity(f"pin {vm}", (vm,), {n: 0 for n in sorted(nodes_)}, strict=True)
            for vm, nodes_ in sorted(allowed.items())
        )
        has_pressure = {
            resource: any(getattr(vm, f"{resource}_pressure") * vm.priority > 0 for vm in vms)
            for resource in ("cpu", "memory", "io")
        }
        metric = balance_metric(balancing, has_pressure)
        if metric.note is not None:
            self.notes.append(f"balancing.method {balancing.method}: {metric.note}")
        settings = Settings(
            mode=metric.mode,
            weight_cpu=metric.weight_cpu,
            weight_memory=metric.weight_memory,
            balance_source=metric.source,
            cpu_overcommit=balancing.cpu_overcommit,
            memory_overcommit=1.0,
            allow_restart_migration=True,
            allow_local_disks=True,
            min_uptime=0,
            max_parallel=balancing.max_parallel_migrations or max(1, len(vms)),
            max_node_inflow=balancing.max_node_inflow,
        )
        rules = Rules(node_rules, tuple(guest_rules), frozenset(v for v in ignore if v in vm_names))
        return Cluster(tuple(opendrs_nodes), guests, rules, settings, name)


def scenario_from_dict(
    data: object, *, filename: str = "<dict>", name: str | None = None
) -> Scenario:
    """Validate a parsed scenario and build it. Raises :class:`SnapshotError`, nothing else."""
    default = name if name is not None else Path(filename).stem or "scenario"
    try:
        return _Reader(filename).scenario(data, default)
    except SnapshotError:
        raise
    except RecursionError:
        raise SnapshotError(filename, "", "the document is nested too deeply") from None
    except Exception as exc:  # last line of defence: bad input never escapes as another error
        raise SnapshotError(
            filename, "", f"internal error while reading the scenario ({type(exc).__name__}: {exc})"
        ) from exc


def loads_scenario(text: str | bytes, *, filename: str = "<string>") -> Scenario:
    """Parse a scenario from YAML text."""
    return scenario_from_dict(parse(text, filename=filename, fmt="yaml"), filename=filename)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read a proxlb-solver scenario file. Raises :class:`SnapshotError` for any problem."""
    filename, data = read_file(path)
    return loads_scenario(data, filename=filename)


# --------------------------------------------------------------------------------------------
# proxlb-solver's spread (reporter ``_compute_load_gap``) and expectation checks


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
    checks: list[Check] = []
    if expect.feasible:
        checks.append(Check("feasible", "True", feasible, "OK" if feasible else status))
    else:
        checks.append(
            Check("feasible", "False", not feasible, "got feasible" if feasible else "OK")
        )
    if not feasible:
        return checks

    if expect.constraints_satisfied:
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
        checks.append(Check("constraints", "satisfied", not errors, "; ".join(errors) or "OK"))

    if expect.spread_improved is not None:
        before = load_gap(scenario, scenario.initial_placements)
        after = load_gap(scenario, placements)
        improved = after < before or before == 0
        detail = f"{before * 100:.1f}% → {after * 100:.1f}%"
        ok = improved if expect.spread_improved else not improved
        checks.append(Check("spread_improved", str(expect.spread_improved), ok, detail))

    if expect.max_migrations is not None:
        initial = scenario.initial_placements
        count = sum(1 for vm, node in placements.items() if vm in initial and initial[vm] != node)
        checks.append(
            Check(
                "max_migrations",
                f"≤{expect.max_migrations}",
                count <= expect.max_migrations,
                f"got {count}",
            )
        )

    if expect.node_empty is not None:
        here = [v for v, n in placements.items() if n == expect.node_empty]
        checks.append(
            Check("node_empty", expect.node_empty, not here, f"still has {here}" if here else "OK")
        )

    for vm, wanted in expect.placements.items():
        actual = placements.get(vm)
        if wanted.startswith("== "):
            other = wanted[3:]
            ref = placements.get(other)
            checks.append(
                Check(f"placement:{vm}", f"== {other}", actual == ref, f"{actual} vs {ref}")
            )
        else:
            checks.append(Check(f"placement:{vm}", wanted, actual == wanted, f"got {actual}"))

    if expect.path_feasible is not None and path_feasible is not None:
        if expect.path_feasible:
            detail = "OK" if path_feasible else f"unreachable: {unreachable}"
            checks.append(Check("path_feasible", "True", path_feasible, detail))
        else:
            detail = "OK" if not path_feasible else "path is feasible (expected infeasible)"
            checks.append(Check("path_feasible", "False", not path_feasible, detail))
    elif path_feasible is False:
        checks.append(
            Check(
                "path_feasible",
                "reachable",
                False,
                f"UNREACHABLE: no executable migration path ({unreachable})",
            )
        )
    return checks


# --------------------------------------------------------------------------------------------
# Running scenarios


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
    strategies run with their defaults (and ``time_limit`` when they take one) on the cluster,
    whose settings carry the balancing method (:func:`balance_metric`). A proposal whose
    moves cannot be ordered safely is re-proposed with those placements forbidden
    (:func:`~opendrs.engine.planner.plan_with_retries`); once a re-proposal is infeasible, the last
    feasible one stands, with its unreachable plan (proxlb-solver's ``solve_reachable``).
    """
    started = time.perf_counter()
    info = get_strategy(strategy)
    params = inspect.signature(info.propose).parameters
    kwargs = dict(scenario.options) if info.name == _optimal.STRATEGY else {}
    if "time_limit" in params:
        kwargs["time_limit"] = time_limit
    refused = strategy_problem(info.name, kwargs) if kwargs else None
    if refused is not None:  # the scenario's options, not a bug: a failed check of this file
        check = Check("options", f"options {info.name} takes", False, refused[1])
        return ScenarioResult(
            scenario.name, scenario.path, False, (check,), time.perf_counter() - started
        )
    calls = 0
    last_feasible: Any = None

    def propose(forbidden: frozenset[tuple[str, str]]) -> Any:
        # As proxlb-solver's ``solve_reachable``: once a re-proposal (with the unreachable
        # placements forbidden) is infeasible, the last feasible proposal stands, unreachable.
        nonlocal calls, last_feasible
        calls += 1
        extra = {"forbidden": forbidden} if "forbidden" in params else {}
        proposal = info.propose(scenario.cluster, **kwargs, **extra)
        if _feasible(proposal):
            last_feasible = proposal
        elif last_feasible is not None:
            return last_feasible
        return proposal

    proposal, plan = plan_with_retries(scenario.cluster, propose, max_retries=max_retries)
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
