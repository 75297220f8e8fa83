"""Imbalance metrics over node load fractions, vectorised with numpy.

The measures take node fractions ``f`` of shape (N,) or (N, R) — load divided by capacity — and
reduce over the node axis (axis 0); the balance objective takes the loads and capacities:

* :func:`cv` — Proxmox's coefficient of variation, population σ / mean (pve-rs 2.0, and the scale
  of the HA test logs); :func:`cv_normalized` divides it by √(N−1) (proxmox-resource-scheduling
  2.1.0), which maps the worst case (all load on one node) to 1.
* :func:`spread` — max − min (ProxLB, Incus); :func:`balance_spread` — the largest spread over the
  weighted resources, the yardstick of ``balance`` and of the controller's threshold.
* :func:`rms` — root mean square, the "average" criterion of Proxmox's TOPSIS scoring.
* :func:`resource_weights` — the cluster's resource weights normalised to sum 1, for every measure.
* :func:`combined` — the per-node combined load: the weighted mean of the resource fractions
  (Proxmox: cpu and memory with equal weights).
* :func:`weighted_variance` — the capacity-weighted variance of the fractions, from node loads and
  capacities: the smooth objective the balancer minimises, zero exactly when every node has the same
  fraction; :func:`balance_objective` combines it with the resource weights.

Metrics are 0 when fewer than two nodes take part or when all loads are 0, as in Proxmox.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from opendrs.model.cluster import Settings


def _as2d(f: np.ndarray) -> tuple[np.ndarray, bool]:
    arr = np.asarray(f, dtype=np.float64)
    return (arr[:, None], True) if arr.ndim == 1 else (arr, False)


def _out(values: np.ndarray, squeeze: bool) -> np.ndarray | float:
    return float(values[0]) if squeeze else values


def cv(f: np.ndarray) -> np.ndarray | float:
    """Coefficient of variation (population σ / mean) per column; 0 if N < 2 or the mean is 0."""
    arr, squeeze = _as2d(f)
    n = arr.shape[0]
    if n < 2:
        return _out(np.zeros(arr.shape[1]), squeeze)
    mean = arr.mean(axis=0)
    sd = np.sqrt(((arr - mean) ** 2).sum(axis=0) / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.where(mean > 0, sd / np.where(mean > 0, mean, 1.0), 0.0)
    return _out(res, squeeze)


def cv_normalized(f: np.ndarray) -> np.ndarray | float:
    """CV divided by √(N−1): 1 when all load is on one node (proxmox-resource-scheduling 2.1)."""
    arr, squeeze = _as2d(f)
    n = arr.shape[0]
    if n < 2:
        return _out(np.zeros(arr.shape[1]), squeeze)
    return _out(np.asarray(cv(arr)) / np.sqrt(n - 1), squeeze)


def spread(f: np.ndarray) -> np.ndarray | float:
    """max − min per column; 0 for fewer than two nodes."""
    arr, squeeze = _as2d(f)
    if arr.shape[0] < 2:
        return _out(np.zeros(arr.shape[1]), squeeze)
    return _out(arr.max(axis=0) - arr.min(axis=0), squeeze)


def rms(f: np.ndarray) -> np.ndarray | float:
    """Root mean square per column."""
    arr, squeeze = _as2d(f)
    if arr.shape[0] == 0:
        return _out(np.zeros(arr.shape[1]), squeeze)
    return _out(np.sqrt((arr**2).mean(axis=0)), squeeze)


def balance_spread(fractions: np.ndarray, weights: Sequence[float]) -> float:
    """The largest spread (max − min) over the resources with a positive weight.

    The yardstick of ``balance``'s target and of the controller's threshold: a cluster is balanced
    to ``x`` when every weighted resource's node fractions lie within ``x`` of each other. Rows
    are the nodes that take part (usable nodes); columns the resources, in the order of
    ``weights``. Non-finite fractions (nodes without capacity) are left out.
    """
    arr = np.asarray(fractions, dtype=np.float64).reshape(-1, len(weights))
    best = 0.0
    for col, weight in enumerate(weights):
        if weight <= 0:
            continue
        values = arr[:, col]
        values = values[np.isfinite(values)]
        if values.size >= 2:
            best = max(best, float(values.max() - values.min()))
    return best


def normalise_weights(weights: Sequence[float], n: int) -> np.ndarray:
    """Weights as a vector that sums to 1 (equal weights when they sum to 0)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"expected {n} weights, got {w.shape[0] if w.ndim else 0}")
    total = w.sum()
    return np.full(n, 1.0 / n) if total <= 0 else w / total


def resource_weights(settings: Settings) -> np.ndarray:
    """The cluster's (cpu, memory) weights as a vector that sums to 1 (negative ones count as 0;
    equal weights when both are 0): the one normalisation every balance measure uses."""
    return normalise_weights([max(settings.weight_cpu, 0.0), max(settings.weight_memory, 0.0)], 2)


