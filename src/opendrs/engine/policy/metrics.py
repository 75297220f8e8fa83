"""The policy's imbalance metrics (``spread``, ``cv``, ``memory-spread``), per CPU architecture,
and how an operator reads them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from opendrs.engine.imbalance import balance_objective, balance_spread, cv, resource_weights
from opendrs.engine.policy.config import METRICS
from opendrs.engine.pve_selection import pve_imbalance
from opendrs.engine.usage import LoadModel, arch_groups
from opendrs.model.cluster import Cluster


def _usable_fractions(
    cluster: Cluster, loads: LoadModel | None = None, assign: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Load fractions (N', R) of the usable nodes that have capacity, per CPU architecture."""
    loads = loads if loads is not None else LoadModel.build(cluster)
    arches, group = _measured_groups(cluster, loads)
    fractions = loads.fractions(assign)
    return {arch: fractions[group == g] for g, arch in enumerate(arches)}


def _measured_groups(cluster: Cluster, loads: LoadModel) -> tuple[tuple[str, ...], np.ndarray]:
    """The CPU architectures of the usable nodes that have capacity, and each node's group
    (:func:`~opendrs.engine.usage.arch_groups`; -1 for a node that takes no part)."""
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    usable &= np.all(loads.capacity > 0, axis=1)
    return arch_groups(cluster, usable)


def load_sigma(
    cluster: Cluster, loads: LoadModel | None = None, assign: np.ndarray | None = None
) -> float:
    """The capacity-weighted σ of the usable nodes' load fractions, the resources weighted as the
    cluster weighs them, each CPU architecture about its own mean: √ of the objective ``balance``
    lowers (:func:`~opendrs.engine.imbalance.balance_objective`). Unlike a spread it changes with
    every move of load between nodes, the busiest and idlest or not. ``loads`` and ``assign`` as
    :func:`measure`."""
    loads = loads if loads is not None else LoadModel.build(cluster)
    _, group = _measured_groups(cluster, loads)
    weights = resource_weights(cluster.settings)
    objective = float(balance_objective(loads.loads(assign), loads.capacity, weights, group))
    return float(np.sqrt(max(objective, 0.0)))


def measure(
    cluster: Cluster,
    metric: str,
    loads: LoadModel | None = None,
    assign: np.ndarray | None = None,
) -> float:
    """The imbalance ``metric`` of ``cluster`` on its usable nodes (0 for ``none``): of the worst
    CPU architecture where the nodes have several (guests cannot move between them).

    ``spread``: :func:`~opendrs.engine.imbalance.balance_spread` with the cluster's weights;
    ``cv``: population σ / mean of ``(cpu + memory) / 2`` (Proxmox's test logs, not normalised);
    ``pve-imbalance``: that divided by √(N−1), a value in 0..1 (proxmox-resource-scheduling
    2.1.0, what Proxmox VE 9.1+ compares with its threshold in percent);
    ``memory-spread``: max − min of the memory fractions (ProxLB). Raises ValueError for another
    name. ``loads`` may pass the cluster's :class:`LoadModel` when it is built already, and
    ``assign`` another placement of its guests (none of them migrating) to measure instead.
    """
    return max(measure_by_arch(cluster, metric, loads, assign).values(), default=0.0)


def measure_by_arch(
    cluster: Cluster,
    metric: str,
    loads: LoadModel | None = None,
    assign: np.ndarray | None = None,
) -> dict[str, float]:
    """The imbalance ``metric`` of each CPU architecture's usable nodes (see :func:`measure`)."""
    if metric not in METRICS and metric != "none":
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    groups = _usable_fractions(cluster, loads, assign)
    return {arch: _metric_of(cluster, metric, f) for arch, f in groups.items()}


def _metric_of(cluster: Cluster, metric: str, f: np.ndarray) -> float:
    """``metric`` of the fractions ``f`` (N', R) of one group of nodes."""
    if metric == "none":
        return 0.0
    if metric == "spread":
        settings = cluster.settings
        return balance_spread(f, [settings.weight_cpu, settings.weight_memory])
    if metric == "cv":
        return float(cv(f.mean(axis=1))) if f.shape[0] else 0.0
    if metric == "pve-imbalance":
        return pve_imbalance(f[:, :2]) if f.shape[0] else 0.0
    memory = f[:, 1]
    return float(memory.max() - memory.min()) if memory.size >= 2 else 0.0


def metric_label(metric: str) -> str:
    return {
        "spread": "spread",
        "cv": "imbalance (CV)",
        "pve-imbalance": "imbalance",
        "memory-spread": "memory spread",
    }.get(metric, metric)


def format_metric(metric: str, value: float) -> str:
    """A metric value as an operator reads it: ``22.4 pp`` for spreads, ``0.42`` for CV."""
    if metric in ("spread", "memory-spread"):
        return f"{value * 100:.1f} pp"
    if metric == "pve-imbalance":
        return f"{value * 100:.1f} %"
    return f"{value:.2f}"


def format_by_arch(metric: str, by_arch: Mapping[str, float]) -> str:
    """The metric's value; where the nodes have several CPU architectures, the worst one's,
    naming it, then each: ``12.0 pp on x86_64 (aarch64 3.0 pp, x86_64 12.0 pp)``."""
    worst = max(by_arch.values(), default=0.0)
    if len(by_arch) < 2:
        return format_metric(metric, worst)
    arch = min(a for a, v in by_arch.items() if v == worst)
    each = ", ".join(f"{a} {format_metric(metric, v)}" for a, v in by_arch.items())
    return f"{format_metric(metric, worst)} on {arch} ({each})"


def metric_scale(metric: str) -> tuple[float, str]:
    """How a chart shows ``metric``: the factor and the unit (spreads in percentage points, the
    normalised Proxmox imbalance in percent, a CV as it is)."""
    if metric in ("spread", "memory-spread"):
        return 100.0, "pp"
    if metric == "pve-imbalance":
        return 100.0, "%"
    return 1.0, ""


def format_threshold(metric: str, value: float) -> str:
    if metric in ("spread", "memory-spread"):
        return f"{value * 100:g} pp"
    if metric == "pve-imbalance":
        return f"{value * 100:g} %"
    return f"{value:g}"
