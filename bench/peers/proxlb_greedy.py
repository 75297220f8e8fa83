"""ProxLB 2.3.0 (gyptazy/credativ, GPL-3.0): its greedy balancer, run offline on our clusters.

ProxLB's ``Calculations`` are static and pure over its pydantic ``ProxLbData``; only data
collection and ``Balancing.balance`` touch the Proxmox API. :func:`run` builds ``ProxLbData`` in
memory, runs steps 1–6 of ProxLB's main loop —
``Groups.get_groups``, ``set_node_assignments``, ``set_node_hot``, ``set_guest_hot``,
``get_most_free_node`` (never with ``return_node=True``: that prints and calls ``sys.exit``),
``validate_affinity_map``, ``relocate_guests_on_maintenance_nodes``, ``get_balanciness``,
``relocate_guests`` — and reads each guest's ``node_target`` back, keeping the moves
``Balancing.balance`` would execute (not ignored, type in ``balance_types``).

Conversion (:func:`proxlb_spec`), as ProxLB's collectors (``models/nodes.py``, ``guests.py``) would
see the cluster on Proxmox:

* **Configuration**: balancing enabled, method ``memory``, mode :data:`DEFAULT_MODE`, balanciness
  :data:`DEFAULT_BALANCINESS` pp (5, as in the reference baseline), ``balance_types`` ``vm`` (and
  ``ct`` when the cluster allows restart migrations), everything else ProxLB's defaults.
* **Nodes** (running guests only, as ProxLB collects them): memory total net of the reserve,
  ``used`` = the host's own memory + the guests' measured memory, ``free`` and the percentages
  against the full memory (as ProxLB computes them), ``assigned`` 0 (``set_node_assignments``
  adds the guests); CPU in cores, used = Σ measured cores; disk = the local pools' sizes (1 TiB
  when a node has none: ProxLB divides by it). Offline or maintenance nodes are ``maintenance``.
* **Guests**: configured vCPUs and memory as ``total``, measured memory as ``used``, CPU ``used``
  as the *fraction* of the guest's vCPUs (what Proxmox's RRD reports). Rules: one affinity group
  per hard positive component (ProxLB keeps one group per guest), hard anti-affinity groups,
  node affinity as ``node_relationships`` (strict or not), ``ignore`` for ignored and immovable
  guests. Soft guest affinity has no equivalent and is left out (noted).

**Mode.** ``assigned`` is the default: it balances configured memory, the quantity the benchmark
measures (``static`` mode) and the reference baseline reports (its spread is the raw *configured*
RAM spread), while ``used`` balances measured memory, which the generated clusters draw at
50–100 % of the configured size. Either way ProxLB's break rule and capacity check use ``used``
memory (one of ProxLB's known weak points).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from opendrs.engine.constraints import check_rules, movability
from opendrs.engine.usage import loaded_nodes
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.rules import GuestAffinity

from . import PeerResult, silence_peer_logs

#: The peer module that :func:`run` imports (the worker imports it before measuring).
ENTRY_MODULE = "proxlb.models.calculations"
PEER = "proxlb-greedy"
GreedyMode = Literal["assigned", "used"]
#: ProxLB balancing mode; see the module docstring.
DEFAULT_MODE: GreedyMode = "assigned"
#: Percentage points of spread tolerated (ProxLB's default is 10; the baseline used 5).
DEFAULT_BALANCINESS = 5
#: Disk total given to a node without local pools (ProxLB divides by it).
NOMINAL_DISK = 1024**4
#: Version ProxLB would read from each node (9.x: PSI metrics available).
PVE_VERSION = "9.0.0"

_ZERO_PRESSURE = {
    "pressure_some_percent": 0.0,
    "pressure_full_percent": 0.0,
    "pressure_some_spikes_percent": 0.0,
    "pressure_full_spikes_percent": 0.0,
    "pressure_hot": False,
}


def _node_metric(total: float, used: float, physical: float) -> dict[str, Any]:
    """A node metric as ProxLB's collector builds it (free and percents against ``physical``)."""
    free = physical - used
    return {
        "total": int(total),
        "assigned": 0,
        "used": float(used),
        "free": float(free),
        "assigned_percent": 0.0,
        "free_percent": free / physical * 100 if physical else 0.0,
        "used_percent": used / physical * 100 if physical else 0.0,
        **_ZERO_PRESSURE,
    }


