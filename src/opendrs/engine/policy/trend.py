"""Relief on the trend: a node whose load rises steadily is relieved before it runs hot.

With a ``hot`` level, each node's load is followed over the last observations of the usage
window, the guests on it now held where they are (what their rise will do to the node if they
stay). A rise counts only when it is **steady**: every observation over the last
:data:`TREND_SPAN` (at least :data:`TREND_STEPS` observations in a row) is higher than the one
before by at least :data:`TREND_RATE` of the node's size per hour — a lasting rise, such as a
batch job ramping up, and never a load that jumps at once and then stays (loads taking turns
rise in minutes and are flat between), nor one that wobbles. A steady rise that pauses — a job's
ramp that stops for a few observations under the hot level, or creeps on too slowly to count —
stays one for :data:`TREND_RECALL` after its last steady step, as long as the load has not
fallen from its peak since by one such step: the job has not ended. On such a node each guest's
load and the node's own are carried on along their least-squares lines over the latest steady
stretch for one interval ahead, from where they are now, where they rise: that **forecast** rise
is added to the usage capacity is checked on (never beyond a node's capacity), so a node
forecast above the hot level at the next observation is relieved now, as one above it already is
— the relief's text says it is forecast —, and is counted as seen running hot (no plan refills
it, and a relief only as its last resort); a guest moved takes its rise along, and a node with
no room for it takes no such guest. The forecast only ever adds load: a node whose load falls,
or rises unsteadily, is judged on its measured usage alone.

Pure and deterministic: the same window and cluster give the same forecast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from opendrs.engine.policy.smoothing import UsageWindow, with_last
from opendrs.engine.usage import MeasuredUsage, loaded_nodes, tolerance
from opendrs.model.cluster import Cluster

#: The least span, in seconds, a rise must have lasted to count as steady.
TREND_SPAN: Final = 900
#: The fewest rises in a row (observations after the first) a steady rise has.
TREND_STEPS: Final = 3
#: How long, in seconds, after a steady rise a node whose load has not fallen from its peak
#: since is still forecast to rise as it did: a job's rise that pauses for a few observations
#: (a plateau under the hot level) is not taken for its end.
TREND_RECALL: Final = 3600
#: The least rise of a steady one, a share of the node's size (net of reserves) per hour: 12 %,
#: 1 % every 5 minutes — faster than any time-of-day swing.
TREND_RATE: Final = 0.12


@dataclass(frozen=True, slots=True)
class NodeTrend:
    """What each guest's load and each node's own are forecast to add within ``lead`` seconds
    on the nodes whose load rises steadily (0 elsewhere): (cores, bytes) rows aligned with the
    cluster's guests (``guests``) and nodes (``own``); ``total``: each node's whole rise."""

    guests: np.ndarray
    own: np.ndarray
    total: np.ndarray
    lead: float

    @property
    def rising(self) -> tuple[int, ...]:
        """The nodes (indexes) with a forecast rise."""
        return tuple(int(n) for n in np.nonzero((self.total > 0).any(axis=1))[0])


def trend_steps(interval: float) -> int:
    """How many rises in a row make a steady one at observations ``interval`` seconds apart:
    :data:`TREND_STEPS`, or more to span :data:`TREND_SPAN`."""
    return max(TREND_STEPS, math.ceil(TREND_SPAN / max(interval, 1)))


def node_trend(window: UsageWindow, cluster: Cluster, lead: float) -> NodeTrend:
    """The forecast rise ``lead`` seconds after the window's last observation (``lead``: the
    interval): on each node whose load with the guests where they are now rose steadily over
    :func:`trend_steps` intervals ending at the last observation, or at one within
    :data:`TREND_RECALL` before it and not fallen from its peak since (a rise that has paused
    stays a rise for a while: :func:`_steady_ends`), each of those guests' and the node's own
    rise along its least-squares line over those intervals, where it rises."""
    steps = trend_steps(lead)
    node_of = _node_of(cluster)
    guests = np.zeros((len(cluster.guests), 2))
    own = np.zeros((len(cluster.nodes), 2))
    if len(window) >= steps + 1 and lead > 0:
        count = min(len(window), steps + 1 + math.ceil(TREND_RECALL / max(lead, 1)))
        times = window.times[-count:]
        sizes = net_sizes(cluster)
        placed = node_of >= 0
        for k in (0, 1):
            samples = window.columns(cluster, k)
            columns = (samples[0][-count:], samples[1][-count:])
            ends = _steady_ends(times, columns, node_of, sizes[:, k], steps)
            for end in sorted(set(ends[ends >= 0].tolist())):
                nodes = ends == end
                span = slice(end - steps, end + 1)
                known = [c[: steps + 1] for c in _since(columns, end - steps)]
                on = placed & nodes[node_of]
                guests[:, k] = np.where(on, _rise(times[span], known[0], lead), guests[:, k])
                own[:, k] = np.where(nodes, _rise(times[span], known[1], lead), own[:, k])
    return NodeTrend(guests, own, _node_series((guests.T, own.T), node_of).T, lead)


def _node_of(cluster: Cluster) -> np.ndarray:
    """(G,): the index of each guest's node, -1 where the cluster has no such node."""
    index = cluster.node_index
    return np.array([index.get(g.node, -1) for g in cluster.guests], dtype=np.int64)


