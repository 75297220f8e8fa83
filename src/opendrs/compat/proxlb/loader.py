"""Reading a proxlb-solver scenario file into a :class:`~.scenario.Scenario`.

Loading follows proxlb-solver's loader: GB means GiB (``int(v · 2³⁰)`` bytes); ``cpu_usage``
defaults to ``cpu``, ``priority`` to 2, ``type`` to ``vm``, ``balanciness`` to 3 (1–5),
``cpu_overcommit`` to 2.0, ``max_node_inflow`` to 1 and ``max_parallel_migrations`` to unlimited;
the smart weights default to the loader's values (:data:`~.scenario.LOADER_WEIGHTS`). Rules: a
``plb_affinity_*`` / ``plb_anti_affinity_*`` tag shared by two or more guests is a hard rule; a
guest's ``plb_pin_<node>`` tags form one pin set (unknown nodes skipped); every ``pin`` entry
restricts its guest further (the allowed nodes are the intersection); ``affinity`` and
``anti_affinity`` rules are hard unless ``hard: false``; ``ignore`` keeps a guest where it is.
Unknown keys are ignored, as proxlb-solver does (each is listed in ``Scenario.notes``).

The opendrs cluster's usage mode, balance source and resource weights are the scenario's
``balancing.method`` (:func:`~.metric.balance_metric`); ``cpu_usage`` is the measured CPU use,
checked (dynamic mode) against cores × ``cpu_overcommit`` as the vCPUs are — proxlb-solver's only
CPU limit (``Settings.measured_overcommit``), not the cores alone; containers may move by restart
and local disks may be copied. ``evacuate_node`` puts that node in maintenance. Node reserves become
node reserves. **Storage**: proxlb-solver takes a node's *free* space as its capacity, so guests
that already sit on a pool count twice and a valid state turns infeasible (three 40 GB containers on
a node with 50 GB free). opendrs's capacity of a pool is what it really is: ``storage_free`` plus
what the node's own guests use there, less the reserve.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from operator import attrgetter
from pathlib import Path
from types import MappingProxyType
from typing import Any

from opendrs.engine.objective import PROXLB_METHODS, USAGES
from opendrs.model.cluster import Cluster, Disk, Guest, Node, Pressure, Settings
from opendrs.model.document import (
    Reader,
    collector_paused,
    describe,
    key_set,
    parse,
    read_file,
    render_path,
)
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.model.snapshot import MAX_BYTES, MAX_CORES, MAX_RATIO, MIN_NODE_CORES, SnapshotError

from .metric import balance_metric
from .scenario import (
    LOADER_WEIGHTS,
    Balancing,
    Expect,
    ProxlbNode,
    ProxlbRule,
    ProxlbVM,
    Scenario,
)

__all__ = ["is_proxlb_scenario", "load_scenario", "loads_scenario", "scenario_from_dict"]

GIB = 1024**3
#: Largest size in GiB (8 PiB, as in snapshots) and largest w_balance / w_stickiness.
MAX_GIB = MAX_BYTES // GIB
MAX_WEIGHT = 10**6

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
#: What every VM without disks shares.
_NO_DISKS: Mapping[str, int] = MappingProxyType({})


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
        if allowed is not None and not mapping.keys() <= key_set(tuple(allowed)):
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
        if type(value) is str and value:  # the common case, before the slower checks
            return value
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            self.fail(path, f"expected a name, got {describe(value)}")
        return str(value)

    def amount(
        self, value: object, path: PathT, *, above: bool = False, maximum: float = MAX_RATIO
    ) -> float:
        """A finite number ≥ 0 (> 0 when ``above``), at most ``maximum`` (physically sensible:
        :data:`MAX_CORES` for cores, :data:`MAX_GIB` for GiB, 100 for pressures, else 1000)."""
        kind = type(value)
        if (
            (kind is int or kind is float)
            and 0 <= value <= maximum  # type: ignore[operator]
            and value <= 1e15  # type: ignore[operator]
            and (value > 0 or not above)  # type: ignore[operator]
        ):
            return value  # type: ignore[return-value]
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
        if mode not in USAGES:
            self.fail((*path, "mode"), f"unknown mode {mode!r} (known: {', '.join(USAGES)})")
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
            out.append(self.vm(name, value, node_names, tags))
        return out, tags

    def vm(
        self, name: str, value: object, node_names: set[str], tags: dict[str, list[str]]
    ) -> ProxlbVM:
        """One VM; its tags go to ``tags[name]``."""
        path: PathT = ("vms", name)
        vd = self.mapping(value, path, _VM_KEYS)
        node = self.name(self.require(vd, "node", path), (*path, "node"))
        if node not in node_names:
            self.fail((*path, "node"), f"unknown node {node!r}")
        cpu = self.cores(self.require(vd, "cpu", path), (*path, "cpu"))
        kind = self.optional(vd, "type", path, self.name, "vm")
        if kind not in ("vm", "ct"):
            self.fail((*path, "type"), f"expected 'vm' or 'ct', got {kind!r}")
        tag_list = self.optional(vd, "tags", path, self.sequence, ())
        tags[name] = [self.name(t, (*path, "tags", i)) for i, t in enumerate(tag_list)]
        memory = self.gib(self.require(vd, "memory_gb", path), (*path, "memory_gb"))
        cpu_usage = float(self.optional(vd, "cpu_usage", path, self.cores, float(cpu)))
        pressures = [
            float(self.optional(vd, key, path, self.percent, 0.0))
            for key in ("cpu_pressure", "memory_pressure", "io_pressure")
        ]
        disks = self.gib_map(vd.get("disks"), (*path, "disks"))
        return ProxlbVM(
            name=name,
            node=node,
            cpu=cpu,
            memory=memory,
            cpu_usage=cpu_usage,
            cpu_pressure=pressures[0],
            memory_pressure=pressures[1],
            io_pressure=pressures[2],
            disks=MappingProxyType(disks) if disks else _NO_DISKS,
            priority=self.optional(vd, "priority", path, self.priority, 2),
            type=kind,
        )

    def priority(self, value: object, path: PathT) -> int:
        return self.count(value, path, maximum=3)

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
        tag_aff, tag_anti, tag_pins = self.tag_rules(vms, tags, node_names)
        affinity += tag_aff
        anti_affinity += tag_anti
        pins += tag_pins

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
        return Scenario(
            name=name,
            path=self.filename,
            cluster=cluster,
            options=MappingProxyType(_optimal_options(balancing)),
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

    def tag_rules(
        self, vms: list[ProxlbVM], tags: Mapping[str, Sequence[str]], node_names: set[str]
    ) -> tuple[list[ProxlbRule], list[ProxlbRule], list[tuple[str, tuple[str, ...]]]]:
        """The rules the guests' tags make: ``plb_affinity_*`` / ``plb_anti_affinity_*`` shared
        by ≥ 2 guests, ``plb_pin_<node>`` sets (a tag naming no node is skipped, with a note)."""
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
        return (
            [ProxlbRule(t, tuple(m)) for t, m in tag_aff.items() if len(m) > 1],
            [ProxlbRule(t, tuple(m)) for t, m in tag_anti.items() if len(m) > 1],
            [(vm, tuple(sorted(s))) for vm, s in tag_pins.items() if s],
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
        opendrs_nodes = _opendrs_nodes(nodes, node_extra, vms, evacuate)
        guests = tuple(_opendrs_guest(vm) for vm in vms)
        guest_rules = self.guest_rules(affinity, anti_affinity, vm_names)
        node_rules = self.pin_rules(pins, vm_names, {n.name for n in nodes})
        settings = self.settings(balancing, vms)
        rules = Rules(node_rules, tuple(guest_rules), frozenset(v for v in ignore if v in vm_names))
        return Cluster(opendrs_nodes, guests, rules, settings, name)

    def guest_rules(
        self, affinity: list[ProxlbRule], anti_affinity: list[ProxlbRule], vm_names: set[str]
    ) -> list[GuestAffinity]:
        """The guest-affinity rules: guests the cluster lacks are skipped (proxlb-solver does the
        same, with a note here); a rule left with fewer than two guests does nothing. A name
        used twice gets ``#2``, ``#3``, …"""
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
        return guest_rules

    def pin_rules(
        self, pins: list[tuple[str, tuple[str, ...]]], vm_names: set[str], node_names: set[str]
    ) -> tuple[NodeAffinity, ...]:
        """A strict node affinity per pinned guest, to the nodes all its pins allow (pins of
        unknown guests are skipped, with a note)."""
        allowed: dict[str, set[str]] = {}
        for vm, pin_nodes in pins:
            if vm not in vm_names:
                self.notes.append(f"pin of unknown guest {vm} skipped")
                continue
            known = {n for n in pin_nodes if n in node_names}
            allowed[vm] = allowed[vm] & known if vm in allowed else known
        return tuple(
            NodeAffinity(f"pin {vm}", (vm,), {n: 0 for n in sorted(nodes_)}, strict=True)
            for vm, nodes_ in sorted(allowed.items())
        )

    def settings(self, balancing: Balancing, vms: list[ProxlbVM]) -> Settings:
        """The cluster's settings: the balancing method as opendrs balances it
        (:func:`balance_metric`, with a note where that is only close), proxlb-solver's limits."""
        has_pressure = {
            resource: any(pressure(vm) * vm.priority > 0 for vm in vms)
            for resource, pressure in (
                (name, attrgetter(f"{name}_pressure")) for name in ("cpu", "memory", "io")
            )
        }
        metric = balance_metric(balancing, has_pressure)
        if metric.note is not None:
            self.notes.append(f"balancing.method {balancing.method}: {metric.note}")
        return Settings(
            mode=metric.mode,
            weight_cpu=metric.weight_cpu,
            weight_memory=metric.weight_memory,
            balance_source=metric.source,
            cpu_overcommit=balancing.cpu_overcommit,
            memory_overcommit=1.0,
            measured_overcommit=True,
            allow_restart_migration=True,
            allow_local_disks=True,
            min_uptime=0,
            max_parallel=balancing.max_parallel_migrations or max(1, len(vms)),
            max_node_inflow=balancing.max_node_inflow,
        )


