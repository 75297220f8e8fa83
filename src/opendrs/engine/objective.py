"""proxlb-solver's objective: its balancing methods and the load terms of its model.

proxlb-solver balances the spread (max − min over the usable nodes) of one or more load
fractions, chosen by ``balancing.method``: ``memory`` (configured memory), ``cpu`` (measured use,
or vCPUs with ``mode: assigned``), ``disk`` (local disks against the node's storage),
``cpu_psi``/``memory_psi``/``io_psi`` (the guests' pressure against 100), the smart methods
(``w_X_usage · usage + w_X_psi · psi``) and ``global_smart`` (``Σ w_global_R · smart_R``). Each
guest's footprint is multiplied by its ``priority``; ``mode: psi`` makes the single methods use
pressure. The balanciness level sets the weights of spread and stickiness and the initial spread
below which nothing is balanced; utilisation thresholds may also gate balancing.

This module holds those rules: the constants, each method's terms (:func:`method_parts`), a
term's integer coefficients as the model counts them (:func:`load_term`), and the real-valued
spread and utilisation the gates compare (:func:`initial_spread`, :func:`utilisation`,
:func:`over_thresholds`). The ``optimal`` strategy builds its CP-SAT model from them; the
scenario files and expectation checks are :mod:`opendrs.compat.proxlb`'s, which reads these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import Cluster

__all__ = [
    "BALANCINESS",
    "DEFAULT_WEIGHTS",
    "LOAD_SCALE",
    "PROXLB_METHODS",
    "SOFT_PENALTY",
    "USAGES",
    "LoadTerm",
    "initial_spread",
    "load_term",
    "method_parts",
    "on_node",
    "over_thresholds",
    "priorities",
    "real_gap",
    "utilisation",
]

#: proxlb-solver's balancing methods.
PROXLB_METHODS: tuple[str, ...] = (
    "memory",
    "cpu",
    "disk",
    "cpu_psi",
    "memory_psi",
    "io_psi",
    "cpu_smart",
    "memory_smart",
    "io_smart",
    "global_smart",
)
#: proxlb-solver's ``balancing.mode``: what the cpu terms count (``psi``: single methods use PSI).
USAGES: tuple[str, ...] = ("used", "assigned", "psi")
#: Balanciness level -> (w_balance, w_stickiness, gap threshold as a fraction).
BALANCINESS: Mapping[int, tuple[int, int, float]] = {
    1: (0, 1, 1.0),
    2: (1, 50, 0.25),
    3: (10, 10, 0.15),
    4: (50, 5, 0.05),
    5: (100, 1, 0.0),
}
#: 100 % of a node's load fraction in the model's integers.
LOAD_SCALE = 10_000
#: Objective penalty of one broken soft rule (proxlb-solver's value).
SOFT_PENALTY = 1_000_000
#: Default term weights (proxlb-solver's ``Balancing`` model; its scenario loader differs).
DEFAULT_WEIGHTS: Mapping[str, float] = {
    "w_cpu_usage": 1,
    "w_cpu_psi": 2,
    "w_mem_usage": 1,
    "w_mem_psi": 2,
    "w_io_usage": 1,
    "w_io_psi": 2,
    "w_global_mem": 10,
    "w_global_cpu": 5,
    "w_global_io": 1,
}

_MIB = 1024**2


class LoadTerm(NamedTuple):
    """One load term in the model's integers: a node's load is ``⌊scale · Σ coeffs / cap⌋``
    over the guests on it (``coeffs`` per guest, 0 for guests that put no load; ``cap`` per
    node, ≥ 1)."""

    coeffs: np.ndarray
    cap: np.ndarray
    scale: int


def priorities(cluster: Cluster) -> np.ndarray:
    """(G,) each guest's priority, the factor of its footprint."""
    return np.array([g.priority for g in cluster.guests], dtype=np.int64)