def _node_series(columns: tuple[np.ndarray, np.ndarray], node_of: np.ndarray) -> np.ndarray:
    """(S, N): each node's load at each sample with the guests where they are now — the guests'
    samples (S, G) added to the nodes' own (S, N)."""
    values, own = columns
    samples, nodes = own.shape
    placed = node_of >= 0
    cells = (np.arange(samples)[:, None] * nodes + node_of[placed][None, :]).ravel()
    sums = np.bincount(cells, weights=values[:, placed].ravel(), minlength=samples * nodes)
    return own + sums.reshape(samples, nodes)


def _since(columns: tuple[np.ndarray, np.ndarray], first: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples from ``first`` to the last, the guests and nodes unknown at any of them left
    out (:func:`_known`): a steady stretch starting at ``first`` and what came after it are
    judged on the same guests."""
    return _known((columns[0][first:], columns[1][first:]), len(columns[0]) - first)


def net_sizes(cluster: Cluster) -> np.ndarray:
    """(N, 2): each node's cores and bytes net of reserves."""
    return np.array(
        [[cluster.net_cpu(n), float(cluster.net_memory(n))] for n in cluster.nodes],
        dtype=np.float64,
    ).reshape(len(cluster.nodes), 2)


def _known(columns: tuple[np.ndarray, np.ndarray], count: int) -> tuple[np.ndarray, np.ndarray]:
    """The last ``count`` samples of the guests' and nodes' own ``columns``, a value unknown at
    any of them left out (0) of every one: the series stays comparable."""
    out = []
    for values in columns:
        last = values[-count:]
        out.append(np.where(np.isfinite(last).all(axis=0), last, 0.0))
    return out[0], out[1]


def _steady_ends(
    times: np.ndarray,
    columns: tuple[np.ndarray, np.ndarray],
    node_of: np.ndarray,
    size: np.ndarray,
    steps: int,
) -> np.ndarray:
    """(N,) for each node, the index (into ``times``) of the latest observation at most
    :data:`TREND_RECALL` before the last that ends ``steps`` rises in a row, each by
    :data:`TREND_RATE` of its ``size`` per hour at least; -1 where there is none, or where the
    load has fallen since from its peak by one such rise (the rise is over — an older stretch
    does not count then either). ``columns``: the guests' and nodes' own samples, NaN where
    unknown; each stretch and what came after it are judged on the guests known throughout
    both (:func:`_since`)."""
    last = len(times) - 1
    ends = np.full(size.shape[0], -1)
    decided = ~(size > 0)
    for end in range(last, steps - 1, -1):
        if times[last] - times[end] > TREND_RECALL or decided.all():
            break
        series = _node_series(_since(columns, end - steps), node_of)
        least = TREND_RATE * size[None, :] * np.diff(times[end - steps : end + 1])[:, None] / 3600.0
        steady = (np.diff(series[: steps + 1], axis=0) >= least).all(axis=0) & ~decided
        if not steady.any():
            continue
        since = series[steps:]
        kept = since[-1] >= since.max(axis=0) - least[-1]
        ends = np.where(steady & kept, end, ends)
        decided |= steady
    return ends


def _rise(times: np.ndarray, values: np.ndarray, lead: float) -> np.ndarray:
    """Each column's least-squares slope over ``times`` times ``lead``; 0 where it falls."""
    centred = times - times.mean()
    slope = centred @ (values - values.mean(axis=0)) / float(centred @ centred)
    return np.maximum(slope, 0.0) * lead


def with_trend(
    recent: MeasuredUsage, cluster: Cluster, trend: NodeTrend, hot: float
) -> MeasuredUsage:
    """``recent`` — raised to the last observation (``cluster``'s) where that is higher, as the
    hot level reads it (:func:`~.smoothing.with_last`) — with the forecast rise added to each
    guest's load and each node's own; on each node at most what leaves it within its capacity,
    the guests' and its own cut alike: a moved guest takes its rise along to the node it goes
    to. The rising nodes not above the ``hot`` level without it are named ``forecast``."""
    if not trend.rising:
        return recent
    now = with_last(recent, cluster)
    load = _loads(now, cluster)
    room = np.maximum(_FULL * net_sizes(cluster) - load, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(trend.total > 0, np.minimum(room / trend.total, 1.0), 0.0)
    node_of = _node_of(cluster)
    guests = trend.guests * np.where((node_of >= 0)[:, None], share[node_of], 0.0)
    own = trend.own * share
    limit = hot * net_sizes(cluster)
    hot_now = (load > limit + tolerance(limit)).any(axis=1)
    names = frozenset(cluster.nodes[n].name for n in trend.rising if not hot_now[n])
    sizes = np.array([[g.cpu, float(g.memory)] for g in cluster.guests], dtype=np.float64)
    sizes = sizes.reshape(len(cluster.guests), 2)
    # No guest is forecast above its size (its vCPUs, its memory).
    cpu = np.where(guests[:, 0] > 0, np.minimum(now.cpu + guests[:, 0], sizes[:, 0]), now.cpu)
    memory = now.memory + np.floor(guests[:, 1])
    memory = np.where(guests[:, 1] > 0, np.minimum(memory, sizes[:, 1]), now.memory)
    return MeasuredUsage(
        now.guest_ids,
        now.node_names,
        _frozen(np.maximum(cpu, now.cpu)),
        _frozen(np.rint(np.maximum(memory, now.memory))),
        _frozen(now.base_cpu + own[:, 0]),
        _frozen(np.rint(now.base_memory + np.floor(own[:, 1]))),
        recent.forecast | names,
    )


def with_node_load(
    usage: MeasuredUsage,
    cluster: Cluster,
    cpu: np.ndarray,
    memory: np.ndarray,
    *,
    capped: bool = True,
) -> MeasuredUsage:
    """``usage`` with ``cpu`` (cores) and ``memory`` (bytes) added to each node's own load — with
    ``capped``, at most what leaves the node within its capacity: a forecast raises a node above
    the hot level, never over its capacity (a repair that would lift the guards against
    flapping). Uncapped only for a view the relief searches in with its guards kept
    (:func:`with_margin`)."""
    room = np.maximum(_FULL * net_sizes(cluster) - _loads(usage, cluster), 0.0)
    if not capped:
        room = np.full_like(room, np.inf)
    return MeasuredUsage(
        usage.guest_ids,
        usage.node_names,
        usage.cpu,
        usage.memory,
        _frozen(usage.base_cpu + np.clip(cpu, 0.0, room[:, 0])),
        _frozen(np.rint(usage.base_memory + np.clip(memory, 0.0, np.floor(room[:, 1])))),
        usage.forecast,
    )


#: The share of a node's capacity a raised load stays under (beyond any rounding).
_FULL: Final = 0.99


def _loads(usage: MeasuredUsage, cluster: Cluster) -> np.ndarray:
    """(N, 2): each node's cores and bytes used with ``usage``, the guests on every node they
    load."""
    usage.check(cluster)
    load = np.column_stack([usage.base_cpu, usage.base_memory]).astype(np.float64)
    index = cluster.node_index
    for g, guest in enumerate(cluster.guests):
        for name in loaded_nodes(guest):
            n = index.get(name)
            if n is not None:
                load[n] += (usage.cpu[g], usage.memory[g])
    return load


def with_margin(
    usage: MeasuredUsage, cluster: Cluster, nodes: tuple[int, ...], share: float
) -> MeasuredUsage:
    """``usage`` with ``share`` of their size (net of reserves) added to the own load of
    ``nodes`` (indexes), whole even past their capacity (a node at 95 % is checked at 105 %, so
    it is brought as far under a level as one at 87 %): those nodes checked ``share`` under a
    level, the others at it. A relief searches this view with its guards kept, never lifted
    (``decide._deeper_relief``)."""
    cpu = np.zeros(len(cluster.nodes))
    memory = np.zeros(len(cluster.nodes))
    for n in nodes:
        node = cluster.nodes[n]
        cpu[n] = share * cluster.net_cpu(node)
        memory[n] = share * cluster.net_memory(node)
    return with_node_load(usage, cluster, cpu, memory, capped=False)


def _frozen(values: np.ndarray) -> np.ndarray:
    values.setflags(write=False)
    return values


__all__ = [
    "TREND_RATE",
    "TREND_RECALL",
    "TREND_SPAN",
    "TREND_STEPS",
    "NodeTrend",
    "net_sizes",
    "node_trend",
    "with_margin",
    "with_node_load",
    "with_trend",
]
