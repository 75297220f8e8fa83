"""Writing a snapshot: a :class:`~opendrs.model.cluster.Cluster` as the canonical document and text.

:func:`dumps` is canonical: equal clusters give the same text, fields equal to their defaults are
left out, and reading :func:`to_dict`'s document gives back an equal cluster.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Final

import yaml

from opendrs.model.cluster import Cluster, Guest, Node, Pressure, Settings
from opendrs.model.snapshot.schema import FORMAT_VERSION, PRESSURE_KEYS, RULE_TYPES, generated_name
from opendrs.model.units import format_duration

_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_BINARY_UNITS: Final = (
    ("PiB", 1024**5),
    ("TiB", 1024**4),
    ("GiB", 1024**3),
    ("MiB", 1024**2),
    ("KiB", 1024),
)


def number_out(value: float) -> int | float:
    """A number as written: whole numbers without ``.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def size_out(size: int) -> int | str:
    """Bytes as written: ``8GiB`` when a binary unit divides the size exactly, else bytes — a
    size under 1 MiB with its unit (``1000B``), which a memory size written bare may not be."""
    if size > 0:
        for unit, factor in _BINARY_UNITS:
            if size % factor == 0:
                return f"{size // factor}{unit}"
        if size < 1024**2:
            return f"{size}B"
    return size


def _duration_out(seconds: int) -> int | str:
    return format_duration(seconds) if seconds > 0 else 0


def _id_out(value: str) -> int | str:
    """An id or name as written: ``"101"`` becomes ``101``; anything else stays a string."""
    return int(value) if _CANONICAL_INT.fullmatch(value) else value


def _cpu_memory_out(cpu: float | None, memory: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cpu is not None:
        out["cpu"] = number_out(cpu)
    if memory is not None:
        out["memory"] = size_out(memory)
    return out


def _pressure_out(pressure: Pressure) -> dict[str, Any]:
    return {k: number_out(getattr(pressure, k)) for k in PRESSURE_KEYS if getattr(pressure, k) != 0}


def _settings_out(settings: Settings) -> dict[str, Any]:
    default = Settings()
    out: dict[str, Any] = {}
    if settings.mode != default.mode:
        out["mode"] = settings.mode
    if settings.balance_source != default.balance_source:
        out["balance_source"] = settings.balance_source
    for key in ("cpu_overcommit", "memory_overcommit"):
        if getattr(settings, key) != getattr(default, key):
            out[key] = number_out(getattr(settings, key))
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
        weights["cpu"] = number_out(settings.weight_cpu)
    if settings.weight_memory != default.weight_memory:
        weights["memory"] = number_out(settings.weight_memory)
    if weights:
        out["weights"] = weights
    migration: dict[str, Any] = {}
    for key in ("max_parallel", "max_node_inflow"):
        if getattr(settings, key) != getattr(default, key):
            migration[key] = getattr(settings, key)
    if settings.cost_unit != default.cost_unit:
        migration["cost_unit"] = size_out(settings.cost_unit)
    if settings.cost_disk_factor != default.cost_disk_factor:
        migration["cost_disk_factor"] = number_out(settings.cost_disk_factor)
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


def node_out(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu": number_out(node.cpu), "memory": size_out(node.memory)}
    if node.arch != "x86_64":
        out["arch"] = node.arch
    if not node.online:
        out["online"] = False
    if node.maintenance:
        out["maintenance"] = True
    if node.tags:
        out["tags"] = [_id_out(tag) for tag in node.tags]
    if node.storage:
        out["storage"] = {pool: size_out(node.storage[pool]) for pool in sorted(node.storage)}
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
        out["ksm"] = size_out(node.ksm_shared)
    return out


_DEFAULT_GUEST: Final = Guest(id="", node="")


def guest_out(guest: Guest) -> dict[str, Any]:
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
        out["cpu"] = number_out(guest.cpu)
    out["memory"] = size_out(guest.memory)
    if guest.disks:
        out["disks"] = [{"pool": _id_out(d.pool), "size": size_out(d.size)} for d in guest.disks]
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
        if name != generated_name(kind, counters[kind], guests):
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
    out["nodes"] = {node.name: node_out(node) for node in cluster.nodes}
    out["guests"] = [guest_out(guest) for guest in cluster.guests]
    rules = _rules_out(cluster)
    if rules:
        out["rules"] = rules
    if cluster.ha_auto_rebalance:
        out["ha_auto_rebalance"] = True
    if cluster.ha_scheduler is not None:
        out["ha_scheduler"] = cluster.ha_scheduler
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
