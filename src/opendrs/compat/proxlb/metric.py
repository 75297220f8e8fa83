"""What opendrs's own strategies balance for a proxlb-solver method (:func:`balance_metric`).

The ``optimal`` strategy models every method exactly; the other strategies balance the cpu and
memory columns of the cluster's load, so a scenario's method becomes the cluster's usage mode,
balance source and resource weights — exact where those express it, otherwise the closest, with a
note saying what is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opendrs.model.cluster import BalanceSource, UsageMode

from .scenario import Balancing

__all__ = ["BalanceMetric", "balance_metric"]

#: A single method read in ``mode: psi`` is the pressure of its resource (as ``optimal`` reads it).
_PSI_OF = {"memory": "memory_psi", "cpu": "cpu_psi", "disk": "io_psi"}


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
        return _smart_metric(resource, w, present[resource], cpu_mode)
    if method == "global_smart":
        return _global_smart_metric(w, present, cpu_mode)
    # disk, io_psi, io_smart
    return BalanceMetric(
        "static",
        1.0,
        1.0,
        "opendrs's own strategies have no disk or io balance: they balance configured vCPUs "
        "and memory; only optimal balances local disks and io pressure",
    )


def _smart_metric(
    resource: str, w: Mapping[str, float], has_pressure: bool, cpu_mode: UsageMode
) -> BalanceMetric:
    """``cpu_smart`` or ``memory_smart`` (``resource``): usage or pressure, whichever weighs
    more, with a note when both count (see :func:`balance_metric`)."""
    key = "mem" if resource == "memory" else "cpu"
    w_usage, w_psi = w[f"w_{key}_usage"], w[f"w_{key}_psi"]
    cols = (1.0, 0.0) if resource == "cpu" else (0.0, 1.0)
    usage_mode: UsageMode = cpu_mode if resource == "cpu" else "static"
    used = "measured CPU use" if cpu_mode == "dynamic" else "vCPUs"
    what = used if resource == "cpu" else "configured memory"
    if w_psi <= 0 or not has_pressure:
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


def _global_smart_metric(
    w: Mapping[str, float], present: Mapping[str, bool], cpu_mode: UsageMode
) -> BalanceMetric:
    """``global_smart``: cpu and memory weighted by their smart weights, pressure or usage
    whichever weighs more, with a note on what stands in for what (see :func:`balance_metric`)."""
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
