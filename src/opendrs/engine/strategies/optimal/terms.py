"""The spread terms of ``optimal``'s objective, as integers, and the real-valued figures that
decide whether balancing is on at all (the initial spread, the utilisation thresholds).

A term is ``weight · (max − min)`` over the usable nodes of each node's load fraction scaled to
:data:`~opendrs.engine.objective.LOAD_SCALE` and rounded down: opendrs's ``balance`` (cpu
and memory fractions of the cluster's usage mode) or one of proxlb-solver's methods (their terms
are :mod:`opendrs.engine.objective`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from opendrs.engine.imbalance import resource_weights
from opendrs.engine.objective import (
    LOAD_SCALE,
    PROXLB_METHODS,
    load_term,
    method_parts,
    over_thresholds,
    utilisation,
)
from opendrs.engine.objective import initial_spread as proxlb_initial_spread
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import Cluster

_MIB = 1024**2

#: Balancing methods: opendrs's own, then proxlb-solver's.
METHODS: tuple[str, ...] = ("balance", *PROXLB_METHODS)


@dataclass(frozen=True)
class SpreadTerm:
    """One spread term: ``weight · (max − min)`` over ``nodes`` of ``⌊scale·load/cap⌋``."""

    name: str
    weight: int
    coeffs: np.ndarray  # (G,) int64, 0 for guests that put no load
    base: np.ndarray  # (N,) int64
    cap: np.ndarray  # (N,) int64, ≥ 1
    scale: int
    nodes: np.ndarray  # node indices taking part

    def node_loads(self, assign: np.ndarray) -> np.ndarray:
        """Scaled, rounded-down loads of the term's nodes under ``assign`` (exact integers)."""
        total = self.base.copy()
        ok = assign >= 0
        np.add.at(total, assign[ok], self.coeffs[ok])
        return (self.scale * total[self.nodes]) // self.cap[self.nodes]

    def gap(self, assign: np.ndarray) -> int:
        if self.nodes.size < 2:
            return 0
        loads = self.node_loads(assign)
        return int(loads.max() - loads.min())


def _int_weight(value: float) -> int | None:
    """``value`` as an int when it is integral, else None."""
    return int(value) if float(value).is_integer() else None


# --------------------------------------------------------------------------------------------
# Balance terms


def _term_balance(
    cluster: Cluster, usable: np.ndarray, loads: LoadModel
) -> list[tuple[SpreadTerm, float]]:
    """opendrs's ``balance``: cpu and memory fractions of the cluster's usage mode — or of its
    guests' pressure (``Settings.balance_source``), counted in thousandths of a percent (only
    bytes are counted in MiB); ``loads``: the cluster's balance loads."""
    settings = cluster.settings
    weights = resource_weights(settings)
    out = []
    memory_unit = float(_MIB) if loads.memory_is_bytes else 1e-3
    for r, (name, per_unit) in enumerate((("cpu", 1e-3), ("memory", memory_unit))):
        scale = round(LOAD_SCALE * weights[r])
        if scale <= 0:
            continue
        coeffs = np.where(loads.active, np.round(loads.demand[:, r] / per_unit), 0).astype(np.int64)
        base = np.round(loads.base[:, r] / per_unit).astype(np.int64)
        capacity = loads.capacity[:, r]
        cap = np.maximum(np.round(capacity / per_unit), 1).astype(np.int64)
        nodes = np.nonzero(usable & (capacity > 0))[0]
        out.append((SpreadTerm(name, 1, coeffs, base, cap, scale, nodes), 1.0))
    return out


def spread_terms(
    cluster: Cluster,
    method: str,
    usage: str,
    w: Mapping[str, float],
    usable: np.ndarray,
    loads: LoadModel,
) -> list[SpreadTerm]:
    """The spread terms of ``method`` with integer weights (fractional weights fold in);
    ``loads``: the cluster's balance loads."""
    if method == "balance":
        pairs = _term_balance(cluster, usable, loads)
    else:  # proxlb-solver's terms, on the usable nodes
        active = loads.active
        nodes = np.nonzero(usable)[0]
        pairs = []
        for kind, weight in method_parts(method, usage, w):
            coeffs, cap, scale = load_term(cluster, kind, usage, active)
            zero = np.zeros(len(cluster.nodes), dtype=np.int64)
            pairs.append((SpreadTerm(kind, 1, coeffs, zero, cap, scale, nodes), weight))
    out = []
    for term, weight in pairs:
        if weight <= 0:
            continue
        as_int = _int_weight(weight)
        if as_int is not None:
            out.append(
                SpreadTerm(
                    term.name, as_int, term.coeffs, term.base, term.cap, term.scale, term.nodes
                )
            )
        else:
            coeffs = np.round(term.coeffs * weight).astype(np.int64)
            base = np.round(term.base * weight).astype(np.int64)
            out.append(SpreadTerm(term.name, 1, coeffs, base, term.cap, term.scale, term.nodes))
    return out


# --------------------------------------------------------------------------------------------
# Initial spread and utilisation thresholds (real-valued)


def initial_spread(
    cluster: Cluster,
    method: str,
    usage: str = "used",
    weights: Mapping[str, float] | None = None,
    loads: LoadModel | None = None,
) -> float:
    """The spread the balanciness threshold is compared with (a fraction; proxlb-solver's rule).

    ``balance``: the weighted spread of the cpu and memory fractions (cluster's usage mode).
    proxlb-solver's methods (:func:`opendrs.engine.objective.initial_spread`): the
    priority-weighted spread of the method's resource; ``X_smart`` the weighted mean of its usage
    and pressure spreads; ``global_smart`` the mean of the three usage spreads weighted by
    ``w_global_*``. Only usable nodes count. ``loads``: the cluster's balance loads, when they are
    built already.
    """
    if method != "balance":
        return proxlb_initial_spread(cluster, method, usage, weights)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    loads = loads if loads is not None else LoadModel.build(cluster)
    frac = loads.fractions()
    ws = resource_weights(cluster.settings)
    total = 0.0
    for r in range(2):
        col = frac[usable & (loads.capacity[:, r] > 0), r]
        if col.size:
            total += ws[r] * float(col.max() - col.min())
    return total


def thresholds_exceeded(
    cluster: Cluster,
    method: str,
    thresholds: Mapping[str, float | None],
    loads: LoadModel | None = None,
) -> tuple[bool, list[str]]:
    """Whether any usable node's utilisation exceeds its threshold (percent), and which.

    Raw utilisation, without priorities: for proxlb-solver's methods measured CPU over cores,
    configured memory over memory and local disks over storage, without reserves (its rule,
    :func:`opendrs.engine.objective.utilisation`); for ``balance`` the cpu and memory
    fractions of the cluster's usage mode, net of reserves (``loads``: the cluster's balance
    loads, when they are built already).
    """
    fractions = utilisation(cluster)
    if method == "balance":
        loads = loads if loads is not None else LoadModel.build(cluster)
        frac = loads.fractions()
        fractions["cpu"] = np.where(loads.capacity[:, 0] > 0, frac[:, 0], 0.0)
        fractions["memory"] = np.where(loads.capacity[:, 1] > 0, frac[:, 1], 0.0)
    return over_thresholds(cluster, fractions, thresholds)


__all__ = ["METHODS", "SpreadTerm", "initial_spread", "spread_terms", "thresholds_exceeded"]
