"""The generated clusters as proxlb-solver scenarios: a balancing method, imported as opendrs does.

:func:`scenario_document` writes a generated cluster (:mod:`bench.generate`, proxlb-solver's own
benchmark shape) as a proxlb-solver scenario document — nodes with ``cpu_total`` and
``memory_total_gb``, guests with ``cpu``, ``memory_gb`` (GiB, quarter-GiB steps, so exact) and
``cpu_usage`` (the measured use), pins, hard affinity and anti-affinity — with ``balancing.method``
set, the generator's vCPU overcommit (4.0) and level 4 (the reference baseline's); a strict node
affinity becomes a pin to its top-priority nodes (proxlb-solver's pins have no priorities). Only
running
guests are written (the generator's all are). :func:`scenario_cluster` imports it with
:func:`opendrs.compat.proxlb.scenario_from_dict`, exactly as ``opendrs plan scenario.yaml`` would,
so the cluster's settings carry the method (``memory``: configured memory alone) and every
strategy, the evaluation and the lower bounds follow it.

The same ``(size, seed, rules, method)`` always gives the same cluster.
"""

from __future__ import annotations

from typing import Any

from bench.generate import CPU_OVERCOMMIT, SIZES, Size, generate
from opendrs.compat.proxlb import PROXLB_METHODS, scenario_from_dict
from opendrs.model.cluster import Cluster

GiB = 1024**3
#: proxlb-solver's balanciness level written into the scenarios (only ``optimal`` reads it).
BALANCINESS = 4


def scenario_document(
    cluster: Cluster, method: str = "memory", *, balanciness: int = BALANCINESS
) -> dict[str, Any]:
    """``cluster`` as a proxlb-solver scenario (plain data) balancing ``method``."""
    if method not in PROXLB_METHODS:
        raise ValueError(f"method: expected one of {', '.join(PROXLB_METHODS)}, got {method!r}")
    nodes = {
        n.name: {"cpu_total": float(n.cpu), "memory_total_gb": n.memory / GiB}
        for n in cluster.nodes
    }
    vms: dict[str, dict[str, Any]] = {}
    for guest in cluster.guests:
        if guest.state != "running":
            continue
        vms[guest.id] = {
            "node": guest.node,
            "cpu": float(guest.cpu),
            "memory_gb": guest.memory / GiB,
            "cpu_usage": float(guest.cpu_load),
            "type": guest.kind,
        }
    rules = cluster.rules
    names = frozenset(nodes)
    pins = [
        {"vm": guest, "nodes": sorted(rule.top_nodes(names))}
        for rule in rules.node_affinity
        if rule.strict
        for guest in rule.guests
        if guest in vms
    ]
    affinity = [
        {"name": r.name, "vms": list(r.guests), "hard": r.hard}
        for r in rules.guest_affinity
        if r.positive
    ]
    anti_affinity = [
        {"name": r.name, "vms": list(r.guests), "hard": r.hard}
        for r in rules.guest_affinity
        if not r.positive
    ]
    document: dict[str, Any] = {
        "name": cluster.name,
        "balancing": {
            "method": method,
            "balanciness": balanciness,
            "cpu_overcommit": cluster.settings.cpu_overcommit,
        },
        "nodes": nodes,
        "vms": vms,
    }
    constraints = {
        key: value
        for key, value in (("pin", pins), ("affinity", affinity), ("anti_affinity", anti_affinity))
        if value
    }
    if constraints:
        document["constraints"] = constraints
    return document


def scenario_cluster(
    size: Size | str, *, seed: int = 1, rules: bool = False, method: str = "memory"
) -> Cluster:
    """The generated cluster of ``(size, seed, rules)``, imported as a ``method`` scenario."""
    if isinstance(size, str):
        size = SIZES[size]
    cluster = generate(size, seed=seed, rules=rules)
    document = scenario_document(cluster, method)
    name = f"bench-{size.name}-{method}"
    return scenario_from_dict(document, filename=f"{name}.yaml", name=name).cluster


__all__ = ["BALANCINESS", "CPU_OVERCOMMIT", "scenario_cluster", "scenario_document"]
