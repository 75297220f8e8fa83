"""The snapshot file format: a cluster written by hand, in YAML or JSON — load, validate, dump.

A snapshot holds nodes, guests, rules and settings (see ``docs/snapshot-format.md`` for the
user-facing description). Both syntaxes share one schema: files ending in ``.json`` are parsed with
:mod:`json`, everything else with ``yaml.safe_load`` semantics (plus a check for duplicate keys).

Every problem with the input — an unreadable file, bytes that are not UTF-8, broken syntax, a
wrong type, an unknown key, a reference to a node or guest that does not exist — is reported as a
:class:`SnapshotError` whose ``str()`` is one line, ``FILE: PATH: REASON``; no other exception
escapes :func:`load`, :func:`loads` or :func:`from_dict`.

Paths follow the shape of the document: mappings are walked with ``.`` (``nodes.pve1.cpu``,
``settings.reserve.memory``), lists with a 0-based index (``guests[3].memory``, ``rules[0].nodes``);
keys that are not plain words are quoted (``nodes["pve1.example.com"]``).

:func:`dumps` is canonical: equal clusters give the same text, fields equal to their defaults are
left out, and ``from_dict(to_dict(c)) == c`` for every cluster that :func:`from_dict` can return.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import PurePath
from typing import Any, Final, Literal

import yaml

from opendrs.model.cluster import (
    BALANCE_SOURCES,
    GUEST_KINDS,
    GUEST_STATES,
    HA_STATES,
    USAGE_MODES,
    Cluster,
    Disk,
    Guest,
    Node,
    NodeLimit,
    Pressure,
    Settings,
)
from opendrs.model.document import (
    MAX_BYTES,
    MAX_FILE_BYTES,
    MAX_ID,
    MAX_NUMBER,
    DocumentError,
    Path,
    Reader,
    clip,
    collector_paused,
    describe,
    parse,
    read_file,
    render_path,
)
from opendrs.model.rules import ORIGINS, GuestAffinity, NodeAffinity, Origin, Rules, avoiding
from opendrs.model.units import format_duration

__all__ = [
    "FORMAT_VERSION",
    "MAX_BYTES",
    "MAX_CORES",
    "MAX_FILE_BYTES",
    "MAX_NUMBER",
    "MAX_RATIO",
    "RULE_TYPES",
    "SnapshotError",
    "dump",
    "dumps",
    "from_dict",
    "load",
    "load_demo",
    "loads",
    "to_dict",
]

#: The version this module reads and writes.
FORMAT_VERSION: Final = 1
#: The rule types, in the order :func:`to_dict` writes them.
RULE_TYPES: Final = ("node-affinity", "pin", "affinity", "anti-affinity", "ignore")

# Physically sensible ranges: a value outside them is a mistake in the file, refused when read,
# not a number for a strategy to choke on. Sizes are bounded by MAX_BYTES (8 PiB).
#: Most cores a node has, or a guest is configured with, uses, or a node keeps in reserve.
MAX_CORES: Final = 100_000
#: Fewest cores a node has: a load divided by its capacity stays a sensible number.
MIN_NODE_CORES: Final = 0.01
#: Largest overcommit ratio, resource weight and migration cost factor.
MAX_RATIO: Final = 1000
#: Smallest overcommit ratio (below 1, a node carries less than it has).
MIN_OVERCOMMIT: Final = 0.01
#: Longest ``min_uptime``, in seconds (a year).
MAX_MIN_UPTIME: Final = 365 * 86400
#: Smallest migration ``cost_unit``, in bytes.
MIN_COST_UNIT: Final = 1024**2

log = logging.getLogger(__name__)

_DEFAULT_NAME: Final = "cluster"
_PRESSURE_KEYS: Final = ("cpu", "memory", "io", "memory_full", "io_full")
_TOP_KEYS: Final = (
    "version",
    "name",
    "settings",
    "storage",
    "nodes",
    "guests",
    "rules",
    "ha_auto_rebalance",
)
_SETTINGS_KEYS: Final = (
    "mode",
    "balance_source",
    "cpu_overcommit",
    "memory_overcommit",
    "reserve",
    "allow_restart_migration",
    "allow_local_disks",
    "min_uptime",
    "weights",
    "migration",
)
_MIGRATION_KEYS: Final = ("max_parallel", "max_node_inflow", "cost_unit", "cost_disk_factor")
_NODE_KEYS: Final = (
    "cpu",
    "memory",
    "arch",
    "online",
    "maintenance",
    "tags",
    "storage",
    "reserve",
    "usage",
    "pressure",
    "ksm",
)
_GUEST_KEYS: Final = (
    "id",
    "name",
    "kind",
    "node",
    "state",
    "cpu",
    "memory",
    "disks",
    "usage",
    "pressure",
    "devices",
    "uptime",
    "lock",
    "ha",
    "ha_state",
    "failback",
    "tags",
    "priority",
    "migrating_to",
    "arch",
    "limits",
)
_RULE_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "node-affinity": ("type", "name", "guests", "nodes", "strict", "affinity", "origin"),
    "pin": ("type", "name", "guests", "nodes", "origin"),
    "affinity": ("type", "name", "guests", "hard", "origin"),
    "anti-affinity": ("type", "name", "guests", "hard", "origin"),
    "ignore": ("type", "guests", "reason"),
}
#: Top-level keys of a proxlb-solver scenario, a different format (see compat/proxlb).
_PROXLB_KEYS: Final = frozenset({"vms", "balancing", "constraints", "expect", "evacuate_node"})
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_BINARY_UNITS: Final = (
    ("PiB", 1024**5),
    ("TiB", 1024**4),
    ("GiB", 1024**3),
    ("MiB", 1024**2),
    ("KiB", 1024),
)


# --------------------------------------------------------------------------------------------
# Errors


#: A snapshot that cannot be read: ``str()`` is one line, ``FILE: PATH: REASON``.
SnapshotError = DocumentError


def load(path: str | os.PathLike[str]) -> Cluster:
    """Read a snapshot file (``.json``: JSON, anything else: YAML) into a :class:`Cluster`.

    The cluster's name is the document's ``name``, or else the file name without its suffix.
    Raises :class:`SnapshotError` — and nothing else — for any problem with the file.
    """
    filename, data = read_file(path)
    document = parse(data, filename=filename)
    del data  # the bytes are not kept while the cluster is built
    return from_dict(document, filename=filename)


def loads(text: str | bytes, *, filename: str = "<string>", fmt: str | None = None) -> Cluster:
    """Parse a snapshot from text (bytes are decoded as UTF-8).

    ``fmt`` is ``"yaml"`` or ``"json"``; by default it follows ``filename``'s suffix. ``filename``
    names the source in error messages and gives the default cluster name.
    """
    return from_dict(parse(text, filename=filename, fmt=fmt), filename=filename)


def from_dict(data: object, *, filename: str = "<dict>") -> Cluster:
    """Validate a parsed document (plain dicts, lists and scalars) and build the cluster.

    Raises :class:`SnapshotError` for the first problem found, and no other exception.
    """
    try:
        with collector_paused():
            return SnapshotReader(filename).cluster(data)
    except SnapshotError:
        raise
    except RecursionError:
        raise SnapshotError(filename, "", "the document is nested too deeply") from None
    except MemoryError:
        raise SnapshotError(filename, "", "the document is too large to load") from None
    except Exception as exc:  # last line of defence: bad input never escapes as another error
        raise SnapshotError(
            filename, "", f"internal error while reading the snapshot ({type(exc).__name__}: {exc})"
        ) from exc


@dataclass(frozen=True, slots=True)
class Refused:
    """A value of a cluster that the snapshot format refuses: the node (by name) or guest (by
    id), the key in it as a snapshot writes it (``memory``, ``usage.cpu``, ``disks[0].size``;
    ``name`` or ``id`` for one listed twice), and the reader's reason."""

    kind: Literal["node", "guest"]
    name: str
    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.key}: {self.reason}"


