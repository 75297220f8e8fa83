"""Demand per time of day (:class:`DailyProfile`) and the imbalance over the whole day it gives
(:func:`worst_hour`, :func:`day_metric`): with ``policy.daily_profile``, balancing decides on
the hour of the day whose profile the current placement balances worst, and a plan's margin is
judged on every hour at once — a placement that pairs guests whose peaks do not coincide.

Each guest's (and each node's own) measured cpu and memory is kept per hour of the day (UTC):
for each of the 24 hours a running mean over about the last ``daily_profile`` of days, the
first samples of an hour averaged plainly, later ones weighted ``1 / samples`` (an exponential
mean spanning about that many samples). An hour the profile has not seen yet reads the usage
balancing would decide on without it (the smoothing window's average). The profile is kept in
memory, 24 × 2 numbers per guest and per node, and rebuilt from the observations after a
restart (as the smoothing window is): the first day after one decides on partly filled hours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from opendrs.engine.policy.metrics import measure_by_arch
from opendrs.engine.usage import LoadModel, MeasuredUsage
from opendrs.model.cluster import Cluster

HOURS = 24
HOUR = 3600


def hour_of_day(now: float) -> int:
    """The hour of the day (UTC, 0–23) of the time ``now`` (seconds since the epoch)."""
    return int(now // HOUR) % HOURS


def profile_samples(span: int, interval: int) -> int:
    """How many samples each hour's mean spans for a profile of ``span`` seconds (days of
    history) with an observation every ``interval`` seconds: the samples one hour of the day
    gets over those days, at least 1."""
    return max(int(span // 86400 * HOUR // max(interval, 1)), 1)


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _empty() -> np.ndarray:
    return _readonly(np.zeros((0, HOURS)))


def _rekey(old: np.ndarray, old_keys: tuple[str, ...], keys: tuple[str, ...]) -> np.ndarray:
    """``old`` (K, 24) with its rows rearranged for ``keys``; new keys get zeros."""
    if old_keys == keys:
        return old
    position = {k: i for i, k in enumerate(old_keys)}
    out = np.zeros((len(keys), HOURS))
    for i, k in enumerate(keys):
        j = position.get(k)
        if j is not None:
            out[i] = old[j]
    return out


def _update(
    means: np.ndarray, counts: np.ndarray, hour: int, values: np.ndarray, samples: int
) -> tuple[np.ndarray, np.ndarray]:
    """``means`` and ``counts`` (K, 24) with ``values`` (K,; NaN: not measured) added to
    ``hour``: a plain mean for the first ``samples`` samples, then an exponential one."""
    known = np.isfinite(values)
    count = counts[:, hour] + known
    rate = np.where(known, 1.0 / np.minimum(np.maximum(count, 1), samples), 0.0)
    new_means, new_counts = means.copy(), counts.copy()
    new_means[:, hour] += rate * (np.where(known, values, 0.0) - means[:, hour])
    new_counts[:, hour] = count
    return _readonly(new_means), _readonly(new_counts)


def _values(values: Sequence[float | int | None]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


@dataclass(frozen=True, eq=False)
class DailyProfile:
    """Measured usage per hour of the day, per guest and per node; an immutable value.

    Rows follow :attr:`guest_ids` (and :attr:`node_names`), columns the 24 hours; ``*_seen``
    count the samples each hour has had (0: not seen, its mean is meaningless).
    """

    #: Samples each hour's mean spans (:func:`profile_samples`).
    samples: int = 1
    #: When the first sample was added (None: none yet).
    since: float | None = None
    guest_ids: tuple[str, ...] = ()
    node_names: tuple[str, ...] = ()
    cpu: np.ndarray = field(default_factory=_empty)
    memory: np.ndarray = field(default_factory=_empty)
    guest_seen: np.ndarray = field(default_factory=_empty)
    memory_seen: np.ndarray = field(default_factory=_empty)
    base_cpu: np.ndarray = field(default_factory=_empty)
    base_memory: np.ndarray = field(default_factory=_empty)
    node_seen: np.ndarray = field(default_factory=_empty)

    def add(self, now: float, cluster: Cluster, samples: int | None = None) -> DailyProfile:
        """The profile with ``cluster``'s measurements at ``now`` added to its hour of the day;
        guests and nodes no longer in ``cluster`` dropped, new ones added unseen. ``samples``
        overrides (and replaces) :attr:`samples`."""
        span = self.samples if samples is None else samples
        if isinstance(span, bool) or not isinstance(span, int) or span < 1:
            raise ValueError(f"daily profile: samples must be a whole number ≥ 1, got {span!r}")
        hour = hour_of_day(now)
        ids = tuple(g.id for g in cluster.guests)
        names = tuple(n.name for n in cluster.nodes)
        guests = cluster.guests

        def guest(array: np.ndarray) -> np.ndarray:
            return _rekey(array, self.guest_ids, ids)

        def node(array: np.ndarray) -> np.ndarray:
            return _rekey(array, self.node_names, names)

        cpu, seen = _update(
            guest(self.cpu),
            guest(self.guest_seen),
            hour,
            _values([g.cpu_used for g in guests]),
            span,
        )
        memory, memory_seen = _update(
            guest(self.memory),
            guest(self.memory_seen),
            hour,
            _values([g.memory_used for g in guests]),
            span,
        )
        nodes = cluster.nodes
        base_cpu, node_seen = _update(
            node(self.base_cpu),
            node(self.node_seen),
            hour,
            _values([n.base_cpu for n in nodes]),
            span,
        )
        base_memory, _ = _update(
            node(self.base_memory),
            node(self.node_seen),
            hour,
            _values([n.base_memory for n in nodes]),
            span,
        )
        return replace(
            self,
            samples=span,
            since=now if self.since is None else self.since,
            guest_ids=ids,
            node_names=names,
            cpu=cpu,
            memory=memory,
            guest_seen=seen,
            memory_seen=memory_seen,
            base_cpu=base_cpu,
            base_memory=base_memory,
            node_seen=node_seen,
        )

    def covers_day(self, now: float) -> bool:
        """Whether the profile has seen a whole day by ``now`` (every hour of it once)."""
        return self.since is not None and now - self.since >= 86400 - HOUR

    def hours(
        self, cluster: Cluster, fallback: MeasuredUsage, width: int = 1
    ) -> tuple[MeasuredUsage, ...]:
        """The usage of each hour of the day (24, aligned with ``cluster``): each guest's and
        node's profile where that hour has been seen, else ``fallback``'s value — averaged over
        the ``width`` hours up to it (1–24: hour ``h`` is the mean of hours ``h − width + 1`` to
        ``h``, round the clock), as the smoothing window averages the hours up to now. Raises
        ValueError when ``fallback`` was made for another cluster, or for a bad ``width``."""
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= HOURS:
            raise ValueError(f"daily profile: width must be 1 to {HOURS} hours, got {width!r}")
        fallback.check(cluster)
        ids = tuple(g.id for g in cluster.guests)
        names = tuple(n.name for n in cluster.nodes)
        g_seen = _rekey(self.guest_seen, self.guest_ids, ids) > 0
        m_seen = _rekey(self.memory_seen, self.guest_ids, ids) > 0
        n_seen = _rekey(self.node_seen, self.node_names, names) > 0
        cpu = np.where(g_seen, _rekey(self.cpu, self.guest_ids, ids), fallback.cpu[:, None])
        memory = np.where(
            m_seen, _rekey(self.memory, self.guest_ids, ids), fallback.memory[:, None]
        )
        base_cpu = np.where(
            n_seen, _rekey(self.base_cpu, self.node_names, names), fallback.base_cpu[:, None]
        )
        base_memory = np.where(
            n_seen, _rekey(self.base_memory, self.node_names, names), fallback.base_memory[:, None]
        )
        cpu, memory, base_cpu, base_memory = (
            trailing_mean(a, width) for a in (cpu, memory, base_cpu, base_memory)
        )
        return MeasuredUsage.replacing_each(
            cluster,
            *((cpu[:, h], memory[:, h], base_cpu[:, h], base_memory[:, h]) for h in range(HOURS)),
        )


def trailing_mean(values: np.ndarray, width: int) -> np.ndarray:
    """``values`` (K, 24) with each hour the mean of the ``width`` hours up to it, round the
    clock (hour 0's window takes the last hours of the day before)."""
    if width == 1:
        return values
    total = np.zeros(values.shape)
    for back in range(width):
        total += np.roll(values, back, axis=1)
    return total / width


def hour_loads(loads: LoadModel, usage: MeasuredUsage) -> LoadModel:
    """``loads`` with one hour's ``usage`` as the measured load (dynamic mode, usage balanced;
    otherwise the load does not depend on the hour: ``loads`` itself)."""
    if loads.mode != "dynamic" or loads.source != "usage":
        return loads
    return replace(loads, demand=usage.guest_columns, base=usage.node_columns)


def hour_metrics(
    cluster: Cluster,
    metric: str,
    loads: LoadModel,
    hours: Sequence[MeasuredUsage],
    assign: np.ndarray | None = None,
) -> list[dict[str, float]]:
    """The imbalance ``metric`` per CPU architecture at each hour of ``hours`` (``loads``: the
    cluster's balance :class:`LoadModel`, whose placement and pairs are reused; ``assign``
    another placement to measure instead)."""
    return [measure_by_arch(cluster, metric, hour_loads(loads, usage), assign) for usage in hours]


def worst_hour(
    cluster: Cluster, metric: str, loads: LoadModel, hours: Sequence[MeasuredUsage]
) -> int:
    """The hour whose metric is largest for the current placement (the earliest of equals)."""
    worst = [
        max(by_arch.values(), default=0.0)
        for by_arch in hour_metrics(cluster, metric, loads, hours)
    ]
    return int(np.argmax(worst)) if worst else 0


def day_metric(
    cluster: Cluster,
    metric: str,
    loads: LoadModel,
    hours: Sequence[MeasuredUsage],
    assign: np.ndarray | None = None,
) -> float:
    """The imbalance over the whole day: the largest of the hours' metrics (``assign``: another
    placement of the guests, none of them migrating)."""
    return max(
        (max(m.values(), default=0.0) for m in hour_metrics(cluster, metric, loads, hours, assign)),
        default=0.0,
    )


__all__ = [
    "HOURS",
    "DailyProfile",
    "day_metric",
    "hour_loads",
    "hour_metrics",
    "hour_of_day",
    "profile_samples",
    "trailing_mean",
    "worst_hour",
]