def load_term(cluster: Cluster, kind: str, usage: str, active: np.ndarray) -> LoadTerm:
    """One of proxlb-solver's load terms (``memory``, ``cpu``, ``disk``, ``*_psi``) for the
    ``active`` guests, priorities included."""
    guests, nodes = cluster.guests, cluster.nodes
    prio = priorities(cluster)
    n_nodes = len(nodes)
    # proxlb-solver's own arithmetic, on purpose: capacity is memory (or cores) less the reserve,
    # unclamped and floored at one unit, not opendrs's Cluster.net_memory / net_cpu.
    if kind == "memory":
        coeffs = np.array([g.memory * int(p) // _MIB for g, p in zip(guests, prio, strict=True)])
        cap = np.array([max(1, (n.memory - cluster.reserve_memory(n)) // _MIB) for n in nodes])
        scale = LOAD_SCALE
    elif kind == "cpu":
        values = [g.cpu if usage == "assigned" else g.cpu_load for g in guests]
        room = [n.cpu - cluster.reserve_cpu(n) for n in nodes]
        if all(float(c).is_integer() for c in room):
            coeffs = np.array(
                [int(v * int(p) * LOAD_SCALE) for v, p in zip(values, prio, strict=True)]
            )
            cap = np.array([max(1, int(c)) for c in room])
        else:  # fractional cores: thousandths of a core
            coeffs = np.array(
                [int(v * int(p) * LOAD_SCALE * 1000) for v, p in zip(values, prio, strict=True)]
            )
            cap = np.array([max(1000, round(c * 1000)) for c in room])
        scale = 1
    elif kind == "disk":
        coeffs = np.array(
            [g.local_disk_bytes * int(p) // _MIB for g, p in zip(guests, prio, strict=True)]
        )
        cap = np.array([max(1, sum(n.storage.values()) // _MIB) for n in nodes])
        scale = LOAD_SCALE
    else:  # cpu_psi, memory_psi, io_psi
        resource = kind.removesuffix("_psi")
        coeffs = np.array(
            [
                int(getattr(g.pressure, resource) * int(p) * LOAD_SCALE)
                for g, p in zip(guests, prio, strict=True)
            ]
        )
        cap = np.full(n_nodes, 100)
        scale = 1
    coeffs = np.where(active, coeffs.reshape(len(guests)), 0).astype(np.int64)
    return LoadTerm(coeffs, np.asarray(cap, dtype=np.int64), scale)


def method_parts(method: str, usage: str, w: Mapping[str, float]) -> list[tuple[str, float]]:
    """(term kind, weight) pairs of a proxlb-solver method (``w``: the term weights)."""
    if method in ("memory", "cpu", "disk"):
        if usage == "psi":
            return [("io_psi" if method == "disk" else f"{method}_psi", 1.0)]
        return [(method, 1.0)]
    if method.endswith("_psi"):
        return [(method, 1.0)]
    smart = {
        "cpu": [("cpu", w["w_cpu_usage"]), ("cpu_psi", w["w_cpu_psi"])],
        "memory": [("memory", w["w_mem_usage"]), ("memory_psi", w["w_mem_psi"])],
        "io": [("disk", w["w_io_usage"]), ("io_psi", w["w_io_psi"])],
    }
    if method == "global_smart":
        out = []
        for resource, key in (
            ("memory", "w_global_mem"),
            ("cpu", "w_global_cpu"),
            ("io", "w_global_io"),
        ):
            out += [(kind, w[key] * weight) for kind, weight in smart[resource]]
        return out
    return smart[method.removesuffix("_smart")]


# --------------------------------------------------------------------------------------------
# Initial spread and utilisation thresholds (real-valued, as proxlb-solver computes them)


def on_node(cluster: Cluster, values: np.ndarray) -> np.ndarray:
    """(N,) sum of ``values`` (G,) over the active guests on each node."""
    loads = LoadModel.build(cluster)
    out = np.zeros(len(cluster.nodes))
    ok = loads.active & (loads.assign >= 0)
    np.add.at(out, loads.assign[ok], values[ok])
    return out


def real_gap(cluster: Cluster, kind: str, usage: str, usable: np.ndarray) -> float:
    """The spread, over the ``usable`` nodes, of one term's real-valued load fractions."""
    guests, nodes = cluster.guests, cluster.nodes
    prio = priorities(cluster).astype(np.float64)
    # As in load_term: proxlb-solver's capacity less the reserve, unclamped, at least 1.
    if kind == "memory":
        used = np.array([g.memory for g in guests], dtype=np.float64)
        cap = np.array([max(1.0, float(n.memory - cluster.reserve_memory(n))) for n in nodes])
    elif kind == "cpu":
        used = np.array([g.cpu if usage == "assigned" else g.cpu_load for g in guests], dtype=float)
        cap = np.array([max(1.0, float(n.cpu - cluster.reserve_cpu(n))) for n in nodes])
    elif kind == "disk":
        used = np.array([g.local_disk_bytes for g in guests], dtype=np.float64)
        cap = np.array([max(1.0, float(sum(n.storage.values()))) for n in nodes])
    else:
        resource = kind.removesuffix("_psi")
        used = np.array([getattr(g.pressure, resource) for g in guests], dtype=np.float64)
        cap = np.full(len(nodes), 100.0)
    frac = (on_node(cluster, used * prio) / cap)[usable]
    return float(frac.max() - frac.min()) if frac.size else 0.0


def initial_spread(
    cluster: Cluster, method: str, usage: str = "used", weights: Mapping[str, float] | None = None
) -> float:
    """The spread the balanciness threshold is compared with (a fraction; proxlb-solver's rule).

    The priority-weighted spread of the method's resource; ``X_smart`` the weighted mean of its
    usage and pressure spreads; ``global_smart`` the mean of the three usage spreads weighted by
    ``w_global_*``. Only usable nodes count.
    """
    w = {**DEFAULT_WEIGHTS, **(weights or {})}
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    if method == "global_smart":
        parts = [
            (w["w_global_mem"], real_gap(cluster, "memory", usage, usable)),
            (w["w_global_cpu"], real_gap(cluster, "cpu", usage, usable)),
            (w["w_global_io"], real_gap(cluster, "disk", usage, usable)),
        ]
        total_w = sum(p[0] for p in parts)
        return sum(a * b for a, b in parts) / total_w if total_w else parts[0][1]
    if method.endswith("_smart"):
        (u_kind, w_u), (p_kind, w_p) = method_parts(method, usage, w)
        u_gap = real_gap(cluster, u_kind, usage, usable)
        p_gap = real_gap(cluster, p_kind, usage, usable)
        return (w_u * u_gap + w_p * p_gap) / (w_u + w_p) if (w_u + w_p) else u_gap
    ((kind, _),) = method_parts(method, usage, w)
    return real_gap(cluster, kind, usage, usable)


def utilisation(cluster: Cluster) -> dict[str, np.ndarray]:
    """(N,) each node's raw utilisation (a fraction) per resource, as proxlb-solver's thresholds
    read it: measured CPU over cores, configured memory over memory, local disks over storage —
    without priorities or reserves."""
    nodes, guests = cluster.nodes, cluster.guests
    fractions: dict[str, np.ndarray] = {}
    cpu = on_node(cluster, np.array([g.cpu_load for g in guests], dtype=float))
    mem = on_node(cluster, np.array([g.memory for g in guests], dtype=float))
    cores = np.array([n.cpu for n in nodes], dtype=float)
    memory = np.array([n.memory for n in nodes], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        fractions["cpu"] = np.where(cores > 0, cpu / np.where(cores > 0, cores, 1), 0.0)
        fractions["memory"] = np.where(memory > 0, mem / np.where(memory > 0, memory, 1), 0.0)
    disk = on_node(cluster, np.array([g.local_disk_bytes for g in guests], dtype=float))
    storage = np.array([float(sum(n.storage.values())) or 1.0 for n in nodes])
    fractions["disk"] = disk / storage
    return fractions


def over_thresholds(
    cluster: Cluster, fractions: Mapping[str, np.ndarray], thresholds: Mapping[str, float | None]
) -> tuple[bool, list[str]]:
    """Whether any usable node's utilisation (``fractions``) exceeds its threshold (percent),
    and which: ``node resource 92.0% > 80%``."""
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    nodes = cluster.nodes
    over: list[str] = []
    for resource in ("cpu", "memory", "disk"):
        limit = thresholds.get(resource)
        if limit is None:
            continue
        pct = fractions[resource] * 100
        for n in np.nonzero(usable & (pct > limit))[0].tolist():
            over.append(f"{nodes[n].name} {resource} {pct[n]:.1f}% > {limit:g}%")
    return bool(over), over