def refused(cluster: Cluster) -> Refused | None:
    """The first value of ``cluster``'s nodes and guests that the snapshot format refuses, or
    None — by the snapshot reader's own rules: they are written as a snapshot and read back.

    For a cluster a backend observed (its settings and rules are checked where they are read).
    A node or guest listed twice is refused; an offline node whose size the platform does not
    report (0 cores and 0 bytes, which no placement uses) is not checked for its size.
    """
    seen: set[str] = set()
    for guest in cluster.guests:
        if guest.id in seen:
            return Refused("guest", guest.id, "id", "the guest is listed twice")
        seen.add(guest.id)
    nodes: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        if node.name in nodes:
            return Refused("node", node.name, "name", "the node is listed twice")
        unknown = not node.online and node.cpu == 0 and node.memory == 0
        nodes[node.name] = _node_out(replace(node, cpu=1.0, memory=1) if unknown else node)
    document = {
        "version": FORMAT_VERSION,
        "nodes": nodes,
        "guests": [_guest_out(guest) for guest in cluster.guests],
    }
    try:
        with collector_paused():
            SnapshotReader("<observation>").cluster(document)
    except DocumentError as exc:
        parts = exc.parts
        if len(parts) >= 2 and parts[0] == "guests" and isinstance(parts[1], int):
            guest = cluster.guests[parts[1]].id
            return Refused("guest", guest, render_path(parts[2:]) or "id", exc.reason)
        if len(parts) >= 2 and parts[0] == "nodes":
            return Refused("node", str(parts[1]), render_path(parts[2:]) or "name", exc.reason)
        raise
    return None


def load_demo() -> Cluster:
    """The built-in demo cluster (``opendrs/data/demo.yaml``)."""
    resource = resources.files("opendrs") / "data" / "demo.yaml"
    return loads(resource.read_bytes(), filename="demo.yaml")


# --------------------------------------------------------------------------------------------
# Validation


def _default_name(filename: str) -> str:
    """The file stem, or ``cluster`` for pseudo names such as ``<string>``."""
    if filename.startswith("<") and filename.endswith(">"):
        return _DEFAULT_NAME
    stem = PurePath(filename).stem
    return stem if stem and stem.isprintable() else _DEFAULT_NAME