def _optimal_options(balancing: Balancing) -> dict[str, Any]:
    """The options of ``optimal`` for the scenario: its balancing, proxlb-solver's strictness."""
    return {
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


def _opendrs_nodes(
    nodes: list[ProxlbNode],
    node_extra: dict[str, dict[str, Any]],
    vms: list[ProxlbVM],
    evacuate: str | None,
) -> tuple[Node, ...]:
    """The nodes, their local storage the free space plus what their guests' disks use, less
    reserves; the node to evacuate in maintenance."""
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
    return tuple(opendrs_nodes)


def _opendrs_guest(vm: ProxlbVM) -> Guest:
    return Guest(
        id=vm.name,
        node=vm.node,
        kind="ct" if vm.type == "ct" else "vm",
        cpu=vm.cpu,
        memory=vm.memory,
        disks=tuple(Disk(pool, size) for pool, size in sorted(vm.disks.items()))
        if vm.disks
        else (),
        cpu_used=vm.cpu_usage,
        pressure=Pressure(cpu=vm.cpu_pressure, memory=vm.memory_pressure, io=vm.io_pressure),
        tags=(),
        priority=vm.priority,
    )


def scenario_from_dict(
    data: object, *, filename: str = "<dict>", name: str | None = None
) -> Scenario:
    """Validate a parsed scenario and build it. Raises :class:`SnapshotError`, nothing else."""
    default = name if name is not None else Path(filename).stem or "scenario"
    try:
        with collector_paused():
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
    document = parse(data, filename=filename, fmt="yaml")
    del data  # the bytes are not kept while the scenario is built
    return scenario_from_dict(document, filename=filename)
