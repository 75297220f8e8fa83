"""Measured usage over time (:class:`UsageWindow`): the moving average balancing decides on and
the recent usage capacity is checked on, both as arrays (:class:`MeasuredUsage`) the cycle's view
builds its models on."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.usage import LoadModel, MeasuredUsage, tolerance, with_usage
from opendrs.model.cluster import Cluster


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

    def columns(self, cluster: Cluster, resource: int) -> tuple[np.ndarray, np.ndarray]:
        """Every sample of one resource (0: cpu, 1: memory) aligned with ``cluster``: the
        guests' (S, G) and the nodes' own (S, N), NaN where unknown."""
        guests, own = (self.memory, self.base_memory) if resource else (self.cpu, self.base_cpu)
        return (
            _reindex(guests, self.guest_ids, tuple(g.id for g in cluster.guests)),
            _reindex(own, self.node_names, tuple(n.name for n in cluster.nodes)),
        )

    def average(self, cluster: Cluster) -> MeasuredUsage:
        """The usage balancing decides on, aligned with ``cluster``: each guest's cpu and memory
        (when measured now) and each node's own load at its mean over the window; guests and
        nodes the window has not seen keep their values. Memory is rounded to whole bytes."""
        if not self.times.size:
            return MeasuredUsage.of(cluster)
        return MeasuredUsage.replacing(cluster, *self._means(cluster))

    def smoothed(self, cluster: Cluster) -> Cluster:
        """``cluster`` with :meth:`average` written in (a snapshot of what balancing sees)."""
        return with_usage(cluster, self.average(cluster))

    def recent(self, cluster: Cluster, span: float) -> MeasuredUsage:
        """The usage capacity is checked on: each value of :meth:`average` or, when higher, its
        mean over the samples of the last ``span`` seconds, ``(last − span, last]`` (at least
        the last sample)."""
        return self.usage(cluster, span)[1]

    def latest(self, cluster: Cluster, span: float) -> MeasuredUsage:
        """The plain mean over the samples of the last ``span`` seconds, ``(last − span, last]``
        (at least the last sample), aligned with ``cluster`` like :meth:`average`: the recent
        demand a migration budget may spend on (:mod:`~opendrs.engine.policy.spending`)."""
        _check_span(span)
        if not self.times.size:
            return MeasuredUsage.of(cluster)
        return MeasuredUsage.replacing(cluster, *self._means(cluster, self._first(span)))

    def _first(self, span: float) -> int:
        """The index of the first sample of the last ``span`` seconds (at least the last)."""
        last = float(self.times[-1])
        return min(int(np.searchsorted(self.times, last - span, side="right")), len(self) - 1)

    def usage(self, cluster: Cluster, span: float) -> tuple[MeasuredUsage, MeasuredUsage]:
        """:meth:`average` and :meth:`recent` at once (the window's means computed once)."""
        _check_span(span)
        if not self.times.size:
            own = MeasuredUsage.of(cluster)
            return own, own
        first = self._first(span)
        means = self._means(cluster)
        cpu, memory, base_cpu, base_memory = (
            np.fmax(whole, part)
            for whole, part in zip(means, self._means(cluster, first), strict=True)
        )
        average, recent = MeasuredUsage.replacing_each(
            cluster, means, (cpu, memory, base_cpu, base_memory)
        )
        return average, recent


def _check_span(span: float) -> None:
    if isinstance(span, bool) or not isinstance(span, int | float) or not span >= 0:
        raise ValueError(f"usage window: span must be ≥ 0 seconds, got {span!r}")


def overloads(loads: LoadModel, usage: MeasuredUsage, limit: float = 1.0) -> bool:
    """Whether, in dynamic mode, a node's load with ``usage`` is over ``limit`` of its capacity
    (``loads``: the cluster's :class:`LoadModel` of measured usage (:func:`usage_loads`), whose
    placement and pairs are reused)."""
    if loads.mode != "dynamic":
        return False
    measured = replace(loads, demand=usage.guest_columns, base=usage.node_columns)
    capacity = loads.capacity * limit
    return bool(np.any(measured.loads() > capacity + tolerance(capacity)))


def with_last(recent: MeasuredUsage, cluster: Cluster) -> MeasuredUsage:
    """``recent`` with each value raised to the last observation's (``cluster``'s own usage)
    where that is higher: what a node running hot is found on — at the first observation above
    the hot level, not once the rise has lasted the hold."""
    recent.check(cluster)
    own = MeasuredUsage.of(cluster)
    raised = MeasuredUsage.replacing(
        cluster,
        np.fmax(recent.cpu, own.cpu),
        np.fmax(recent.memory, own.memory),
        np.fmax(recent.base_cpu, own.base_cpu),
        np.fmax(recent.base_memory, own.base_memory),
    )
    return replace(raised, forecast=recent.forecast) if recent.forecast else raised


def hot_nodes(
    loads: LoadModel, usage: MeasuredUsage, limit: float, assign: np.ndarray | None = None
) -> tuple[int, ...]:
    """The nodes (indexes) whose load with ``usage`` is over ``limit`` of their capacity, in
    dynamic mode (none otherwise), with the guests where they are or where ``assign`` puts
    them; ``loads`` as for :func:`overloads`."""
    if loads.mode != "dynamic":
        return ()
    measured = replace(loads, demand=usage.guest_columns, base=usage.node_columns)
    capacity = loads.capacity * limit
    over = measured.loads(assign) > capacity + tolerance(capacity)
    return tuple(int(n) for n in np.nonzero(over.any(axis=1))[0])


def overload_span(config: PolicyConfig) -> int:
    """Seconds after which a rise in usage counts for capacity: the hold (``hold`` observations,
    at least one, ``interval`` apart). A spike shorter than that does not; a rise that lasts is
    checked at once — an overload repaired, a target kept from filling up — while the
    ``smoothing`` average, which balancing uses, still hides it."""
    return max(config.hold, 1) * config.interval
