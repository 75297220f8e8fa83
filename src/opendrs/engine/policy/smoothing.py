"""Measured usage over time: the moving average balancing decides on (:class:`UsageWindow`) and
the recent usage capacity is checked on (:class:`RecentUsage`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.usage import LoadModel, tolerance, usage_loads
from opendrs.model.cluster import Cluster, Guest, Node, updater

_guest_with_usage = updater(Guest, "cpu_used", "memory_used")


def _measured(values: list[float | int | None]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def _reindex(old: np.ndarray, old_keys: tuple[str, ...], keys: tuple[str, ...]) -> np.ndarray:
    """``old`` (S, K) with its columns rearranged for ``keys``; new keys get NaN."""
    if old_keys == keys:
        return old
    position = {k: i for i, k in enumerate(old_keys)}
    take = np.array([position.get(k, -1) for k in keys], dtype=np.intp)
    out = np.full((old.shape[0], len(keys)), np.nan)
    have = take >= 0
    out[:, have] = old[:, take[have]]
    return out


def _mean(samples: np.ndarray) -> np.ndarray:
    """Column means over the known (finite) samples; NaN where none is known."""
    known = np.isfinite(samples)
    count = known.sum(axis=0)
    total = np.where(known, samples, 0.0).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class UsageWindow:
    """Recent observations of measured usage, for a moving average; an immutable value.

    Columns follow :attr:`guest_ids` (and :attr:`node_names`); a guest that was not measured in a
    sample (absent, or ``cpu_used``/``memory_used`` unknown) has NaN there. The index is rebuilt
    only when the set (or order) of guests changes. The average is the plain mean of the samples
    in the window — with a regular interval, the time-weighted mean as well.
    """

    #: Window length in seconds: samples at least this old are dropped; 0 keeps the last only.
    smoothing: int = 0
    guest_ids: tuple[str, ...] = ()
    node_names: tuple[str, ...] = ()
    times: np.ndarray = field(default_factory=lambda: _readonly(np.zeros(0)))
    cpu: np.ndarray = field(default_factory=lambda: _readonly(np.zeros((0, 0))))
    memory: np.ndarray = field(default_factory=lambda: _readonly(np.zeros((0, 0))))
    base_cpu: np.ndarray = field(default_factory=lambda: _readonly(np.zeros((0, 0))))
    base_memory: np.ndarray = field(default_factory=lambda: _readonly(np.zeros((0, 0))))

    def __len__(self) -> int:
        return int(self.times.size)

    def add(self, now: float, cluster: Cluster, smoothing: int | None = None) -> UsageWindow:
        """The window with ``cluster``'s measurements at ``now``, samples too old dropped.

        ``smoothing`` (seconds) overrides the window's length (and is kept); a sample is dropped
        once it is ``smoothing`` seconds old, so the window holds the interval
        ``(now − smoothing, now]``. A second sample at the same time replaces the first. Raises
        ValueError when ``now`` is earlier than the last sample.
        """
        span = self.smoothing if smoothing is None else smoothing
        if isinstance(span, bool) or not isinstance(span, int | float) or span < 0:
            raise ValueError(f"usage window: smoothing must be ≥ 0 seconds, got {span!r}")
        if self.times.size and now < float(self.times[-1]):
            raise ValueError(
                f"usage window: time went back from {float(self.times[-1]):g} to {now:g}"
            )
        guests, nodes = cluster.guests, cluster.nodes
        ids = tuple(g.id for g in guests)
        names = tuple(n.name for n in nodes)
        keep = (self.times > now - span) & (self.times < now)
        old_cpu = _reindex(self.cpu, self.guest_ids, ids)[keep]
        old_memory = _reindex(self.memory, self.guest_ids, ids)[keep]
        old_base_cpu = _reindex(self.base_cpu, self.node_names, names)[keep]
        old_base_memory = _reindex(self.base_memory, self.node_names, names)[keep]
        return UsageWindow(
            smoothing=int(span),
            guest_ids=ids,
            node_names=names,
            times=_readonly(np.append(self.times[keep], float(now))),
            cpu=_readonly(np.vstack([old_cpu, _measured([g.cpu_used for g in guests])[None]])),
            memory=_readonly(
                np.vstack([old_memory, _measured([g.memory_used for g in guests])[None]])
            ),
            base_cpu=_readonly(
                np.vstack([old_base_cpu, _measured([n.base_cpu for n in nodes])[None]])
            ),
            base_memory=_readonly(
                np.vstack([old_base_memory, _measured([n.base_memory for n in nodes])[None]])
            ),
        )

    def _means(self, cluster: Cluster, first: int = 0) -> tuple[np.ndarray, ...]:
        """Means of the samples from index ``first`` on, aligned with ``cluster``: each guest's
        cpu and memory, each node's own cpu and memory (NaN where the window has none)."""
        ids = tuple(g.id for g in cluster.guests)
        names = tuple(n.name for n in cluster.nodes)
        return (
            _mean(_reindex(self.cpu[first:], self.guest_ids, ids)),
            _mean(_reindex(self.memory[first:], self.guest_ids, ids)),
            _mean(_reindex(self.base_cpu[first:], self.node_names, names)),
            _mean(_reindex(self.base_memory[first:], self.node_names, names)),
        )

    def smoothed(self, cluster: Cluster) -> Cluster:
        """``cluster`` with measured usage replaced by its average over the window.

        Each guest's ``cpu_used`` and ``memory_used`` (when measured now) and each node's
        ``base_cpu`` and ``base_memory`` become the mean of their samples in the window; guests
        and nodes the window has not seen keep their values. Memory is rounded to whole bytes.
        """
        if not self.times.size:
            return cluster
        return _cluster_with_usage(cluster, *self._means(cluster))

    def recent(self, cluster: Cluster, span: float) -> RecentUsage:
        """The usage capacity is checked on (:class:`RecentUsage`): each value of
        :meth:`smoothed` or, when higher, its mean over the samples of the last ``span`` seconds,
        ``(last − span, last]`` (at least the last sample)."""
        return self.views(cluster, span)[1]

    def views(self, cluster: Cluster, span: float) -> tuple[Cluster, RecentUsage]:
        """:meth:`smoothed` and :meth:`recent` at once (the window's means computed once)."""
        if isinstance(span, bool) or not isinstance(span, int | float) or not span >= 0:
            raise ValueError(f"usage window: span must be ≥ 0 seconds, got {span!r}")
        ids = tuple(g.id for g in cluster.guests)
        names = tuple(n.name for n in cluster.nodes)
        if not self.times.size:
            nothing = np.full(len(ids), np.nan)
            none_nodes = np.full(len(names), np.nan)
            return cluster, RecentUsage(ids, names, nothing, nothing, none_nodes, none_nodes)
        last = float(self.times[-1])
        first = min(int(np.searchsorted(self.times, last - span, side="right")), len(self) - 1)
        means = self._means(cluster)
        values = [
            _readonly(np.fmax(whole, part))
            for whole, part in zip(means, self._means(cluster, first), strict=True)
        ]
        return _cluster_with_usage(cluster, *means), RecentUsage(ids, names, *values)