class SnapshotReader(Reader):
    """Walks a snapshot document, checking it field by field and building model objects."""

    def pressure(self, value: object, path: Path) -> Pressure:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _PRESSURE_KEYS)
        fields = {
            key: self.number(mapping[key], (*path, key), maximum=100.0)
            for key in _PRESSURE_KEYS
            if key in mapping
        }
        return Pressure(**fields)

    def cpu_memory(self, value: object, path: Path) -> tuple[float | None, int | None]:
        """A ``{cpu: cores, memory: size}`` mapping, either key optional."""
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, ("cpu", "memory"))
        cpu = mapping.get("cpu")
        memory = mapping.get("memory")
        return (
            None if cpu is None else self.number(cpu, (*path, "cpu"), maximum=MAX_CORES),
            None if memory is None else self.size(memory, (*path, "memory")),
        )

    # -- document ---------------------------------------------------------------------------

    def cluster(self, data: object) -> Cluster:
        if data is None:
            self.fail((), "the snapshot is empty (it needs at least `version: 1` and `nodes`)")
        if not isinstance(data, Mapping):
            self.fail((), f"expected a mapping at the top level, got {describe(data)}")
        doc = self.mapping(data, ())
        if "version" in doc:
            self.version(doc["version"])
        hint = ""
        if _PROXLB_KEYS.intersection(k for k in doc if isinstance(k, str)):
            hint = "; this looks like a proxlb-solver scenario, which is a different format"
        self.check_keys(doc, (), _TOP_KEYS, hint)
        self.version(self.require(doc, "version", ()))
        name = doc.get("name")
        cluster_name = (
            _default_name(self.filename)
            if name is None
            else self.plain_name(name, ("name",), allow_int=True)
        )
        settings = self.settings(doc.get("settings"), ("settings",))
        shared = self.storage(doc.get("storage"), ("storage",))
        nodes = self.nodes(self.require(doc, "nodes", ()), ("nodes",), shared)
        self.check_reserves(nodes, settings)
        node_names = {node.name: node for node in nodes}
        guests_value = doc.get("guests")
        guests = () if guests_value is None else self.guests(guests_value, node_names, shared)
        rules_value = doc.get("rules")
        guest_ids = {guest.id for guest in guests}
        rules = Rules() if rules_value is None else self.rules(rules_value, node_names, guest_ids)
        balancing = doc.get("ha_auto_rebalance")
        ha_auto_rebalance = (
            False if balancing is None else self.boolean(balancing, ("ha_auto_rebalance",))
        )
        return Cluster(nodes, guests, rules, settings, cluster_name, ha_auto_rebalance)

    def version(self, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(("version",), f"expected the number {FORMAT_VERSION}, got {describe(value)}")
        if value != FORMAT_VERSION:
            self.fail(
                ("version",),
                f"unsupported version {describe(value)} (this opendrs reads version "
                f"{FORMAT_VERSION})",
            )

    def settings(self, value: object, path: Path) -> Settings:
        if value is None:
            return Settings()
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _SETTINGS_KEYS)
        fields: dict[str, Any] = {}
        if "mode" in mapping:
            fields["mode"] = self.choice(mapping["mode"], (*path, "mode"), USAGE_MODES)
        if "balance_source" in mapping:
            fields["balance_source"] = self.choice(
                mapping["balance_source"], (*path, "balance_source"), BALANCE_SOURCES
            )
        for key in ("cpu_overcommit", "memory_overcommit"):
            if key in mapping:
                fields[key] = self.number(
                    mapping[key], (*path, key), positive=True, maximum=MAX_RATIO
                )
                if fields[key] < MIN_OVERCOMMIT:
                    self.fail(
                        (*path, key),
                        f"must be at least {MIN_OVERCOMMIT:g}, got {describe(mapping[key])}",
                    )
        if "reserve" in mapping:
            cpu, memory = self.cpu_memory(mapping["reserve"], (*path, "reserve"))
            if cpu is not None:
                fields["reserve_cpu"] = cpu
            if memory is not None:
                fields["reserve_memory"] = memory
        for key in ("allow_restart_migration", "allow_local_disks"):
            if key in mapping:
                fields[key] = self.boolean(mapping[key], (*path, key))
        if "migration" in mapping:
            mpath = (*path, "migration")
            migration = self.mapping(mapping["migration"], mpath)
            self.check_keys(migration, mpath, _MIGRATION_KEYS)
            for key in ("max_parallel", "max_node_inflow"):
                if key in migration:
                    fields[key] = self.integer(
                        migration[key], (*mpath, key), minimum=1, maximum=100_000
                    )
            if "cost_unit" in migration:
                fields["cost_unit"] = self.size(
                    migration["cost_unit"], (*mpath, "cost_unit"), positive=True
                )
                if fields["cost_unit"] < MIN_COST_UNIT:
                    self.fail(
                        (*mpath, "cost_unit"),
                        f"must be at least 1MiB, got {describe(migration['cost_unit'])}",
                    )
            if "cost_disk_factor" in migration:
                key = "cost_disk_factor"
                fields[key] = self.number(migration[key], (*mpath, key), maximum=MAX_RATIO)
        if "min_uptime" in mapping:
            fields["min_uptime"] = self.duration(
                mapping["min_uptime"], (*path, "min_uptime"), maximum=MAX_MIN_UPTIME
            )
        if "weights" in mapping:
            wpath = (*path, "weights")
            weights = self.mapping(mapping["weights"], wpath)
            self.check_keys(weights, wpath, ("cpu", "memory"))
            defaults = Settings()
            cpu_weight = (
                self.number(weights["cpu"], (*wpath, "cpu"), maximum=MAX_RATIO)
                if "cpu" in weights
                else defaults.weight_cpu
            )
            memory_weight = (
                self.number(weights["memory"], (*wpath, "memory"), maximum=MAX_RATIO)
                if "memory" in weights
                else defaults.weight_memory
            )
            if cpu_weight == 0 and memory_weight == 0:
                self.fail(wpath, "the cpu and memory weights must not both be 0")
            fields["weight_cpu"] = cpu_weight
            fields["weight_memory"] = memory_weight
        return Settings(**fields)

    def storage(self, value: object, path: Path) -> frozenset[str]:
        """The catalogue of pools: the names of the shared ones."""
        if value is None:
            return frozenset()
        shared: set[str] = set()
        for name, item, ppath in self.name_map(value, path, "pool"):
            pool = {} if item is None else self.mapping(item, ppath)
            self.check_keys(pool, ppath, ("shared",))
            if "shared" in pool and self.boolean(pool["shared"], (*ppath, "shared")):
                shared.add(name)
        return frozenset(shared)

    def nodes(self, value: object, path: Path, shared: frozenset[str]) -> tuple[Node, ...]:
        if isinstance(value, list):
            self.fail(path, "expected a mapping of node name to node (pve1: {cpu: …}), got a list")
        entries = self.name_map(value, path, "node name")
        if not entries:
            self.fail(path, "a snapshot needs at least one node")
        return tuple(self.node(name, item, npath, shared) for name, item, npath in entries)

    def node(self, name: str, value: object, path: Path, shared: frozenset[str]) -> Node:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _NODE_KEYS)
        fields: dict[str, Any] = {
            "name": name,
            "cpu": self.number(
                self.require(mapping, "cpu", path), (*path, "cpu"), positive=True, maximum=MAX_CORES
            ),
            "memory": self.size(
                self.require(mapping, "memory", path), (*path, "memory"), positive=True
            ),
        }
        if fields["cpu"] < MIN_NODE_CORES:
            self.fail(
                (*path, "cpu"),
                f"must be at least {MIN_NODE_CORES:g} cores, got {describe(mapping['cpu'])}",
            )
        if "arch" in mapping:
            fields["arch"] = self.text(mapping["arch"], (*path, "arch"))
        for key in ("online", "maintenance"):
            if key in mapping:
                fields[key] = self.boolean(mapping[key], (*path, key))
        if "tags" in mapping:
            fields["tags"] = self.text_list(mapping["tags"], (*path, "tags"))
        if "storage" in mapping:
            capacity: dict[str, int] = {}
            for pool, size, spath in self.name_map(mapping["storage"], (*path, "storage"), "pool"):
                if pool in shared:
                    self.fail(spath, f"pool {describe(pool)} is shared; list only local pools here")
                capacity[pool] = self.size(size, spath)
            fields["storage"] = capacity
        if "reserve" in mapping:
            cpu, memory = self.cpu_memory(mapping["reserve"], (*path, "reserve"))
            fields["reserve_cpu"] = cpu
            fields["reserve_memory"] = memory
        if "usage" in mapping:
            cpu, memory = self.cpu_memory(mapping["usage"], (*path, "usage"))
            fields["base_cpu"] = 0.0 if cpu is None else cpu
            fields["base_memory"] = 0 if memory is None else memory
        if "pressure" in mapping:
            fields["pressure"] = self.pressure(mapping["pressure"], (*path, "pressure"))
        if "ksm" in mapping:
            fields["ksm_shared"] = self.size(mapping["ksm"], (*path, "ksm"))
        return Node(**fields)

    def guests(
        self, value: object, nodes: Mapping[str, Node], shared: frozenset[str]
    ) -> tuple[Guest, ...]:
        path: Path = ("guests",)
        if isinstance(value, Mapping):
            self.fail(path, "expected a list of guests (- id: 101 …), got a mapping")
        items = self.sequence(value, path)
        guests: list[Guest] = []
        first_at: dict[str, int] = {}
        for index, item in enumerate(items):
            guest = self.guest(item, ("guests", index), nodes, shared)
            if guest.id in first_at:
                self.fail(
                    ("guests", index, "id"),
                    f"duplicate guest id {describe(guest.id)} (also guests[{first_at[guest.id]}])",
                )
            first_at[guest.id] = index
            guests.append(guest)
        return tuple(guests)

    def check_reserves(self, nodes: tuple[Node, ...], settings: Settings) -> None:
        """Every node's reserve leaves it some capacity: less than its cores and its memory.

        A reserve that takes a whole node would leave a capacity of 0, and every load on it a
        fraction without a value; it is refused at the node's own ``reserve`` or, when the node
        takes the cluster default, at ``settings.reserve``.
        """
        for node in nodes:
            for key, own, capacity, default in (
                ("cpu", node.reserve_cpu, node.cpu, settings.reserve_cpu),
                ("memory", node.reserve_memory, node.memory, settings.reserve_memory),
            ):
                reserve = default if own is None else own
                if reserve < capacity:
                    continue
                where: Path = ("settings", "reserve", key)
                if own is not None:
                    where = ("nodes", node.name, "reserve", key)
                if key == "cpu":
                    has, kept = f"{_num(capacity)} cores", f"{_num(reserve)}"
                else:
                    has, kept = str(_size_out(int(capacity))), str(_size_out(int(reserve)))
                self.fail(
                    where,
                    f"must be less than the node's {key} (node {describe(node.name)} has {has}), "
                    f"got {kept}",
                )

    def node_ref(self, value: object, path: Path, nodes: Mapping[str, Node]) -> str:
        name = self.text(value, path, allow_int=True)
        if name not in nodes:
            self.fail(path, f"unknown node {describe(name)}{_suggest(name, nodes)}")
        return name

    def guest(
        self, value: object, path: Path, nodes: Mapping[str, Node], shared: frozenset[str]
    ) -> Guest:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _GUEST_KEYS)
        has = mapping.__contains__

        def at(key: str) -> Path:
            return (*path, key)

        guest_id = self.plain_name(self.require(mapping, "id", path), at("id"), allow_int=True)
        fields: dict[str, Any] = {"id": guest_id}
        if has("name") and mapping["name"] is not None:
            fields["name"] = self.text(mapping["name"], at("name"), allow_int=True)
        if has("kind"):
            fields["kind"] = self.choice(mapping["kind"], at("kind"), GUEST_KINDS)
        node = self.node_ref(self.require(mapping, "node", path), at("node"), nodes)
        fields["node"] = node
        if has("state"):
            fields["state"] = self.choice(mapping["state"], at("state"), GUEST_STATES)
        if has("cpu"):
            fields["cpu"] = self.number(mapping["cpu"], at("cpu"), positive=True, maximum=MAX_CORES)
        # A stopped container without a memory limit has no size (Incus): 0 is its memory.
        sizeless = fields.get("kind") == "ct" and fields.get("state") == "stopped"
        fields["memory"] = self.size(
            self.require(mapping, "memory", path), at("memory"), positive=not sizeless
        )
        if has("disks"):
            fields["disks"] = self.disks(mapping["disks"], at("disks"), shared)
        if has("usage"):
            cpu_used, memory_used = self.cpu_memory(mapping["usage"], at("usage"))
            fields["cpu_used"] = cpu_used
            fields["memory_used"] = memory_used
        if has("pressure"):
            fields["pressure"] = self.pressure(mapping["pressure"], at("pressure"))
        if has("devices"):
            fields["devices"] = self.text_list(mapping["devices"], at("devices"))
        if has("uptime"):
            fields["uptime"] = self.duration(mapping["uptime"], at("uptime"))
        if has("lock"):
            fields["lock"] = self.optional_text(mapping["lock"], at("lock"))
        ha = self.boolean(mapping["ha"], at("ha")) if has("ha") else False
        fields["ha"] = ha
        if has("ha_state") and mapping["ha_state"] is not None:
            if not ha:
                self.fail(at("ha_state"), "only HA-managed guests have an HA state (set ha: true)")
            fields["ha_state"] = self.choice(mapping["ha_state"], at("ha_state"), HA_STATES)
        if has("failback"):
            if not ha:
                self.fail(at("failback"), "only HA-managed guests have failback (set ha: true)")
            fields["failback"] = self.boolean(mapping["failback"], at("failback"))
        if has("tags"):
            fields["tags"] = self.text_list(mapping["tags"], at("tags"))
        if has("priority"):
            fields["priority"] = self.integer(
                mapping["priority"], at("priority"), minimum=1, maximum=3
            )
        if has("migrating_to") and mapping["migrating_to"] is not None:
            target = self.node_ref(mapping["migrating_to"], at("migrating_to"), nodes)
            if target == node:
                self.fail(at("migrating_to"), f"the guest is already on {describe(node)}")
            fields["migrating_to"] = target
        if has("arch"):
            fields["arch"] = self.optional_text(mapping["arch"], at("arch"))
        if has("limits"):
            fields["limits"] = self.node_limits(mapping["limits"], at("limits"), nodes, node)
        return Guest(**fields)

    def node_limits(
        self, value: object, path: Path, nodes: Mapping[str, Node], node: str
    ) -> tuple[NodeLimit, ...]:
        """A guest's ``limits``: ``[{nodes: [...], reason: TEXT}]`` (its own node is added)."""
        limits: list[NodeLimit] = []
        for index, item in enumerate(self.sequence(value, path)):
            lpath = (*path, index)
            limit = self.mapping(item, lpath)
            self.check_keys(limit, lpath, ("nodes", "reason"))
            names = self.sequence(self.require(limit, "nodes", lpath), (*lpath, "nodes"))
            allowed = {self.node_ref(n, (*lpath, "nodes", i), nodes) for i, n in enumerate(names)}
            reason = self.text(self.require(limit, "reason", lpath), (*lpath, "reason"))
            limits.append(NodeLimit(frozenset(allowed | {node}), reason))
        return tuple(limits)

    def disks(self, value: object, path: Path, shared: frozenset[str]) -> tuple[Disk, ...]:
        disks: list[Disk] = []
        for index, item in enumerate(self.sequence(value, path)):
            dpath = (*path, index)
            disk = self.mapping(item, dpath)
            self.check_keys(disk, dpath, ("pool", "size"))
            pool = self.text(self.require(disk, "pool", dpath), (*dpath, "pool"), allow_int=True)
            size = self.size(self.require(disk, "size", dpath), (*dpath, "size"))
            disks.append(Disk(pool, size, pool in shared))
        return tuple(disks)

    # -- rules ------------------------------------------------------------------------------

    def rules(
        self, value: object, nodes: Mapping[str, Node], guest_ids: set[str] | frozenset[str]
    ) -> Rules:
        node_rules: list[NodeAffinity] = []
        guest_rules: list[GuestAffinity] = []
        ignored: set[str] = set()
        reasons: dict[str, str] = {}
        names: dict[str, int] = {}
        counters = dict.fromkeys(RULE_TYPES, 0)
        for index, item in enumerate(self.sequence(value, ("rules",))):
            path: Path = ("rules", index)
            rule = self.mapping(item, path)
            kind = self.choice(self.require(rule, "type", path), (*path, "type"), RULE_TYPES)
            self.check_keys(rule, path, _RULE_KEYS[kind])
            counters[kind] += 1
            minimum = 2 if kind in ("affinity", "anti-affinity") else 1
            guests = self.rule_guests(self.require(rule, "guests", path), path, guest_ids, minimum)
            if kind == "ignore":
                ignored.update(guests)
                if "reason" in rule:
                    reason = self.text(rule["reason"], (*path, "reason"))
                    reasons.update(dict.fromkeys(guests, reason))
                continue
            name = self.rule_name(rule, index, kind, counters[kind], guests, names)
            origin: Origin = (
                self.choice(rule["origin"], (*path, "origin"), ORIGINS)  # type: ignore[assignment]
                if "origin" in rule
                else "config"
            )
            if kind in ("node-affinity", "pin"):
                negative = "affinity" in rule and (
                    self.choice(rule["affinity"], (*path, "affinity"), ("positive", "negative"))
                    == "negative"
                )
                # "Avoid these nodes" names nodes, not priorities (Proxmox refuses them).
                priorities = self.rule_nodes(
                    self.require(rule, "nodes", path), path, nodes, "avoid" if negative else kind
                )
                # A pin is strict by definition; a node affinity is strict only when asked.
                strict = kind == "pin" or (
                    "strict" in rule and self.boolean(rule["strict"], (*path, "strict"))
                )
                if not negative:
                    node_rules.append(NodeAffinity(name, guests, priorities, strict, origin))
                    continue
                kept = avoiding(name, guests, set(priorities), list(nodes), strict, origin)
                if kept is None:
                    log.warning(
                        "%s: rules[%d] (%s): a negative node affinity naming every node leaves "
                        "its guests none; the rule is not used, as Proxmox drops it",
                        self.filename,
                        index,
                        name,
                    )
                else:
                    node_rules.append(kept)
            else:
                hard = self.boolean(rule["hard"], (*path, "hard")) if "hard" in rule else True
                guest_rules.append(GuestAffinity(name, guests, kind == "affinity", hard, origin))
        return Rules(tuple(node_rules), tuple(guest_rules), frozenset(ignored), reasons)

    def rule_name(
        self,
        rule: Mapping[Any, Any],
        index: int,
        kind: str,
        count: int,
        guests: tuple[str, ...],
        names: dict[str, int],
    ) -> str:
        path: Path = ("rules", index)
        given = rule.get("name")
        if given is not None:
            name = self.text(given, (*path, "name"), allow_int=True)
            where: Path = (*path, "name")
        else:
            name = _generated_name(kind, count, guests)
            where = path
        if name in names:
            generated = "" if given is not None else "generated "
            self.fail(
                where,
                f"duplicate rule name: {generated}{describe(name)} is also the name of "
                f"rules[{names[name]}]" + ("" if given is not None else "; give this rule a name"),
            )
        names[name] = index
        return name

    def rule_guests(
        self, value: object, path: Path, guest_ids: set[str] | frozenset[str], minimum: int
    ) -> tuple[str, ...]:
        gpath = (*path, "guests")
        items = self.sequence(value, gpath)
        if len(items) < minimum:
            need = "at least two guests" if minimum == 2 else "at least one guest"
            self.fail(gpath, f"the rule needs {need}, got {len(items)}")
        out: list[str] = []
        seen: set[str] = set()
        for index, item in enumerate(items):
            ipath = (*gpath, index)
            guest_id = self.text(item, ipath, allow_int=True)
            if guest_id not in guest_ids:
                self.fail(ipath, f"unknown guest {describe(guest_id)}")
            if guest_id in seen:
                self.fail(ipath, f"guest {describe(guest_id)} is listed twice")
            seen.add(guest_id)
            out.append(guest_id)
        return tuple(out)

    def rule_nodes(
        self, value: object, path: Path, nodes: Mapping[str, Node], kind: str
    ) -> dict[str, int]:
        npath = (*path, "nodes")
        priorities: dict[str, int] = {}
        if isinstance(value, Mapping) and kind == "node-affinity":
            for name, priority, ppath in self.name_map(value, npath, "node"):
                self.node_ref(name, ppath, nodes)
                priorities[name] = self.integer(priority, ppath, minimum=0, maximum=MAX_ID)
        else:
            if isinstance(value, Mapping):
                what = "a pin" if kind == "pin" else "a negative node affinity"
                self.fail(npath, f"expected a list of node names ({what} has no priorities)")
            items = self.sequence(value, npath)
            for index, item in enumerate(items):
                name = self.node_ref(item, (*npath, index), nodes)
                if name in priorities:
                    self.fail((*npath, index), f"node {describe(name)} is listed twice")
                priorities[name] = 0
        if not priorities:
            self.fail(npath, "the rule needs at least one node")
        return priorities