def combined(f: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Per-node combined load (N,): the weighted mean of the resource fractions."""
    arr = np.asarray(f, dtype=np.float64)
    return arr @ normalise_weights(weights, arr.shape[1])


def weighted_variance(
    load: np.ndarray, capacity: np.ndarray, group: np.ndarray | None = None
) -> np.ndarray:
    """Capacity-weighted variance of the node load fractions, per resource: the balance objective's
    terms, defined once.

    ``Σ_n C_n (f_n − f̄)² / Σ_n C_n`` with ``f_n = L_n / C_n`` and ``f̄ = Σ L / Σ C``: moving load
    between nodes never changes f̄, and the variance is 0 exactly when all fractions are equal,
    so minimising it balances nodes of any size. Moving demand ``d`` from node ``a`` to node ``b``
    changes it by ``(d²(1/C_a + 1/C_b) − 2d(f_a − f_b)) / Σ_n C_n`` — the exact incremental form
    ``balance`` scores its moves with.

    ``load``: node loads (N, R), or (k, N, R) for k placements at once (then (k, R) out);
    ``capacity``: (N, R). ``group`` (N,): each node's group, which has its own mean f̄ (CPU
    architectures, between which no load moves), ``-1`` for a node that takes no part (default:
    one group); a node takes no part in a resource it has no capacity of. Sums run over the
    nodes in order, so one placement or many at once give the same value, bit for bit.
    """
    load = np.asarray(load, dtype=np.float64)
    cap = np.asarray(capacity, dtype=np.float64)
    if group is None:
        group = np.zeros(cap.shape[0], dtype=np.intp)
    positive = cap > 0
    if cap.shape[0] and positive.all() and not group.any():
        return _one_group(load, cap)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(positive, load / np.where(positive, cap, 1.0), 0.0)
    load = np.where(positive, load, 0.0)
    mean = np.zeros(load.shape)
    for g in range(int(group.max(initial=-1)) + 1):
        idx = np.nonzero(group == g)[0]
        nodes = slice(None) if idx.size == len(group) else idx
        total = cap[nodes].sum(axis=0)
        summed = _running_sum(load[..., nodes, :])
        mean[..., nodes, :] = np.where(total > 0, summed / np.where(total > 0, total, 1.0), 0.0)[
            ..., None, :
        ]
    part = np.where((group >= 0)[:, None], cap, 0.0)
    total = part.sum(axis=0)
    var = _running_sum(part * (f - mean) ** 2)
    return np.where(total > 0, var / np.where(total > 0, total, 1.0), 0.0)


def _one_group(load: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """:func:`weighted_variance` where every node takes part in one group with capacity in every
    resource: the same sums in the same order (the same value, bit for bit), without the masks."""
    total = cap.sum(axis=0)
    mean = (_running_sum(load) / total)[..., None, :]
    return _running_sum(cap * (load / cap - mean) ** 2) / total


def _running_sum(values: np.ndarray) -> np.ndarray:
    """``values`` summed over their node axis (the second last), node after node."""
    if values.shape[-2] == 0:
        return np.zeros(values.shape[:-2] + values.shape[-1:])
    return np.cumsum(values, axis=-2)[..., -1, :]


def balance_objective(
    load: np.ndarray, capacity: np.ndarray, weights: np.ndarray, group: np.ndarray | None = None
) -> np.ndarray:
    """``J = Σ_r w_r · weighted_variance_r``: the objective ``balance`` lowers with every balancing
    move, for one placement's loads (N, R) or k placements' (k, N, R) — an array of shape () or
    (k,). ``weights``: the resource weights (:func:`resource_weights`); ``group`` as
    :func:`weighted_variance`."""
    var = weighted_variance(load, capacity, group)
    w = np.asarray(weights, dtype=np.float64)
    values = [float(v @ w) for v in var.reshape(-1, var.shape[-1])]
    return np.array(values, dtype=np.float64).reshape(var.shape[:-1])


@dataclass(frozen=True, slots=True)
class ResourceMetrics:
    """Imbalance figures of one resource (or of the combined load)."""

    mean: float
    min: float
    max: float
    spread: float
    cv: float
    cv_normalized: float
    rms: float

    def as_dict(self) -> dict[str, float]:
        return {
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
            "spread": self.spread,
            "cv": self.cv,
            "cv_normalized": self.cv_normalized,
            "rms": self.rms,
        }


def _metrics(col: np.ndarray) -> ResourceMetrics:
    finite = col[np.isfinite(col)]
    if finite.size == 0:
        return ResourceMetrics(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return ResourceMetrics(
        mean=float(finite.mean()),
        min=float(finite.min()),
        max=float(finite.max()),
        spread=float(spread(finite)),
        cv=float(cv(finite)),
        cv_normalized=float(cv_normalized(finite)),
        rms=float(rms(finite)),
    )


@dataclass(frozen=True, slots=True)
class Imbalance:
    """Imbalance of a cluster: per resource and combined."""

    resources: Mapping[str, ResourceMetrics]
    combined: ResourceMetrics

    def as_dict(self) -> dict[str, dict[str, float]]:
        out = {name: m.as_dict() for name, m in self.resources.items()}
        out["combined"] = self.combined.as_dict()
        return out


def summarise(fractions: np.ndarray, names: Sequence[str], weights: Sequence[float]) -> Imbalance:
    """Metrics per resource column of ``fractions`` (N, R) and for the combined load."""
    arr = np.asarray(fractions, dtype=np.float64).reshape(-1, len(names))
    per = {name: _metrics(arr[:, i]) for i, name in enumerate(names)}
    return Imbalance(resources=per, combined=_metrics(combined(arr, weights)))