@dataclass(frozen=True, eq=False)
class RecentUsage:
    """Measured usage for the capacity checks, aligned with one cluster's guests and nodes.

    Each value is the higher of the smoothed mean and the mean over a short recent span (the
    hold): a rise that lasts that long counts at once, a fall only as the smoothing window
    forgets it. NaN where nothing was measured (the cluster's own value stands).
    """

    guest_ids: tuple[str, ...]
    node_names: tuple[str, ...]
    cpu: np.ndarray
    memory: np.ndarray
    base_cpu: np.ndarray
    base_memory: np.ndarray

    def _check(self, cluster: Cluster) -> None:
        if (
            tuple(g.id for g in cluster.guests) != self.guest_ids
            or tuple(n.name for n in cluster.nodes) != self.node_names
        ):
            raise ValueError("recent usage: made for another cluster's guests or nodes")

    def apply(self, cluster: Cluster) -> Cluster:
        """``cluster`` with this usage (guests measured now, nodes the window has seen)."""
        self._check(cluster)
        return _cluster_with_usage(cluster, self.cpu, self.memory, self.base_cpu, self.base_memory)

    def overloads(self, cluster: Cluster, loads: LoadModel) -> bool:
        """Whether, in dynamic mode, a node's load with this usage is over its capacity
        (``loads``: ``cluster``'s :class:`LoadModel`, whose placement and pairs are reused)."""
        self._check(cluster)
        if loads.mode != "dynamic":
            return False
        loads = usage_loads(cluster, loads)
        now_cpu = _measured([g.cpu_used for g in cluster.guests])
        now_memory = _measured([g.memory_used for g in cluster.guests])
        demand = loads.demand.copy()
        cpu_known = np.isfinite(now_cpu) & np.isfinite(self.cpu)
        memory_known = np.isfinite(now_memory) & np.isfinite(self.memory)
        demand[cpu_known, 0] = self.cpu[cpu_known]
        demand[memory_known, 1] = np.rint(self.memory[memory_known])
        base = loads.base.copy()
        base[np.isfinite(self.base_cpu), 0] = self.base_cpu[np.isfinite(self.base_cpu)]
        known = np.isfinite(self.base_memory)
        base[known, 1] = np.rint(self.base_memory[known])
        total = replace(loads, demand=demand, base=base).loads()
        return bool(np.any(total > loads.capacity + tolerance(loads.capacity)))