def _guest_metric(total: float, used: float) -> dict[str, Any]:
    """A guest metric as ProxLB's collector builds it (no pressure data)."""
    return {"total": int(total), "used": float(used), **_ZERO_PRESSURE}


def _affinity_groups(rules: tuple[GuestAffinity, ...]) -> dict[str, str]:
    """Guest → its affinity group: hard positive rules sharing guests merge into one group,
    named after the group's first rule name (ProxLB gives each guest a single group)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    positive = [r for r in rules if r.positive and r.hard and r.guests]
    for rule in positive:
        for guest in rule.guests[1:]:
            a, b = find(rule.guests[0]), find(guest)
            if a != b:
                parent[max(a, b)] = min(a, b)
    names: dict[str, str] = {}
    for rule in positive:
        root = find(rule.guests[0])
        names[root] = min(names.get(root, rule.name), rule.name)
    return {guest: names[find(guest)] for rule in positive for guest in rule.guests}


def _node_spec(cluster: Cluster, node: Node, guests: list[Guest]) -> dict[str, Any]:
    """A ``ProxLbData.Node`` as plain data: ``node`` with its running ``guests``."""
    mem_used = float(node.base_memory) + sum(float(g.memory_load) for g in guests)
    cpu_used = float(node.base_cpu) + sum(float(g.cpu_load) for g in guests)
    disk_total = float(sum(node.storage.values())) or float(NOMINAL_DISK)
    disk_used = float(sum(d.size for g in guests for d in g.disks if d.local))
    memory = _node_metric(node.memory - cluster.reserve_memory(node), mem_used, node.memory)
    return {
        "name": node.name,
        "pve_version": PVE_VERSION,
        "pressure_hot": False,
        "maintenance": not node.usable,
        "cpu": _node_metric(int(node.cpu), cpu_used, int(node.cpu)),
        "disk": _node_metric(disk_total, disk_used, disk_total),
        "memory": memory,
    }


def proxlb_spec(
    cluster: Cluster,
    *,
    mode: GreedyMode = DEFAULT_MODE,
    balanciness: int = DEFAULT_BALANCINESS,
) -> dict[str, Any]:
    """``cluster`` as plain data in ProxLB's shape: ``config``, ``nodes``, ``guests``, ``notes``.

    ``config`` is the keyword arguments of ProxLB's ``Config``; ``nodes`` and ``guests`` map names
    to the fields of ``ProxLbData.Node`` and ``ProxLbData.Guest``.
    """
    settings = cluster.settings
    notes: list[str] = []
    known = set(cluster.node_index)
    running = [g for g in cluster.guests if loaded_nodes(g) and g.node in known]
    if len(running) < len(cluster.guests):
        notes.append(
            f"{len(cluster.guests) - len(running)} guests not running left out (as ProxLB does)"
        )
    by_node: dict[str, list[Guest]] = {n.name: [] for n in cluster.nodes}
    for guest in running:
        by_node[guest.node].append(guest)
    nodes = {n.name: _node_spec(cluster, n, by_node[n.name]) for n in cluster.nodes}

    rules, problems = check_rules(cluster)
    notes.extend(f"rule dropped as opendrs drops it: {p}" for p in problems)
    affinity = _affinity_groups(rules.guest_affinity)
    anti: dict[str, list[str]] = {}
    soft = 0
    for rule in rules.guest_affinity:
        if not rule.hard:
            soft += 1
        elif not rule.positive:
            for guest_id in rule.guests:
                anti.setdefault(guest_id, []).append(rule.name)
    if soft:
        notes.append(f"{soft} soft guest-affinity rules left out (no equivalent)")
    usable = frozenset(n.name for n in cluster.nodes if n.usable)
    relations: dict[str, tuple[list[str], bool]] = {}
    for rule in rules.node_affinity:
        top = sorted(rule.top_nodes(usable))
        for guest_id in rule.guests:
            relations[guest_id] = (top, rule.strict)

    guests: dict[str, dict[str, Any]] = {}
    for index, guest in enumerate(running):
        vcpus = max(round(guest.cpu), 1)
        related, strict = relations.get(guest.id, ([], False))
        ignore = guest.id in rules.ignored or movability(guest, cluster, "balance") is not None
        guests[guest.id] = {
            "name": guest.id,
            "id": int(guest.id) if guest.id.isdigit() else 100 + index,
            "cpu": _guest_metric(vcpus, float(guest.cpu_load) / vcpus),
            "disk": _guest_metric(sum(d.size for d in guest.disks), 0.0),
            "memory": _guest_metric(guest.memory, float(guest.memory_load)),
            "node_current": guest.node,
            "node_target": guest.node,
            "processed": False,
            "pressure_hot": False,
            "tags": [],
            "pools": [],
            "ha_rules": [],
            "affinity_groups": [affinity[guest.id]] if guest.id in affinity else [],
            "anti_affinity_groups": anti.get(guest.id, []),
            "ignore": ignore,
            "node_relationships": related,
            "node_relationships_strict": strict,
            "type": guest.kind,
        }
    config = {
        "proxmox_api": {"hosts": ["127.0.0.1"], "user": "bench@pam"},
        "balancing": {
            "enable": True,
            "balance_types": ["vm", "ct"] if settings.allow_restart_migration else ["vm"],
            "method": "memory",
            "mode": mode,
            "balanciness": int(balanciness),
            "cpu_overcommit": float(settings.cpu_overcommit),
        },
    }
    return {"config": config, "nodes": nodes, "guests": guests, "notes": notes}


def to_proxlb_data(
    cluster: Cluster,
    *,
    mode: GreedyMode = DEFAULT_MODE,
    balanciness: int = DEFAULT_BALANCINESS,
) -> tuple[Any, tuple[str, ...]]:
    """``cluster`` as ProxLB's ``ProxLbData`` (groups still empty) and the conversion notes.

    Needs proxlb installed.
    """
    from proxlb.utils.config_parser import Config
    from proxlb.utils.proxlb_data import ProxLbData

    spec = proxlb_spec(cluster, mode=mode, balanciness=balanciness)
    meta = ProxLbData.Meta.from_config(Config(**spec["config"]), cluster_non_pve9=False)
    data = ProxLbData(
        meta=meta,
        nodes={k: ProxLbData.Node.model_validate(v) for k, v in spec["nodes"].items()},
        guests={k: ProxLbData.Guest.model_validate(v) for k, v in spec["guests"].items()},
        pools={},
        ha_rules={},
        groups=ProxLbData.Groups(),
    )
    return data, tuple(spec["notes"])


def calculate(data: Any) -> None:
    """ProxLB's decision steps on ``data`` (a ``ProxLbData``), in its main loop's order."""
    from proxlb.models.calculations import Calculations
    from proxlb.models.groups import Groups

    data.groups = Groups.get_groups(data.guests, data.nodes)
    Calculations.set_node_assignments(data)
    Calculations.set_node_hot(data)
    Calculations.set_guest_hot(data)
    if Calculations.get_most_free_node(data, False) is None:
        return
    Calculations.validate_affinity_map(data)
    Calculations.relocate_guests_on_maintenance_nodes(data)
    Calculations.get_balanciness(data)
    Calculations.relocate_guests(data)


def migrations(data: Any) -> dict[str, str]:
    """Guest → target of every move ``Balancing.balance`` would execute."""
    types = {str(t) for t in data.meta.balancing.balance_types}
    return {
        name: guest.node_target
        for name, guest in data.guests.items()
        if guest.node_target != guest.node_current and not guest.ignore and str(guest.type) in types
    }


def run(
    cluster: Cluster,
    *,
    mode: GreedyMode = DEFAULT_MODE,
    balanciness: int = DEFAULT_BALANCINESS,
) -> PeerResult:
    """Run ProxLB's greedy calculation on ``cluster`` and read the targets back."""
    data, notes = to_proxlb_data(cluster, mode=mode, balanciness=balanciness)
    silence_peer_logs()  # after ProxLB's imports: its logger sets its own level when created
    start = time.perf_counter()
    calculate(data)
    seconds = time.perf_counter() - start
    placement = migrations(data)
    modelled = sum(1 for g in data.guests.values() if g.node_target != g.node_current)
    info: dict[str, object] = {
        "mode": mode,
        "balanciness": balanciness,
        "model_moves": modelled,
    }
    return PeerResult(PEER, placement, seconds, info, notes)


__all__ = [
    "DEFAULT_BALANCINESS",
    "DEFAULT_MODE",
    "ENTRY_MODULE",
    "PEER",
    "calculate",
    "migrations",
    "proxlb_spec",
    "run",
    "to_proxlb_data",
]