def _generated_name(kind: str, count: int, guests: tuple[str, ...]) -> str:
    """The name of a rule that has none: ``pin-<guests>`` for pins, else ``<type>-<n>``."""
    if kind == "pin":
        return "pin-" + "-".join(guests)
    return f"{kind}-{count}"


def _suggest(name: str, known: Mapping[str, Any]) -> str:
    if len(known) > 1000:
        return ""
    close = difflib.get_close_matches(clip(name, 100), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --------------------------------------------------------------------------------------------
# Writing


def _num(value: float) -> int | float:
    """A number as written: whole numbers without ``.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def _size_out(size: int) -> int | str:
    """Bytes as written: ``8GiB`` when a binary unit divides the size exactly, else bytes."""
    if size > 0:
        for unit, factor in _BINARY_UNITS:
            if size % factor == 0:
                return f"{size // factor}{unit}"
    return size


def _duration_out(seconds: int) -> int | str:
    return format_duration(seconds) if seconds > 0 else 0


def _id_out(value: str) -> int | str:
    """An id or name as written: ``"101"`` becomes ``101``; anything else stays a string."""
    return int(value) if _CANONICAL_INT.fullmatch(value) else value


def _cpu_memory_out(cpu: float | None, memory: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cpu is not None:
        out["cpu"] = _num(cpu)
    if memory is not None:
        out["memory"] = _size_out(memory)
    return out


def _pressure_out(pressure: Pressure) -> dict[str, Any]:
    return {k: _num(getattr(pressure, k)) for k in _PRESSURE_KEYS if getattr(pressure, k) != 0}


def _settings_out(settings: Settings) -> dict[str, Any]:
    default = Settings()
    out: dict[str, Any] = {}
    if settings.mode != default.mode:
        out["mode"] = settings.mode
    if settings.balance_source != default.balance_source:
        out["balance_source"] = settings.balance_source
    for key in ("cpu_overcommit", "memory_overcommit"):
        if getattr(settings, key) != getattr(default, key):
            out[key] = _num(getattr(settings, key))
    reserve = _cpu_memory_out(
        settings.reserve_cpu if settings.reserve_cpu != default.reserve_cpu else None,
        settings.reserve_memory if settings.reserve_memory != default.reserve_memory else None,
    )
    if reserve:
        out["reserve"] = reserve
    for key in ("allow_restart_migration", "allow_local_disks"):
        if getattr(settings, key) != getattr(default, key):
            out[key] = getattr(settings, key)
    if settings.min_uptime != default.min_uptime:
        out["min_uptime"] = _duration_out(settings.min_uptime)
    weights: dict[str, Any] = {}
    if settings.weight_cpu != default.weight_cpu:
        weights["cpu"] = _num(settings.weight_cpu)
    if settings.weight_memory != default.weight_memory:
        weights["memory"] = _num(settings.weight_memory)
    if weights:
        out["weights"] = weights
    migration: dict[str, Any] = {}
    for key in ("max_parallel", "max_node_inflow"):
        if getattr(settings, key) != getattr(default, key):
            migration[key] = getattr(settings, key)
    if settings.cost_unit != default.cost_unit:
        migration["cost_unit"] = _size_out(settings.cost_unit)
    if settings.cost_disk_factor != default.cost_disk_factor:
        migration["cost_disk_factor"] = _num(settings.cost_disk_factor)
    if migration:
        out["migration"] = migration
    return out


def _shared_pools(cluster: Cluster) -> list[str]:
    """The shared pools used by guest disks, in order of first use; fails on ambiguous pools."""
    shared: dict[str, None] = {}
    local: set[str] = {pool for node in cluster.nodes for pool in node.storage}
    for guest in cluster.guests:
        for disk in guest.disks:
            if disk.shared:
                shared.setdefault(disk.pool)
            else:
                local.add(disk.pool)
    both = sorted(local.intersection(shared))
    if both:
        raise ValueError(
            f"pool {both[0]!r} is used both as a shared and as a local pool; a snapshot cannot "
            "express that"
        )
    return list(shared)


def _node_out(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu": _num(node.cpu), "memory": _size_out(node.memory)}
    if node.arch != "x86_64":
        out["arch"] = node.arch
    if not node.online:
        out["online"] = False
    if node.maintenance:
        out["maintenance"] = True
    if node.tags:
        out["tags"] = [_id_out(tag) for tag in node.tags]
    if node.storage:
        out["storage"] = {pool: _size_out(node.storage[pool]) for pool in sorted(node.storage)}
    reserve = _cpu_memory_out(node.reserve_cpu, node.reserve_memory)
    if reserve:
        out["reserve"] = reserve
    usage = _cpu_memory_out(
        node.base_cpu if node.base_cpu else None, node.base_memory if node.base_memory else None
    )
    if usage:
        out["usage"] = usage
    pressure = _pressure_out(node.pressure)
    if pressure:
        out["pressure"] = pressure
    if node.ksm_shared:
        out["ksm"] = _size_out(node.ksm_shared)
    return out


_DEFAULT_GUEST: Final = Guest(id="", node="")


def _guest_out(guest: Guest) -> dict[str, Any]:
    default = _DEFAULT_GUEST
    out: dict[str, Any] = {"id": _id_out(guest.id)}
    if guest.name:
        out["name"] = _id_out(guest.name)
    if guest.kind != default.kind:
        out["kind"] = guest.kind
    out["node"] = _id_out(guest.node)
    if guest.state != default.state:
        out["state"] = guest.state
    if guest.cpu != default.cpu:
        out["cpu"] = _num(guest.cpu)
    out["memory"] = _size_out(guest.memory)
    if guest.disks:
        out["disks"] = [{"pool": _id_out(d.pool), "size": _size_out(d.size)} for d in guest.disks]
    usage = _cpu_memory_out(guest.cpu_used, guest.memory_used)
    if usage:
        out["usage"] = usage
    pressure = _pressure_out(guest.pressure)
    if pressure:
        out["pressure"] = pressure
    if guest.devices:
        out["devices"] = [_id_out(device) for device in guest.devices]
    if guest.uptime:
        out["uptime"] = _duration_out(guest.uptime)
    if guest.lock is not None:
        out["lock"] = guest.lock
    if guest.ha:
        out["ha"] = True
    if guest.ha_state is not None:
        out["ha_state"] = guest.ha_state
    if guest.ha and not guest.failback:
        out["failback"] = False
    if guest.tags:
        out["tags"] = [_id_out(tag) for tag in guest.tags]
    if guest.priority != default.priority:
        out["priority"] = guest.priority
    if guest.migrating_to is not None:
        out["migrating_to"] = _id_out(guest.migrating_to)
    if guest.arch is not None:
        out["arch"] = guest.arch
    if guest.limits:
        out["limits"] = [
            {"nodes": [_id_out(n) for n in sorted(lim.nodes)], "reason": lim.reason}
            for lim in guest.limits
        ]
    return out


def _rules_out(cluster: Cluster) -> list[dict[str, Any]]:
    rules = cluster.rules
    node_order = cluster.node_index
    guest_order = cluster.guest_index
    out: list[dict[str, Any]] = []
    counters = dict.fromkeys(RULE_TYPES, 0)

    def named(rule: dict[str, Any], kind: str, name: str, guests: tuple[str, ...]) -> None:
        counters[kind] += 1
        if name != _generated_name(kind, counters[kind], guests):
            rule["name"] = _id_out(name)

    for affinity in rules.node_affinity:
        nodes = sorted(affinity.nodes, key=lambda n: (node_order.get(n, len(node_order)), n))
        guests = [_id_out(g) for g in affinity.guests]
        is_pin = affinity.strict and all(p == 0 for p in affinity.nodes.values())
        rule: dict[str, Any] = {"type": "pin" if is_pin else "node-affinity"}
        named(rule, rule["type"], affinity.name, affinity.guests)
        rule["guests"] = guests
        if all(p == 0 for p in affinity.nodes.values()):
            rule["nodes"] = [_id_out(n) for n in nodes]
        else:
            rule["nodes"] = {n: affinity.nodes[n] for n in nodes}
        if affinity.strict and not is_pin:
            rule["strict"] = True
        if affinity.origin != "config":
            rule["origin"] = affinity.origin
        out.append(rule)
    for group in rules.guest_affinity:
        kind = "affinity" if group.positive else "anti-affinity"
        rule = {"type": kind}
        named(rule, kind, group.name, group.guests)
        rule["guests"] = [_id_out(g) for g in group.guests]
        if not group.hard:
            rule["hard"] = False
        if group.origin != "config":
            rule["origin"] = group.origin
        out.append(rule)
    if rules.ignored:
        ignored = sorted(rules.ignored, key=lambda g: (guest_order.get(g, len(guest_order)), g))
        by_reason: dict[str | None, list[str]] = {}
        for gid in ignored:
            by_reason.setdefault(rules.ignore_reason(gid), []).append(gid)
        for reason, guests in sorted(by_reason.items(), key=lambda item: item[0] or ""):
            rule = {"type": "ignore", "guests": [_id_out(g) for g in guests]}
            if reason is not None:
                rule["reason"] = reason
            out.append(rule)
    return out


def to_dict(cluster: Cluster) -> dict[str, Any]:
    """The document for ``cluster``: plain dicts, lists and scalars, defaults left out.

    ``version``, ``name``, ``nodes`` and ``guests`` are always written. Raises :class:`ValueError`
    for a cluster the format cannot express (a pool used both as shared and as local).
    """
    out: dict[str, Any] = {"version": FORMAT_VERSION, "name": _id_out(cluster.name)}
    settings = _settings_out(cluster.settings)
    if settings:
        out["settings"] = settings
    shared = _shared_pools(cluster)
    if shared:
        out["storage"] = {pool: {"shared": True} for pool in shared}
    out["nodes"] = {node.name: _node_out(node) for node in cluster.nodes}
    out["guests"] = [_guest_out(guest) for guest in cluster.guests]
    rules = _rules_out(cluster)
    if rules:
        out["rules"] = rules
    if cluster.ha_auto_rebalance:
        out["ha_auto_rebalance"] = True
    return out


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key, and no anchors or aliases."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dumps(cluster: Cluster, fmt: str = "yaml") -> str:
    """The canonical text of ``cluster`` in ``fmt`` (``"yaml"`` or ``"json"``).

    Deterministic: equal clusters give identical text, and loading the text gives an equal
    cluster whose dump is byte-identical.
    """
    document = to_dict(cluster)
    if fmt == "json":
        # allow_nan=False: a number that is not finite (which no snapshot reads) is a ValueError,
        # never an ``Infinity`` that is not JSON.
        return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    if fmt == "yaml":
        return yaml.dump(
            document,
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=None,
            allow_unicode=True,
            width=100,
        )
    raise ValueError(f"unknown format {fmt!r} (use 'yaml' or 'json')")


def dump(cluster: Cluster, path: str | os.PathLike[str], fmt: str | None = None) -> None:
    """Write ``cluster`` to ``path`` (format from the suffix unless ``fmt`` is given), UTF-8."""
    filename = os.fsdecode(path)
    syntax = fmt or ("json" if filename.lower().endswith(".json") else "yaml")
    text = dumps(cluster, syntax)
    with open(filename, "w", encoding="utf-8", newline="\n") as stream:
        stream.write(text)