def _cluster_with_usage(
    cluster: Cluster,
    cpu: np.ndarray,
    memory: np.ndarray,
    base_cpu: np.ndarray,
    base_memory: np.ndarray,
) -> Cluster:
    """``cluster`` with each guest's measured usage (where measured now and known here) and each
    node's own load (where known) replaced; memory rounded to whole bytes."""
    guests, nodes = cluster.guests, cluster.nodes
    now_cpu = _measured([g.cpu_used for g in guests])
    now_memory = _measured([g.memory_used for g in guests])
    mem_int = np.where(np.isfinite(memory), np.rint(memory), np.nan)
    change_cpu = np.isfinite(now_cpu) & np.isfinite(cpu) & (cpu != now_cpu)
    change_mem = np.isfinite(now_memory) & np.isfinite(mem_int) & (mem_int != now_memory)
    new_guests: tuple[Guest, ...] = guests
    changed = np.nonzero(change_cpu | change_mem)[0]
    if changed.size:
        out = list(guests)
        for j in changed.tolist():
            g = guests[j]
            out[j] = _guest_with_usage(
                g,
                float(cpu[j]) if change_cpu[j] else g.cpu_used,
                int(mem_int[j]) if change_mem[j] else g.memory_used,
            )
        new_guests = tuple(out)
    new_nodes: tuple[Node, ...] = nodes
    node_cpu = np.array([n.base_cpu for n in nodes], dtype=np.float64)
    node_mem = np.array([n.base_memory for n in nodes], dtype=np.float64)
    base_mem_int = np.where(np.isfinite(base_memory), np.rint(base_memory), np.nan)
    n_cpu = np.isfinite(base_cpu) & (base_cpu != node_cpu)
    n_mem = np.isfinite(base_mem_int) & (base_mem_int != node_mem)
    if (n_cpu | n_mem).any():
        out_nodes = list(nodes)
        for i in np.nonzero(n_cpu | n_mem)[0].tolist():
            node_fields: dict[str, Any] = {}
            if n_cpu[i]:
                node_fields["base_cpu"] = float(base_cpu[i])
            if n_mem[i]:
                node_fields["base_memory"] = int(base_mem_int[i])
            out_nodes[i] = replace(nodes[i], **node_fields)
        new_nodes = tuple(out_nodes)
    if new_guests is guests and new_nodes is nodes:
        return cluster
    return Cluster(new_nodes, new_guests, cluster.rules, cluster.settings, cluster.name)


def overload_span(config: PolicyConfig) -> int:
    """Seconds after which a rise in usage counts for capacity: the hold (``hold`` observations,
    at least one, ``interval`` apart). A spike shorter than that does not; a rise that lasts is
    checked at once — an overload repaired, a target kept from filling up — while the
    ``smoothing`` average, which balancing uses, still hides it."""
    return max(config.hold, 1) * config.interval
