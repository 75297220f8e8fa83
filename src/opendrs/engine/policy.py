"""Policy: *when* to act — turns a stream of observations into decisions, without flapping.

A strategy says where guests should run; the policy says whether to move them now. It is a pure
function of explicit immutable values: :func:`decide` takes the (smoothed) cluster, the time, a
:class:`PolicyConfig`, the previous :class:`PolicyState` and what the controller's history knows
(:class:`Memory`), and returns a :class:`Decision` with the next state. Every guard the peers use
against flapping is here, each one configurable:

* **Smoothing** (:class:`UsageWindow`) — the measured usage of each guest (and each node's own
  load) is averaged over the last ``smoothing`` seconds, so that a one-observation spike does not
  look like an imbalance. The controller adds each observation to the window and decides on
  :meth:`UsageWindow.smoothed`. Capacity is checked on usage that rises faster: each value at
  the higher of its mean and its mean over the hold (:func:`overload_span`), which the controller
  passes as ``recent`` — an overload that lasts the hold is repaired, and no plan puts more on a
  node than its recent usage leaves room for, however empty the long average shows it.
* **Threshold** — nothing happens while the imbalance ``metric`` is at or below ``threshold``:
  ``spread`` (opendrs: the largest max − min of the weighted resources' load fractions,
  :func:`~opendrs.engine.imbalance.balance_spread`), ``cv`` (Proxmox: population σ / mean of the
  combined load ``(cpu + memory) / 2``), ``memory-spread`` (ProxLB: max − min of the memory
  fractions) — all on the usable nodes — or ``none`` (the strategy's own trigger decides).
* **Hold** — the metric must be above the threshold for ``hold`` observations in a row (Proxmox's
  hold duration). As in Proxmox the count restarts at every attempt, acted on or not, so a plan
  refused by the margin is not asked for again before ``hold`` more observations.
* **Margin** — a plan is carried out only if it improves the metric by at least ``margin``,
  relative: ``(metric − predicted) / metric ≥ margin`` (Proxmox's rule), the prediction being the
  metric of the cluster after the plan's moves. ``margin`` 0 turns the check off (ProxLB, Incus).
* **Cooldown** — a guest moved less than ``cooldown`` seconds ago is not moved again (Incus's 6 h);
  **no return** — a guest never goes back to a node it left less than ``no_return`` seconds ago;
  **avoid** — after a failed migration, that target is kept off for ``avoid_after_failure``
  seconds. All three come from :class:`Memory` and become *forbidden placements*, which every
  strategy honours and the planner's own retries add to.
* **Minimum uptime** — guests up for less than ``min_uptime`` seconds stay where they are.
* **Batch** — at most ``batch`` migrations per decision: passed to strategies that take
  ``max_moves`` (or ``batch``); other proposals are cut to the first ``batch`` migrations in
  proposal order, hard-affinity bundles whole, and the cut target is planned again.
* **Busy** — while a plan is executing nothing is decided and the hold count stands still (Proxmox
  skips its rounds without counting while a service migrates).

**Repairs** come before all of that: a guest that breaks a hard constraint now and may move — on a
node in maintenance, outside its strict node affinity, with a hard anti-affinity partner on its
node, split from its hard-affinity bundle, or on a node over a capacity limit — is moved at once,
bypassing threshold, hold and margin but never a forbidden placement. The repair is opendrs's,
whatever the strategy (the peers rely on their own evacuation — Proxmox HA's maintenance mode,
``incus cluster evacuate``): :func:`repair`, which ``opendrs plan`` and ``opendrs place
--evacuate`` use as well — ``balance``'s repair phase, asked for nothing else, greedy first and
then the exact model where a guest can go nowhere, ordered by the planner with parking moves; an
exact repair longer than ``batch`` is carried out a few steps per decision. A guest no repair can
move is logged at WARNING at every decision, naming what stops it (:attr:`Decision.stuck`).
Guests on an offline node cannot be migrated; recovering them is the HA stack's job.

**Back from maintenance.** With ``maintenance_return`` the policy remembers which guests left a
node in maintenance (:class:`PolicyState` ``evacuated``) and moves them back at once when it leaves
maintenance, as Proxmox HA and ``incus cluster restore`` do. Off by default (nothing is
remembered): the balance decides what the node gets.

**Presets** (:data:`PRESETS`) emulate the peers for the simulator's side-by-side report:

* ``opendrs`` — the defaults: spread above 15 pp for 6 observations, a plan must cut it by 25 %,
  balanced to 8 pp by ``balance``, at most 30 migrations, 6 h cooldown, 24 h no-return, 10 min
  minimum uptime, usage averaged over 6 h, failed targets avoided for 1 h.
* ``proxmox`` — Proxmox VE's auto-rebalance (``Manager.pm`` ``load_balance``): CV of the combined
  load above 0.3 for 3 rounds (a 60 s interval stands for its HA rounds), the move must improve it
  by 10 % relative, one move per trigger by ``pve-bruteforce``, one migration at a time; no cooldown
  ("there is no per-guest cooldown"), no no-return window, no smoothing, no minimum uptime. Guests
  evacuated for maintenance go back to their node when it leaves maintenance (HA's
  ``maintenance_node``).
* ``incus`` — Incus's automatic rebalancing (``cluster.rebalance.*``):
  every 15 minutes the ``incus`` strategy applies its own trigger (a 20 % gap relative to the
  busiest member), one move per run (``batch`` 1), a 6 h cooldown; no hold, margin or smoothing.
  Evacuated guests go back when the member is restored (``incus cluster restore``).
* ``proxlb`` — ProxLB 2.3.0: every 12 h (its default schedule), the memory
  spread above 10 pp (balanciness 10) triggers ``proxlb-greedy``, which moves as many guests as its
  run decides (no batch), five migrations at a time (``parallel_jobs``) and no inflow limit; no
  hold, margin, cooldown or smoothing (ProxLB reads the current memory use).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

import numpy as np

from opendrs.engine.constraints import Constraints, committed_for, current_assign, movability
from opendrs.engine.imbalance import balance_spread, cv
from opendrs.engine.planner import Plan, PlannedMove, plan_moves, plan_with_retries
from opendrs.engine.strategies import REGISTRY, get_strategy
from opendrs.engine.strategies.balance import propose_balance
from opendrs.engine.strategies.base import (
    Proposal,
    ProposedMove,
    cluster_imbalance,
    migration_cost,
)
from opendrs.engine.strategies.optimal import REPAIR_TIME_LIMIT
from opendrs.engine.usage import LoadModel, arch_groups, demand_rows, loaded_nodes, tolerance
from opendrs.model.cluster import Cluster, Guest, Node, updater
from opendrs.model.document import Path, Reader, describe
from opendrs.model.units import format_duration

Metric = Literal["spread", "cv", "memory-spread", "none"]
DecisionKind = Literal["none", "plan", "repair"]
METRICS: tuple[str, ...] = ("spread", "cv", "memory-spread", "none")
#: Strategy parameters the policy itself fills in (never options).
_RESERVED = ("cluster", "forbidden")
#: ``target_spread`` that asks ``balance`` for its repairs only.
_REPAIR_ONLY = 1e6

log = logging.getLogger(__name__)


def _frozen(value: Mapping[Any, Any] | None) -> Mapping[Any, Any]:
    return MappingProxyType(dict(value or {}))


# --------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """When to act; see the module docstring for each guard. Durations are in seconds."""

    name: str = "opendrs"
    #: Seconds between observations and decisions (the controller loop's period).
    interval: int = 300
    metric: Metric = "spread"
    #: Act only when the metric is above this (spreads are fractions: 0.15 = 15 pp).
    threshold: float = 0.15
    #: Balance to this spread (passed to strategies that take ``target_spread``).
    target: float = 0.08
    #: Observations in a row above the threshold before acting (0 acts like 1).
    hold: int = 6
    #: Least relative improvement of the metric a plan must bring; 0: no check.
    margin: float = 0.25
    cooldown: int = 6 * 3600
    no_return: int = 24 * 3600
    #: Most migrations per decision; 0: no limit.
    batch: int = 30
    min_uptime: int = 600
    #: Moving-average window over measured usage; 0: off. Long on purpose: it is each guest's
    #: demand the plan is made for, and only a lasting imbalance is worth a migration (placement
    #: changes are seen at once — it is usage that is averaged, not node loads).
    smoothing: int = 6 * 3600
    avoid_after_failure: int = 3600
    strategy: str = "balance"
    #: Extra strategy options (they win over what the policy fills in).
    options: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    #: Executor limits this policy implies (None: the cluster's settings).
    max_parallel: int | None = None
    max_node_inflow: int | None = None
    #: Move guests evacuated for maintenance back to their node when it leaves maintenance
    #: (Proxmox HA's ``maintenance_node``, ``incus cluster restore``); off: the balance decides.
    maintenance_return: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", _frozen(self.options))
        if not isinstance(self.maintenance_return, bool):
            got = self.maintenance_return
            raise ValueError(f"policy maintenance_return: expected true or false, got {got!r}")
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"policy name: expected a non-empty name, got {self.name!r}")
        if self.metric not in METRICS:
            raise ValueError(
                f"policy metric: expected one of {', '.join(METRICS)}, got {self.metric!r}"
            )
        for key in ("threshold", "target", "margin"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"policy {key}: expected a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"policy {key}: expected a finite number ≥ 0, got {value!r}")
        for key in (
            "interval",
            "hold",
            "cooldown",
            "no_return",
            "batch",
            "min_uptime",
            "smoothing",
            "avoid_after_failure",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"policy {key}: expected a whole number ≥ 0, got {value!r}")
        if self.interval < 1:
            raise ValueError(f"policy interval: must be at least 1 second, got {self.interval}")
        for key in ("max_parallel", "max_node_inflow"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"policy {key}: expected a whole number ≥ 1 or none, got {value!r}"
                )
        if self.strategy not in REGISTRY:
            raise ValueError(
                f"policy strategy: unknown strategy {self.strategy!r} "
                f"(known: {', '.join(sorted(REGISTRY))})"
            )


#: The emulated peers (see the module docstring), and opendrs's own defaults.
PRESETS: Mapping[str, PolicyConfig] = MappingProxyType(
    {
        "opendrs": PolicyConfig(),
        "proxmox": PolicyConfig(
            name="proxmox",
            interval=60,
            metric="cv",
            threshold=0.3,
            hold=3,
            margin=0.1,
            cooldown=0,
            no_return=0,
            batch=1,
            min_uptime=0,
            smoothing=0,
            avoid_after_failure=0,
            strategy="pve-bruteforce",
            max_parallel=1,
            maintenance_return=True,
        ),
        "incus": PolicyConfig(
            name="incus",
            interval=15 * 60,
            metric="none",
            threshold=0.0,
            hold=1,
            margin=0.0,
            cooldown=6 * 3600,
            no_return=0,
            batch=1,
            min_uptime=0,
            smoothing=0,
            avoid_after_failure=0,
            strategy="incus",
            max_parallel=1,
            maintenance_return=True,
        ),
        "proxlb": PolicyConfig(
            name="proxlb",
            interval=12 * 3600,
            metric="memory-spread",
            threshold=0.10,
            hold=1,
            margin=0.0,
            cooldown=0,
            no_return=0,
            batch=0,
            min_uptime=0,
            smoothing=0,
            avoid_after_failure=0,
            strategy="proxlb-greedy",
            max_parallel=5,
            max_node_inflow=5,
        ),
    }
)


# --------------------------------------------------------------------------------------------
# Metrics


_WITH_USAGE = updater(Guest, "cpu_used", "memory_used")


def _usable_fractions(cluster: Cluster, loads: LoadModel | None = None) -> dict[str, np.ndarray]:
    """Load fractions (N', R) of the usable nodes that have capacity, per CPU architecture."""
    loads = loads if loads is not None else LoadModel.build(cluster)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    usable &= np.all(loads.capacity > 0, axis=1)
    arches, group = arch_groups(cluster, usable)
    fractions = loads.fractions()
    return {arch: fractions[group == g] for g, arch in enumerate(arches)}


def measure(cluster: Cluster, metric: str, loads: LoadModel | None = None) -> float:
    """The imbalance ``metric`` of ``cluster`` on its usable nodes (0 for ``none``): of the worst
    CPU architecture where the nodes have several (guests cannot move between them).

    ``spread``: :func:`~opendrs.engine.imbalance.balance_spread` with the cluster's weights;
    ``cv``: population σ / mean of ``(cpu + memory) / 2`` (Proxmox, not normalised);
    ``memory-spread``: max − min of the memory fractions (ProxLB). Raises ValueError for another
    name. ``loads`` may pass the cluster's :class:`LoadModel` when it is built already.
    """
    return max(measure_by_arch(cluster, metric, loads).values(), default=0.0)


def measure_by_arch(
    cluster: Cluster, metric: str, loads: LoadModel | None = None
) -> dict[str, float]:
    """The imbalance ``metric`` of each CPU architecture's usable nodes (see :func:`measure`)."""
    if metric not in METRICS and metric != "none":
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    groups = _usable_fractions(cluster, loads)
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
    memory = f[:, 1]
    return float(memory.max() - memory.min()) if memory.size >= 2 else 0.0


def _rules_may_break(cluster: Cluster) -> bool:
    """Whether a hard or strict rule may be broken now (conservatively)."""
    rules = cluster.rules
    guest_index = cluster.guest_index
    usable = frozenset(n.name for n in cluster.nodes if n.usable)
    for rule in rules.node_affinity:
        if not rule.strict:
            continue
        allowed = rule.top_nodes(usable)
        for gid in rule.guests:
            j = guest_index.get(gid)
            if j is not None and cluster.guests[j].node not in allowed:
                return True
    for affinity in rules.guest_affinity:
        if not affinity.hard:
            continue
        members = [cluster.guests[guest_index[g]] for g in affinity.guests if g in guest_index]
        places = [{g.node, g.migrating_to} - {None} for g in members]
        if affinity.positive:
            if len({g.node for g in members}) > 1:
                return True
        else:
            seen: set[str | None] = set()
            for where in places:
                if where & seen:
                    return True
                seen |= where
    return False


def may_need_repair(cluster: Cluster, loads: LoadModel | None = None) -> bool:
    """A cheap, conservative screen for :func:`repairs_needed`: False only when none can be.

    Building the full constraints takes milliseconds per hundred guests, and the controller asks
    at every observation; this screen looks only at what can break a hard constraint: guests on
    a node in maintenance, hard or strict rules, guests that need an architecture, local disks,
    and nodes whose configured (all guests counted, migrating ones on both nodes) or measured
    load is over a limit.
    """
    if _rules_may_break(cluster):
        return True
    nodes, guests = cluster.nodes, cluster.guests
    n_nodes = len(nodes)
    index = cluster.node_index
    where = np.empty(len(guests), dtype=np.intp)
    extra: list[tuple[int, int]] = []
    for j, g in enumerate(guests):
        if g.arch is not None or (g.disks and g.local_disk_bytes):
            return True
        n = index.get(g.node, -1)
        where[j] = n
        if g.migrating_to is not None:
            t = index.get(g.migrating_to, -1)
            if t >= 0:
                extra.append((j, t))
    placed = where >= 0
    maintenance = np.array([n.maintenance and n.online for n in nodes], dtype=bool)
    if np.any(maintenance[where[placed]]):
        return True
    settings = cluster.settings
    cpu = np.array([g.cpu for g in guests], dtype=np.float64)
    memory = np.array([g.memory for g in guests], dtype=np.float64)
    idx = np.concatenate([where[placed], np.array([t for _, t in extra], dtype=np.intp)])
    rows = np.concatenate([np.nonzero(placed)[0], np.array([j for j, _ in extra], dtype=np.intp)])
    vcpus = np.bincount(idx, weights=cpu[rows], minlength=n_nodes)
    configured = np.bincount(idx, weights=memory[rows], minlength=n_nodes)
    cores = np.array([max(n.cpu - cluster.reserve_cpu(n), 0.0) for n in nodes])
    ram = np.array([float(max(n.memory - cluster.reserve_memory(n), 0)) for n in nodes])
    cpu_limit = cores * settings.cpu_overcommit
    ram_limit = ram * settings.memory_overcommit
    if np.any(vcpus > cpu_limit + tolerance(cpu_limit)):
        return True
    if np.any(configured > ram_limit + tolerance(ram_limit)):
        return True
    if settings.mode == "dynamic":
        model = _usage_loads(cluster, loads)
        if np.any(model.loads() > model.capacity + tolerance(model.capacity)):
            return True
    return False


def _usage_loads(cluster: Cluster, loads: LoadModel | None) -> LoadModel:
    """``loads`` when it counts measured usage, else the cluster's usage :class:`LoadModel`: the
    capacity checks read usage, even where pressure is what is balanced."""
    if loads is not None and loads.source == "usage":
        return loads
    return LoadModel.build(cluster, source="usage")


def _label(metric: str) -> str:
    return {"spread": "spread", "cv": "imbalance (CV)", "memory-spread": "memory spread"}.get(
        metric, metric
    )


def format_metric(metric: str, value: float) -> str:
    """A metric value as an operator reads it: ``22.4 pp`` for spreads, ``0.42`` for CV."""
    if metric in ("spread", "memory-spread"):
        return f"{value * 100:.1f} pp"
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


def _format_threshold(metric: str, value: float) -> str:
    if metric in ("spread", "memory-spread"):
        return f"{value * 100:g} pp"
    return f"{value:g}"


# --------------------------------------------------------------------------------------------
# Smoothing


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
        return _with_usage(cluster, *self._means(cluster))

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
        return _with_usage(cluster, *means), RecentUsage(ids, names, *values)


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
        return _with_usage(cluster, self.cpu, self.memory, self.base_cpu, self.base_memory)

    def overloads(self, cluster: Cluster, loads: LoadModel) -> bool:
        """Whether, in dynamic mode, a node's load with this usage is over its capacity
        (``loads``: ``cluster``'s :class:`LoadModel`, whose placement and pairs are reused)."""
        self._check(cluster)
        if loads.mode != "dynamic":
            return False
        loads = _usage_loads(cluster, loads)
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


def _with_usage(
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
            out[j] = _WITH_USAGE(
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


# --------------------------------------------------------------------------------------------
# Memory, state, decision


@dataclass(frozen=True, slots=True)
class Memory:
    """What the controller's history tells the policy (times on the clock ``decide`` gets)."""

    #: Guest id → the time until which it may not move again.
    cooldown_until: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: Guest id → (node it left, when), any order.
    departures: Mapping[str, tuple[tuple[str, float], ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: (guest id, node) → the time until which that target is avoided (a migration failed).
    avoid: Mapping[tuple[str, str], float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "cooldown_until", _frozen(self.cooldown_until))
        object.__setattr__(
            self,
            "departures",
            _frozen({g: tuple(tuple(d) for d in v) for g, v in self.departures.items()}),
        )
        object.__setattr__(self, "avoid", _frozen(self.avoid))


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the policy carries from one decision to the next; ``PolicyState()`` to start."""

    #: Observations in a row above the threshold since the last attempt.
    hold: int = 0
    #: When the strategy was last asked (acted on or not), and when a plan was last carried out.
    last_attempt: float | None = None
    last_action: float | None = None
    #: Guest id → the node it was on while that node was in maintenance: where it goes back to
    #: with ``maintenance_return`` (kept until it is back there, or gone).
    evacuated: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "evacuated", _frozen(self.evacuated))


@dataclass(frozen=True)
class Decision:
    """The policy's answer for one observation."""

    act: bool
    kind: DecisionKind
    #: One sentence for the operator.
    reason: str
    #: The metric now, and predicted after the plan (None when no plan was made).
    metric: float
    predicted: float | None
    proposal: Proposal | None
    plan: Plan | None
    #: The (guest, node) placements ruled out (cooldown, no-return, avoid, minimum uptime).
    forbidden: frozenset[tuple[str, str]]
    state: PolicyState
    #: Guests a repair leaves breaking a hard constraint, each with what stops it (logged at
    #: WARNING when decided; see :func:`repair`).
    stuck: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "act": self.act,
            "kind": self.kind,
            "reason": self.reason,
            "metric": self.metric,
            "predicted": self.predicted,
            "proposal": self.proposal.as_dict() if self.proposal is not None else None,
            "plan": self.plan.as_dict() if self.plan is not None else None,
            "forbidden": [list(p) for p in sorted(self.forbidden)],
            "stuck": [list(s) for s in self.stuck],
            "state": {
                "hold": self.state.hold,
                "last_attempt": self.state.last_attempt,
                "last_action": self.state.last_action,
                "evacuated": dict(sorted(self.state.evacuated.items())),
            },
        }


# --------------------------------------------------------------------------------------------
# Guards


def forbidden_placements(
    cluster: Cluster, now: float, config: PolicyConfig, memory: Memory
) -> frozenset[tuple[str, str]]:
    """The (guest, node) placements the guards rule out at ``now``.

    A guest in cooldown (``memory.cooldown_until`` after ``now``) or up for less than
    ``config.min_uptime`` may go to no node but its own; a guest may not go back to a node it left
    less than ``config.no_return`` seconds ago; ``memory.avoid`` entries hold until their time.
    Guests and nodes the cluster does not have are left out.
    """
    names = [n.name for n in cluster.nodes]
    out: set[tuple[str, str]] = set()
    known = cluster.guest_index
    node_known = cluster.node_index

    def pin(guest: Guest) -> None:
        out.update((guest.id, n) for n in names if n != guest.node)

    for guest_id, until in memory.cooldown_until.items():
        if until > now and guest_id in known:
            pin(cluster.guests[known[guest_id]])
    if config.min_uptime > 0:
        for guest in cluster.guests:
            if loaded_nodes(guest) and guest.uptime < config.min_uptime:
                pin(guest)
    if config.no_return > 0:
        for guest_id, left in memory.departures.items():
            if guest_id not in known:
                continue
            for node, when in left:
                if now - when < config.no_return and node in node_known:
                    out.add((guest_id, node))
    return frozenset(out) | _failed_targets(cluster, now, memory)


def repairs_needed(cluster: Cluster, constraints: Constraints | None = None) -> tuple[str, ...]:
    """What breaks a hard constraint now and can be repaired by migrating, as sentences.

    A guest that may move (:func:`~opendrs.engine.constraints.movability` for balancing) and sits
    on a node in maintenance, on a node its architecture or strict node affinity excludes, with a
    hard anti-affinity partner, apart from its hard-affinity partners, or on a node over a
    capacity limit. Empty when nothing needs repair.
    """
    cons = constraints if constraints is not None else Constraints.build(cluster)
    why = _broken(cluster, cons, current_assign(cluster), cons.capacity.committed())
    return tuple(dict.fromkeys(why[j] for j in sorted(why)))


def _broken(
    cluster: Cluster, cons: Constraints, assign: np.ndarray, committed: np.ndarray
) -> dict[int, str]:
    """Guest index → why it breaks a hard constraint with the guests placed as ``assign``
    (``committed``: the capacity that placement commits), for the guests that may move."""
    guests, nodes = cluster.guests, cluster.nodes
    placed = np.nonzero(assign >= 0)[0]
    where = assign[placed]
    why: dict[int, str] = {}

    def flag(j: int, reason: str) -> None:
        why.setdefault(j, reason)

    maintenance = np.array([n.maintenance and n.online for n in nodes], dtype=bool)
    for j in placed[maintenance[where]].tolist():
        flag(j, f"{guests[j].id} is on {nodes[assign[j]].name}, in maintenance")
    outside = ~cons.arch_ok[placed, where] | ~cons.strict_ok[placed, where]
    for j in placed[outside].tolist():
        flag(j, f"{guests[j].id} is on {nodes[assign[j]].name}, which its rules exclude")
    for j in range(len(guests)):
        partners = cons.hard_neg[j]
        if assign[j] >= 0 and partners.size and np.any(assign[partners] == assign[j]):
            flag(
                j,
                f"{guests[j].id} shares {nodes[assign[j]].name} with a hard anti-affinity partner",
            )
    for group in cons.groups:
        if np.unique(assign[group]).size > 1:
            for j in group.tolist():
                flag(j, f"{guests[j].id} is apart from its hard-affinity partners")
    over = cons.capacity.over(committed)
    for n in np.nonzero(over.any(axis=1))[0].tolist():
        dims = ", ".join(cons.capacity.dims[d] for d in np.nonzero(over[n])[0].tolist())
        for j in placed[where == n].tolist():
            flag(j, f"{nodes[n].name} is over capacity ({dims})")
    return {j: text for j, text in why.items() if movability(guests[j], cluster, "balance") is None}


def track_evacuations(cluster: Cluster, evacuated: Mapping[str, str]) -> dict[str, str]:
    """``evacuated`` (guest id → the node it was on in maintenance) brought up to date.

    A guest on an online node in maintenance is added with that node, unless it has an entry
    already (evacuated twice, it still belongs to the first node); an entry goes when its guest or
    node is gone, or when the guest is on its node again and the node is out of maintenance.
    """
    nodes, node_index, guest_index = cluster.nodes, cluster.node_index, cluster.guest_index
    out: dict[str, str] = {}
    for guest_id, name in evacuated.items():
        j, n = guest_index.get(guest_id), node_index.get(name)
        if j is None or n is None:
            continue
        if cluster.guests[j].node == name and not nodes[n].maintenance:
            continue
        out[guest_id] = name
    held = {n.name for n in nodes if n.maintenance and n.online}
    if held:
        for guest in cluster.guests:
            if guest.node in held and guest.id not in out:
                out[guest.id] = guest.node
    return out


def _returns(
    cluster: Cluster,
    evacuated: Mapping[str, str],
    now: float,
    config: PolicyConfig,
    memory: Memory,
    cons: Constraints,
    metric: float,
) -> tuple[Proposal, Plan, float] | None:
    """The migrations that take evacuated guests back to their nodes out of maintenance, with
    the ``config.metric`` predicted after them (``metric``: its value now).

    A guest goes back when its node is usable, it is elsewhere and not migrating, it may move, its
    architecture and strict rules allow the node, and no failed migration keeps it off the node
    (``memory.avoid``); cooldown and no-return do not hold it back (going back is the point).
    At most ``batch`` of them, in guest order; the planner orders them and leaves out any that
    would overload a node or break a hard rule. None when nobody goes back.
    """
    nodes, node_index, guest_index = cluster.nodes, cluster.node_index, cluster.guest_index
    targets: dict[str, str] = {}
    for guest_id, name in sorted(evacuated.items()):
        j, n = guest_index[guest_id], node_index[name]
        guest = cluster.guests[j]
        if (
            not nodes[n].usable
            or guest.node == name
            or guest.migrating_to is not None
            or movability(guest, cluster, "balance") is not None
            or not (cons.arch_ok[j, n] and cons.strict_ok[j, n])
            or memory.avoid.get((guest_id, name), -math.inf) > now
        ):
            continue
        targets[guest_id] = name
        if 0 < config.batch <= len(targets):
            break
    if not targets:
        return None
    plan = plan_moves(
        cluster,
        targets,
        max_parallel=config.max_parallel,
        max_node_inflow=config.max_node_inflow,
        constraints=cons,
    )
    if not plan.moves:
        return None
    assign = current_assign(cluster)
    before = cluster_imbalance(cluster)
    for move in plan.moves:
        assign[guest_index[move.guest]] = node_index[move.target]
    metric_after = measure(cluster.with_placement(_final_placement(plan)), config.metric)
    moves = tuple(
        ProposedMove(
            guest=move.guest,
            source=move.source,
            target=move.target,
            metric=config.metric,
            before=metric,
            after=metric_after,
            cost=migration_cost(cluster.guests[guest_index[move.guest]], cluster.settings),
            reason="back from maintenance",
        )
        for move in plan.moves
    )
    proposal = Proposal(
        strategy="maintenance-return",
        moves=moves,
        before=before,
        after=cluster_imbalance(cluster, assign),
        stopped="evacuated guests back on their nodes",
    )
    return proposal, plan, metric_after


def _strategy_kwargs(
    config: PolicyConfig, params: Mapping[str, inspect.Parameter], memory: Memory, now: float
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if "target_spread" in params:
        kwargs["target_spread"] = config.target
    if config.batch > 0:
        if "max_moves" in params:
            kwargs["max_moves"] = config.batch
        elif "batch" in params:
            kwargs["batch"] = config.batch
    if "cooldown_until" in params and "now" in params:
        kwargs["cooldown_until"] = dict(memory.cooldown_until)
        kwargs["now"] = now
    for name, value in config.options.items():
        if name in _RESERVED or name not in params:
            known = ", ".join(sorted(p for p in params if p not in _RESERVED))
            raise ValueError(
                f"policy {config.name}: strategy {config.strategy} has no option {name!r} "
                f"(options: {known})"
            )
        kwargs[name] = value
    return kwargs


def truncate(
    cluster: Cluster, proposal: Proposal, batch: int, constraints: Constraints | None = None
) -> Proposal:
    """``proposal`` cut to at most ``batch`` migrations (``batch`` 0: unchanged).

    Migrations are taken in proposal order, one *unit* at a time — a guest, or the members of a
    hard-affinity bundle that go to the same node, which stay whole; a unit that does not fit in
    what is left of the batch is skipped. The cut proposal's predicted figures are recomputed.
    """
    net = proposal.net_moves()
    if batch <= 0 or len(net) <= batch:
        return proposal
    cons = constraints if constraints is not None else Constraints.build(cluster)
    order = {m.guest: i for i, m in reversed(list(enumerate(proposal.moves)))}
    gidx = cluster.guest_index
    units: dict[tuple[int, str], list[str]] = {}
    for move in sorted(net, key=lambda m: order[m.guest]):
        j = gidx[move.guest]
        group = int(cons.group_of[j])
        key = (group if group >= 0 else -1 - j, move.target)
        units.setdefault(key, []).append(move.guest)
    kept: set[str] = set()
    for members in units.values():
        if len(kept) + len(members) <= batch:
            kept.update(members)
    moves = tuple(m for m in proposal.moves if m.guest in kept)
    assign = current_assign(cluster)
    for m in net:
        if m.guest in kept:
            assign[gidx[m.guest]] = cluster.node_index[m.target]
    stopped = f"{proposal.stopped}; cut to {len(kept)} of {len(net)} migrations (batch {batch})"
    return replace(proposal, moves=moves, after=cluster_imbalance(cluster, assign), stopped=stopped)


def _final_placement(plan: Plan) -> dict[str, str]:
    out: dict[str, str] = {}
    for move in plan.moves:
        out[move.guest] = move.target
    return out


class _Limits(NamedTuple):
    """The executor limits a plan is made for (None: the cluster's settings)."""

    max_parallel: int | None
    max_node_inflow: int | None


def _plan(
    cluster: Cluster,
    propose: Callable[[frozenset[tuple[str, str]]], Proposal],
    forbidden: frozenset[tuple[str, str]],
    config: PolicyConfig | _Limits,
    cons: Constraints,
) -> tuple[Proposal, Plan]:
    """Propose and plan; then keep every planned move (parking included) off ``forbidden``."""

    def ask(more: frozenset[tuple[str, str]]) -> Proposal:
        return propose(forbidden | more)

    proposal, plan = plan_with_retries(
        cluster,
        ask,
        max_parallel=config.max_parallel,
        max_node_inflow=config.max_node_inflow,
        constraints=cons,
    )
    dropped: set[str] = set()
    while True:
        bad = sorted({m.guest for m in plan.moves if (m.guest, m.target) in forbidden})
        if not bad:
            break
        dropped.update(bad)
        target = {m.guest: m.target for m in proposal.net_moves() if m.guest not in dropped}
        plan = plan_moves(
            cluster,
            target,
            max_parallel=config.max_parallel,
            max_node_inflow=config.max_node_inflow,
            constraints=cons,
        )
    if dropped:
        note = (
            "Left out " + ", ".join(sorted(dropped)) + ": their only safe order parks them on a "
            "node the policy forbids."
        )
        plan = replace(plan, feasible=False, problems=(*plan.problems, note))
    return proposal, plan


# --------------------------------------------------------------------------------------------
# Repairs: one entry point for ``opendrs plan``, ``opendrs place --evacuate`` and the daemon

#: At most this many stuck guests are named one by one in the log.
STUCK_SHOWN = 10


@dataclass(frozen=True)
class Repair:
    """A repair: what breaks a hard constraint, the plan that repairs it, and what it leaves.

    ``stuck`` holds, per guest the plan leaves breaking a hard constraint, its id and one
    sentence naming it: what it breaks, and what stops it on every other node.
    """

    needed: tuple[str, ...]
    proposal: Proposal | None = None
    plan: Plan | None = None
    stuck: tuple[tuple[str, str], ...] = ()


def repair(
    cluster: Cluster,
    *,
    forbidden: frozenset[tuple[str, str]] = frozenset(),
    constraints: Constraints | None = None,
    batch: int = 0,
    max_parallel: int | None = None,
    max_node_inflow: int | None = None,
) -> Repair:
    """Repair what breaks a hard constraint in ``cluster``, never onto a ``forbidden`` placement.

    ``balance``'s repair: each guest that must move goes to its best allowed node; when one can
    go nowhere, the exact model moves other guests to make room (bounded in time, repeatable),
    and the planner orders it all, parking a guest on a spare node where a cycle needs it. At most
    ``batch`` migrations (0: no limit): the greedy repair asks for no more, an exact repair is
    planned whole and its first steps kept. ``stuck`` names what even the whole plan leaves.
    """
    cons = constraints if constraints is not None else Constraints.build(cluster)
    needed = repairs_needed(cluster, cons)
    if not needed:
        return Repair(())

    limit = [batch or None]

    def propose(forb: frozenset[tuple[str, str]]) -> Proposal:
        found = propose_balance(
            cluster, forbidden=forb, target_spread=_REPAIR_ONLY, max_moves=limit[0]
        )
        found = replace(found, stopped="repairs only")
        return found if "repair" in found.options else truncate(cluster, found, batch, cons)

    limits = _Limits(max_parallel, max_node_inflow)
    proposal, plan = _plan(cluster, propose, forbidden, limits, cons)
    if "needs" in proposal.options.get("repair", {}):  # an exact repair longer than the batch
        limit[0] = None
        proposal, plan = _plan(cluster, propose, forbidden, limits, cons)
    exact = "repair" in proposal.options
    stuck: tuple[tuple[str, str], ...] = ()
    if exact or not batch or len(proposal.net_moves()) < batch:
        stuck = stuck_after(cluster, cons, proposal, plan, forbidden)
    if exact:
        plan = first_moves(plan, batch, cluster, cons)
    return Repair(needed, proposal, plan, stuck)


def _failed_targets(cluster: Cluster, now: float, memory: Memory) -> frozenset[tuple[str, str]]:
    """The placements only a failed migration rules out (``memory.avoid``), at ``now``."""
    known, nodes = cluster.guest_index, cluster.node_index
    return frozenset(
        (guest, node)
        for (guest, node), until in memory.avoid.items()
        if until > now and guest in known and node in nodes
    )


def _repair_within_guards(
    cluster: Cluster,
    cons: Constraints,
    config: PolicyConfig,
    guarded: frozenset[tuple[str, str]],
    failed: frozenset[tuple[str, str]],
) -> tuple[Repair, frozenset[tuple[str, str]]]:
    """The repair within the policy's guards (``guarded``: cooldown, minimum uptime, no-return
    and failed targets); when that leaves guests stuck, the repair kept off only the ``failed``
    targets, if it leaves fewer — a guest must leave a node in maintenance or a broken rule
    whatever its cooldown. Also the placements the repair kept off."""

    def attempt(forbidden: frozenset[tuple[str, str]]) -> Repair:
        return repair(
            cluster,
            forbidden=forbidden,
            constraints=cons,
            batch=config.batch,
            max_parallel=config.max_parallel,
            max_node_inflow=config.max_node_inflow,
        )

    fixed = attempt(guarded)
    if not fixed.stuck or guarded == failed:
        return fixed, guarded
    relaxed = attempt(failed)
    if len(relaxed.stuck) >= len(fixed.stuck):
        return fixed, guarded
    return relaxed, failed


def first_moves(plan: Plan, batch: int, cluster: Cluster, cons: Constraints) -> Plan:
    """``plan`` cut to at most ``batch`` migrations (0: whole): its first steps, whole; when the
    first step alone has more, its first guests (hard-affinity bundles whole, at least one)."""
    if batch <= 0 or len(plan.moves) <= batch:
        return plan
    kept: list[PlannedMove] = []
    for step in plan.by_step():
        if len(kept) + len(step) > batch:
            if not kept:
                kept = _first_units(step, batch, cluster, cons)
            break
        kept.extend(step)
    note = f"Cut to the first {len(kept)} of {len(plan.moves)} migrations (batch {batch})."
    return replace(plan, moves=tuple(kept), problems=(*plan.problems, note))


def _first_units(
    step: tuple[PlannedMove, ...], batch: int, cluster: Cluster, cons: Constraints
) -> list[PlannedMove]:
    """The moves of one step, a guest (or a bundle going to one node) at a time, up to
    ``batch`` migrations and at least one unit."""
    units: dict[tuple[int, str], list[PlannedMove]] = {}
    for move in step:
        j = cluster.guest_index[move.guest]
        group = int(cons.group_of[j])
        units.setdefault((group if group >= 0 else -1 - j, move.target), []).append(move)
    kept: list[PlannedMove] = []
    for moves in units.values():
        if kept and len(kept) + len(moves) > batch:
            break
        kept.extend(moves)
    return kept


def stuck_after(
    cluster: Cluster,
    cons: Constraints,
    proposal: Proposal | None,
    plan: Plan,
    forbidden: frozenset[tuple[str, str]] = frozenset(),
) -> tuple[tuple[str, str], ...]:
    """The guests that still break a hard constraint once ``plan`` has run, each with one
    sentence: where it is, what it breaks, what stops it on each other node, and — when the
    proposal says — what the exact repair found."""
    assign = current_assign(cluster)
    for move in plan.moves:
        assign[cluster.guest_index[move.guest]] = cluster.node_index[move.target]
    committed = committed_for(cons, assign)
    broken = _broken(cluster, cons, assign, committed)
    if not broken:
        return ()
    verdict = _verdict(proposal.options.get("repair") if proposal is not None else None)
    unreachable = {g for g, _t in plan.unreachable}
    room = cons.capacity.limit - committed
    out = []
    for j in sorted(broken):
        guest = cluster.guests[j]
        headroom = room.copy()  # without the guest itself
        headroom[int(assign[j])] += cons.guest_demand(j)
        said = broken[j] if broken[j].startswith(f"{guest.id} ") else f"{guest.id}: {broken[j]}"
        text = f"{said}; elsewhere: " + _rejections(cons, j, assign, headroom, forbidden)
        if guest.id in unreachable:
            text += "; no safe migration order reaches its target"
        out.append((guest.id, text + verdict))
    return tuple(out)


def _rejections(
    cons: Constraints,
    j: int,
    assign: np.ndarray,
    headroom: np.ndarray,
    forbidden: frozenset[tuple[str, str]],
) -> str:
    """What stops guest ``j`` on each other node (the first hard filter that fails there),
    nodes with the same reason together; capacity with the numbers of the closest node."""
    nodes = cons.cluster.nodes
    guest = cons.cluster.guests[j].id
    demand = cons.guest_demand(j)
    left = np.ones(len(nodes), dtype=bool)
    left[int(assign[j])] = False
    groups: dict[str, list[int]] = {}
    kept = np.array([(guest, n.name) in forbidden for n in nodes], dtype=bool) & left
    if kept.any():
        policy = "kept off by the policy (cooldown, no return, minimum uptime or a failed move)"
        groups[policy] = np.nonzero(kept)[0].tolist()
        left &= ~kept
    for name, mask in cons.hard_masks(j, assign, headroom, demand):
        failing = np.nonzero(left & ~mask)[0]
        left &= mask
        if failing.size == 0:
            continue
        if name == "capacity":
            closest = int(failing[np.argmax(_room_share(headroom[failing], demand))])
            why = cons.explain(name, j, closest, assign, headroom, demand)
            if failing.size > 1:
                why += f" on {nodes[closest].name}, the closest"
            groups.setdefault(why, []).extend(failing.tolist())
            continue
        for n in failing.tolist():
            why = cons.explain(name, j, n, assign, headroom, demand)
            groups.setdefault(why, []).append(n)
    if left.any():
        groups["allowed, but the repair puts nothing there"] = np.nonzero(left)[0].tolist()
    if not groups:
        return "no other node"
    return "; ".join(f"{_names(cons, where)}: {why}" for why, where in groups.items())


def _room_share(headroom: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """How much of ``demand`` the least roomy dimension of each row of ``headroom`` holds."""
    need = np.where(demand > 0, demand, 1.0)
    share = np.where(demand[None, :] > 0, np.maximum(headroom, 0.0) / need[None, :], np.inf)
    return share.min(axis=1)


def _names(cons: Constraints, nodes: list[int], shown: int = 6) -> str:
    """``a, b, c`` — at most ``shown`` node names, then how many more."""
    names = [cons.cluster.nodes[n].name for n in nodes]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _verdict(info: object) -> str:
    """What the exact repair says about a guest it leaves (empty when it did not run)."""
    if not isinstance(info, Mapping):
        return ""
    status = info.get("exact")
    if "needs" in info:
        return (
            f" — the exact repair takes {info['needs']} migrations, more than max_moves "
            f"{info['max_moves']}"
        )
    if status == "INFEASIBLE" and info.get("complete"):
        return " — no placement repairs it, even moving other guests"
    if status == "INFEASIBLE":
        return (
            f" — no repair moving the guests of the {info.get('nodes')} nodes the exact "
            "repair looked at"
        )
    if status in ("UNKNOWN", "MODEL_INVALID"):
        return f" — the exact repair found none within {REPAIR_TIME_LIMIT:g} s"
    return ""


def warn_stuck(stuck: tuple[tuple[str, str], ...], logger: logging.Logger | None = None) -> None:
    """Each stuck guest at WARNING (the first :data:`STUCK_SHOWN`, then how many more)."""
    out = logger if logger is not None else log
    for _guest, why in stuck[:STUCK_SHOWN]:
        out.warning("repair stuck: %s", why)
    if len(stuck) > STUCK_SHOWN:
        out.warning("repair stuck: %d more guests", len(stuck) - STUCK_SHOWN)


# --------------------------------------------------------------------------------------------
# Why not: what keeps the candidates where they are, when a decision moves nothing

#: :func:`~opendrs.engine.constraints.movability` reasons as group labels (prefix → label;
#: ``{}`` is the reason itself), per-guest details left out.
_HELD_LABELS: tuple[tuple[str, str], ...] = (
    ("HA state ", "in {}"),
    ("local device ", "with local devices"),
    ("local disks", "with local disks"),
    ("already migrating", "already migrating"),
    ("container", "containers (restart migration not allowed)"),
)
#: Guests whose exclusion is checked for room in one array (guests × nodes × dimensions).
_WHY_CHUNK = 512
#: How many of the roomiest nodes are tried first for every guest that may move.
_WHY_ROOMIEST = 16


class WhyNot(NamedTuple):
    """The candidates of a decision that moves nothing: how many, how many may move, and the
    others grouped by what excludes them (label, count), the largest group first."""

    candidates: int
    movable: int
    excluded: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        groups = ", ".join(f"{count} {label}" for label, count in self.excluded)
        n = self.candidates
        if n == 0:
            return "no candidates (no running guest on a usable node)"
        head = f"{n} candidate{'s' if n != 1 else ''}"
        if self.movable == 0:
            return f"{head}, all excluded: {groups}"
        if not groups:
            return f"{head}, all may move"
        return f"{head}: {self.movable} may move; {groups}"


def _uptime_label(seconds: float) -> str:
    return f"up for less than min_uptime {format_duration(seconds)}"


def _held_label(reason: str, cluster: Cluster) -> str:
    """A :func:`movability` reason as a group label."""
    if reason.startswith("up for "):
        return _uptime_label(cluster.settings.min_uptime)
    for prefix, label in _HELD_LABELS:
        if reason.startswith(prefix):
            return label.format(reason)
    return reason


def _guard_label(guest: Guest, now: float, config: PolicyConfig, memory: Memory) -> str | None:
    """The policy guard that keeps ``guest`` on its node (as :func:`forbidden_placements`)."""
    if memory.cooldown_until.get(guest.id, -math.inf) > now:
        return "in cooldown"
    if config.min_uptime > 0 and guest.uptime < config.min_uptime and loaded_nodes(guest):
        return _uptime_label(config.min_uptime)
    return None


def why_not(
    cluster: Cluster, now: float, config: PolicyConfig, memory: Memory, cons: Constraints
) -> WhyNot:
    """Why the candidates — running guests on usable nodes — stay where they are.

    Each is counted under the first thing that excludes it: :func:`movability`, then the
    policy's cooldown and minimum uptime, then, node by node, no-return and failed migrations
    (``memory``), the hard rules and room (``cons``: the capacity the decision checks). A guest
    with a node left to go to may move. Deterministic; pure.
    """
    usable = {n.name for n in cluster.nodes if n.usable}
    labels: dict[str, int] = {}
    free: list[int] = []
    for j, guest in enumerate(cluster.guests):
        if guest.node not in usable or guest.state == "stopped":
            continue
        label = movability(guest, cluster, "balance")
        held = _held_label(label, cluster) if label is not None else None
        held = held or _guard_label(guest, now, config, memory)
        if held is None:
            free.append(j)
        else:
            labels[held] = labels.get(held, 0) + 1
    candidates = len(free) + sum(labels.values())
    movable = 0
    for label in _targets_left(cluster, now, config, memory, cons, free):
        if label is None:
            movable += 1
        else:
            labels[label] = labels.get(label, 0) + 1
    excluded = tuple(sorted(labels.items(), key=lambda item: (-item[1], item[0])))
    return WhyNot(candidates, movable, excluded)


def _policy_off(
    cluster: Cluster, now: float, config: PolicyConfig, memory: Memory, guests: set[str]
) -> dict[str, dict[int, str]]:
    """Guest id → node index → which guard keeps the guest off that node: ``no_return`` or a
    failed migration (``memory.avoid``), for ``guests``."""
    node_index = cluster.node_index
    off: dict[str, dict[int, str]] = {}
    if config.no_return > 0:
        gone = f"no_return {format_duration(config.no_return)}"
        for guest_id, left in memory.departures.items():
            for node, when in left:
                if guest_id in guests and now - when < config.no_return and node in node_index:
                    off.setdefault(guest_id, {})[node_index[node]] = gone
    for (guest_id, node), until in memory.avoid.items():
        if until > now and guest_id in guests and node in node_index:
            off.setdefault(guest_id, {}).setdefault(
                node_index[node], "avoided after a failed migration"
            )
    return off


def _targets_left(
    cluster: Cluster,
    now: float,
    config: PolicyConfig,
    memory: Memory,
    cons: Constraints,
    free: list[int],
) -> list[str | None]:
    """For each guest of ``free`` (indices of guests that may move), None when some other
    usable node takes it, else why none does."""
    if not free:
        return []
    off = _policy_off(cluster, now, config, memory, {cluster.guests[j].id for j in free})
    assign = current_assign(cluster)
    cap = cons.capacity
    room = cap.limit - cap.committed() + tolerance(cap.limit)
    left = _TargetCheck(cons, assign, off, room, frozenset(free))
    found: dict[int, str | None] = {}
    every = np.array(free, dtype=np.intp)
    # Most guests fit on one of the roomiest nodes: try those first, then every node.
    share = np.where(cap.limit > 0, room / np.where(cap.limit > 0, cap.limit, 1.0), np.inf)
    roomiest = np.argsort(-share.min(axis=1), kind="stable")[:_WHY_ROOMIEST]
    for j in every[_somewhere(cons, assign, room, every, roomiest)].tolist():
        if left.alone(j):
            found[j] = None
    rest = np.array([j for j in free if j not in found], dtype=np.intp)
    for start in range(0, len(rest), _WHY_CHUNK):
        chunk = rest[start : start + _WHY_CHUNK]
        other = np.repeat(cons.usable[None, :], len(chunk), axis=0)
        other[np.arange(len(chunk)), assign[chunk]] = False
        rules = cons.arch_ok[chunk] & cons.strict_ok[chunk]
        fits = np.all(cap.demand[chunk][:, None, :] <= room[None, :, :], axis=2)
        for row, j in enumerate(chunk.tolist()):
            found[j] = left(j, other[row], rules[row], fits[row])
    return [found[j] for j in free]


def _somewhere(
    cons: Constraints, assign: np.ndarray, room: np.ndarray, guests: np.ndarray, nodes: np.ndarray
) -> np.ndarray:
    """(G',) whether one of ``nodes`` other than its own is usable, allowed by architecture and
    strict node affinity, and has room, for each of ``guests``."""
    pick = np.ix_(guests, nodes)
    ok = cons.arch_ok[pick] & cons.strict_ok[pick] & cons.usable[nodes][None, :]
    ok &= assign[guests][:, None] != nodes[None, :]
    ok &= np.all(cons.capacity.demand[guests][:, None, :] <= room[nodes][None, :, :], axis=2)
    return np.any(ok, axis=1)


#: What keeps a guest off another node, in reporting order, and the label when it is the only
#: thing (None: named in a list).
_NODE_GUARDS: tuple[tuple[str, str | None], ...] = (
    ("no_return", None),
    ("avoided", None),
    ("rules", "with no node their rules allow"),
    ("room", "with no node that has room"),
)


class _TargetCheck(NamedTuple):
    """Whether a guest that may move has another usable node to go to."""

    cons: Constraints
    assign: np.ndarray
    #: Guest id → node index → the policy guard that keeps it off the node.
    off: Mapping[str, Mapping[int, str]]
    #: (N, D) free capacity, rounding slack included.
    room: np.ndarray
    free: frozenset[int]

    def alone(self, j: int) -> bool:
        """Whether guest ``j`` is free of bundles, hard anti-affinity and node guards."""
        cons = self.cons
        guest_id = cons.cluster.guests[j].id
        return cons.group_of[j] < 0 and not cons.hard_neg[j].size and guest_id not in self.off

    def __call__(
        self, j: int, other: np.ndarray, rules: np.ndarray, fits: np.ndarray
    ) -> str | None:
        """None when guest ``j`` (or its hard-affinity bundle) may go to one of the ``other``
        nodes (``rules``, ``fits``: the nodes the rules allow, with room), else why not."""
        cons, assign = self.cons, self.assign
        group = int(cons.group_of[j])
        if group >= 0:  # the bundle moves whole: its demand, its members' anti-affinity
            members = cons.groups[group]
            if not self.free.issuperset(members.tolist()):
                return "with hard-affinity partners that may not move"
            assign = assign.copy()
            assign[members] = -1
            fits = np.all(demand_rows(cons.capacity, members.tolist()) <= self.room, axis=1)
        if cons.hard_neg[j].size:
            rules = rules & ~cons.occupied(assign, cons.hard_neg[j])
        if not other.any():
            return "with no other usable node"
        guards = self.off.get(cons.cluster.guests[j].id, {})
        kept = np.zeros_like(other)
        kept[list(guards)] = True
        if np.any(other & ~kept & rules & fits):
            return None
        kinds = {why.split()[0]: why for n, why in guards.items() if other[n]}
        if np.any(other & ~kept & ~rules):
            kinds["rules"] = "rules"
        if np.any(other & ~kept & rules & ~fits):
            kinds["room"] = "no room"
        named = [(kinds[key], alone) for key, alone in _NODE_GUARDS if key in kinds]
        if len(named) == 1 and named[0][1] is not None:
            return named[0][1]
        return "with no node to go to (" + ", ".join(text for text, _alone in named) + ")"


# --------------------------------------------------------------------------------------------
# The decision


def decide(
    cluster: Cluster,
    now: float,
    config: PolicyConfig,
    state: PolicyState,
    memory: Memory,
    *,
    busy: bool,
    recent: RecentUsage | None = None,
) -> Decision:
    """Whether to act on ``cluster`` at ``now``, and with which plan (see the module docstring).

    ``cluster`` is the observation to decide on (smoothed by the caller, see
    :class:`UsageWindow`); ``busy`` says that a plan is still executing. ``recent``, when given,
    is the usage capacity is checked on (:meth:`UsageWindow.recent`, over the hold:
    :func:`overload_span`): repairs are found and made with it, and every plan is ordered against
    it, while the metric and the strategy see ``cluster``'s. Pure and deterministic. Raises
    ValueError for a strategy option the strategy refuses, or a ``recent`` made for another
    cluster.
    """
    loads = LoadModel.build(cluster)
    by_arch = measure_by_arch(cluster, config.metric, loads)
    metric = max(by_arch.values(), default=0.0)
    label, shown = _label(config.metric), format_by_arch(config.metric, by_arch)
    limit = _format_threshold(config.metric, config.threshold)
    empty: frozenset[tuple[str, str]] = frozenset()

    def decision(
        reason: str,
        new_state: PolicyState,
        *,
        act: bool = False,
        kind: DecisionKind = "none",
        predicted: float | None = None,
        proposal: Proposal | None = None,
        plan: Plan | None = None,
        forbidden: frozenset[tuple[str, str]] = empty,
    ) -> Decision:
        return Decision(
            act, kind, reason, metric, predicted, proposal, plan, forbidden, new_state, fixed.stuck
        )

    fixed = Repair(())  # the repair, once made (decisions name what it leaves stuck)
    tracked = track_evacuations(cluster, state.evacuated) if config.maintenance_return else {}
    if tracked != state.evacuated:
        state = replace(state, evacuated=tracked)
    if busy:
        what = "" if config.metric == "none" else f" ({label} {shown})"
        return decision(f"a plan is still executing: no new decision{what}", state)

    forbidden = forbidden_placements(cluster, now, config, memory)
    # The cluster capacity is checked on: ``recent``'s usage, built when first needed.
    built: list[Constraints] = []
    checked_built: list[Cluster] = []

    def checked() -> Cluster:
        if not checked_built:
            checked_built.append(recent.apply(cluster) if recent is not None else cluster)
        return checked_built[0]

    def constraints() -> Constraints:
        """The hard constraints, capacity on the usage it is checked on."""
        if not built:
            built.append(Constraints.build(checked()))
        return built[0]

    attempted = replace(state, hold=0, last_attempt=now)
    acted = replace(attempted, last_action=now)

    # 1. Repairs, at once (capacity judged on the usage it is checked on).
    screen = may_need_repair(cluster, loads) or (
        recent is not None and recent.overloads(cluster, loads)
    )
    kept_off = forbidden
    if screen:
        fixed, kept_off = _repair_within_guards(
            checked(), constraints(), config, forbidden, _failed_targets(cluster, now, memory)
        )
    overridden = (
        ""
        if kept_off == forbidden
        else " and the cooldown, minimum uptime and no-return it could not keep"
    )
    broken = fixed.needed
    repair_note = ""
    if broken and fixed.proposal is not None and fixed.plan is not None:
        proposal, plan = fixed.proposal, fixed.plan
        what = broken[0] + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else "")
        if plan.moves:
            predicted = measure(cluster.with_placement(_final_placement(plan)), config.metric)
            n = len(plan.moves)
            return decision(
                f"repair: {what}; {n} migration{'s' if n != 1 else ''}, "
                f"bypassing threshold, hold and margin{overridden}",
                acted,
                act=True,
                kind="repair",
                predicted=predicted,
                proposal=proposal,
                plan=plan,
                forbidden=kept_off,
            )
        repair_note = f"; repair needed ({what}) but no allowed migration reaches it"

    # 1b. Guests back from maintenance, at once.
    if config.maintenance_return and state.evacuated:
        back = _returns(cluster, state.evacuated, now, config, memory, constraints(), metric)
        if back is not None:
            proposal, plan, predicted = back
            n = len(plan.moves)
            nodes = ", ".join(sorted({m.target for m in plan.moves}))
            return decision(
                f"{n} guest{'s' if n != 1 else ''} back to {nodes}, out of maintenance, "
                f"bypassing threshold, hold and margin{repair_note}",
                acted,
                act=True,
                kind="repair",
                predicted=predicted,
                proposal=proposal,
                plan=plan,
                forbidden=forbidden,
            )

    # 2. Threshold and hold.
    need = max(config.hold, 1)
    if config.metric != "none" and metric <= config.threshold:
        return decision(
            f"{label} {shown} at or below threshold {limit}: nothing to do{repair_note}",
            replace(state, hold=0),
            forbidden=forbidden,
        )
    count = state.hold + 1
    if config.metric == "none":
        trigger = f"no policy metric: strategy {config.strategy}'s own trigger decides"
    else:
        trigger = (
            f"{label} {shown} above threshold {limit} for {min(count, need)} of {need} observations"
        )
    if count < need:
        return decision(
            f"{trigger}; waiting{repair_note}", replace(state, hold=count), forbidden=forbidden
        )

    # 3. Ask the strategy.
    info = get_strategy(config.strategy)
    params = inspect.signature(info.propose).parameters
    kwargs = _strategy_kwargs(config, params, memory, now)

    def propose(forb: frozenset[tuple[str, str]]) -> Proposal:
        found = info.propose(cluster, forbidden=forb, **kwargs)
        return truncate(cluster, found, config.batch, constraints())

    proposal, plan = _plan(cluster, propose, forbidden, config, constraints())
    if not proposal.net_moves():
        why = why_not(cluster, now, config, memory, constraints())
        # All excluded: that is the reason, whatever the strategy says.
        stopped = f" ({proposal.stopped})" if why.movable or not why.candidates else ""
        return decision(
            f"{trigger}; strategy {config.strategy} proposes no migration{stopped}; {why}"
            + repair_note,
            attempted,
            proposal=proposal,
            plan=plan,
            forbidden=forbidden,
        )
    if not plan.moves:
        problem = plan.problems[0] if plan.problems else "no safe order"
        return decision(
            f"{trigger}; none of the proposed migrations can be ordered safely ({problem})"
            + repair_note,
            attempted,
            proposal=proposal,
            plan=plan,
            forbidden=forbidden,
        )
    n = len(plan.moves)
    migrations = f"{n} migration{'s' if n != 1 else ''}"
    if config.metric == "none":
        return decision(
            f"{trigger}; it proposes {migrations} ({proposal.stopped}){repair_note}",
            acted,
            act=True,
            kind="plan",
            proposal=proposal,
            plan=plan,
            forbidden=forbidden,
        )
    predicted = measure(cluster.with_placement(_final_placement(plan)), config.metric)
    after = format_metric(config.metric, predicted)
    gain = (metric - predicted) / metric if metric > 0 else 0.0
    if config.margin > 0 and gain < config.margin - 1e-12:
        return decision(
            f"{trigger}; the plan would bring it to {after} with {migrations}, "
            f"{gain * 100:.0f} % better, less than the margin {config.margin * 100:g} %"
            + repair_note,
            attempted,
            predicted=predicted,
            proposal=proposal,
            plan=plan,
            forbidden=forbidden,
        )
    return decision(
        f"{trigger}; plan brings it to {after} with {migrations}{repair_note}",
        acted,
        act=True,
        kind="plan",
        predicted=predicted,
        proposal=proposal,
        plan=plan,
        forbidden=forbidden,
    )


# --------------------------------------------------------------------------------------------
# Reading a policy from a configuration file


POLICY_KEYS: tuple[str, ...] = (
    "preset",
    "name",
    "interval",
    "metric",
    "threshold",
    "target",
    "hold",
    "margin",
    "cooldown",
    "no_return",
    "batch",
    "min_uptime",
    "smoothing",
    "avoid_after_failure",
    "strategy",
    "options",
    "max_parallel",
    "max_node_inflow",
    "maintenance_return",
)
#: Each duration's range in seconds, (shortest, longest): configuration that validates runs.
_DURATIONS: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "interval": (0, 7 * 86400),  # 0 is refused with its own message
        "cooldown": (0, 365 * 86400),
        "no_return": (0, 365 * 86400),
        "min_uptime": (0, 365 * 86400),
        "smoothing": (0, 30 * 86400),
        "avoid_after_failure": (0, 365 * 86400),
    }
)
#: Each fraction's largest value: a spread or CV threshold and target (100 = 10000 %), and the
#: relative improvement a plan must bring (at most all of it).
_FRACTIONS: Mapping[str, float] = MappingProxyType(
    {"threshold": 100.0, "target": 100.0, "margin": 1.0}
)
_MAX_COUNT = 100_000
_MAX_HOLD = 10_000
#: Most observations the smoothing window keeps (``smoothing / interval``): the window is
#: memory, and it is copied at every observation.
_MAX_SAMPLES = 10_000
#: Largest size of a whole number and of a number a strategy option may take.
_MAX_OPTION_INT = 2**31 - 1
_MAX_OPTION_NUMBER = 1e15


def _fraction(reader: Reader, value: object, path: Path, maximum: float) -> float:
    """A number from 0 to ``maximum``, or a percentage written ``15%`` (0.15)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        text = value.strip()[:-1].strip()
        try:
            number = float(text)
        except ValueError:
            reader.fail(path, f"cannot read {describe(value)} as a percentage (example: 15%)")
        if not math.isfinite(number) or number < 0:
            reader.fail(path, f"must be a finite percentage ≥ 0, got {describe(value)}")
        if number / 100 > maximum:
            reader.fail(path, f"must not be more than {maximum * 100:g}%, got {describe(value)}")
        return number / 100
    return reader.number(value, path, maximum=maximum)


def _option_value(reader: Reader, value: object, path: Path, default: object) -> object:
    """A strategy option checked against the type of its default, as ``opendrs plan -o`` does."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            reader.fail(path, f"expected true or false, got {describe(value)}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            reader.fail(path, f"expected a whole number, got {describe(value)}")
        if abs(value) > _MAX_OPTION_INT:
            reader.fail(
                path, f"must be from -{_MAX_OPTION_INT} to {_MAX_OPTION_INT}, got {describe(value)}"
            )
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            reader.fail(path, f"expected a number, got {describe(value)}")
        if not math.isfinite(value):
            reader.fail(path, f"expected a finite number, got {describe(value)}")
        if abs(value) > _MAX_OPTION_NUMBER:
            reader.fail(
                path,
                f"must be from -{_MAX_OPTION_NUMBER:g} to {_MAX_OPTION_NUMBER:g}, "
                f"got {describe(value)}",
            )
        return float(value)
    if isinstance(default, str) and not isinstance(value, str):
        reader.fail(path, f"expected text, got {describe(value)}")
    if isinstance(value, list):
        return tuple(value)
    return value


def parse_policy(
    reader: Reader, value: object, path: Path, base: PolicyConfig | None = None
) -> PolicyConfig:
    """A :class:`PolicyConfig` from a configuration mapping (YAML or JSON) at ``path``.

    Keys are the fields of :class:`PolicyConfig`, plus ``preset`` (a name in :data:`PRESETS`) to
    start from instead of ``base`` (default :class:`PolicyConfig()`). Durations are seconds or
    strings such as ``5m``, ``6h``, ``1d 6h``; ``threshold``, ``target`` and ``margin`` are
    fractions (``0.15``) or percentages (``15%``); ``max_parallel`` and ``max_node_inflow`` may
    be null. ``options`` are checked against the strategy's parameters and their types. A new
    ``strategy`` without ``options`` starts with none. Errors are :class:`DocumentError` (one line
    naming the key).
    """
    start = base if base is not None else PolicyConfig()
    mapping = reader.mapping(value, path)
    reader.check_keys(mapping, path, POLICY_KEYS)
    if "preset" in mapping:
        start = PRESETS[reader.choice(mapping["preset"], (*path, "preset"), tuple(PRESETS))]
    fields: dict[str, Any] = {}
    if "name" in mapping:
        # The history keeps this name: no blanks around it, no control characters.
        fields["name"] = reader.plain_name(mapping["name"], (*path, "name"))
    for key, (shortest, longest) in _DURATIONS.items():
        if key in mapping:
            fields[key] = reader.duration(
                mapping[key], (*path, key), minimum=shortest, maximum=longest
            )
    if fields.get("interval") == 0:
        reader.fail((*path, "interval"), "must be at least 1 second")
    if "metric" in mapping:
        fields["metric"] = reader.choice(mapping["metric"], (*path, "metric"), METRICS)
    for key, largest in _FRACTIONS.items():
        if key in mapping:
            fields[key] = _fraction(reader, mapping[key], (*path, key), largest)
    for key, most in (("hold", _MAX_HOLD), ("batch", _MAX_COUNT)):
        if key in mapping:
            fields[key] = reader.integer(mapping[key], (*path, key), minimum=0, maximum=most)
    for key in ("max_parallel", "max_node_inflow"):
        if key in mapping:
            item = mapping[key]
            fields[key] = (
                None
                if item is None
                else reader.integer(item, (*path, key), minimum=1, maximum=_MAX_COUNT)
            )
    if "maintenance_return" in mapping:
        fields["maintenance_return"] = reader.boolean(
            mapping["maintenance_return"], (*path, "maintenance_return")
        )
    strategy = start.strategy
    if "strategy" in mapping:
        spath = (*path, "strategy")
        strategy = reader.text(mapping["strategy"], spath)
        if strategy not in REGISTRY:
            known = ", ".join(sorted(REGISTRY))
            reader.fail(spath, f"unknown strategy {describe(strategy)} (known: {known})")
        fields["strategy"] = strategy
    options: Mapping[str, object] = start.options
    if strategy != start.strategy:
        options = {}
    params = inspect.signature(REGISTRY[strategy].propose).parameters
    known_options = tuple(sorted(p for p in params if p not in _RESERVED))
    if "options" in mapping:
        opath = (*path, "options")
        given = reader.mapping(mapping["options"], opath)
        reader.check_keys(given, opath, known_options, f" for strategy {strategy}")
        options = {
            key: _option_value(reader, item, (*opath, key), params[key].default)
            for key, item in given.items()
        }
    fields["options"] = options
    try:
        config = replace(start, **fields)
    except ValueError as exc:
        reader.fail(path, str(exc))
    samples = config.smoothing // config.interval
    if samples > _MAX_SAMPLES:
        where = next((k for k in ("smoothing", "interval") if k in mapping), None)
        reader.fail(
            (*path, where) if where else path,
            f"a smoothing of {format_duration(config.smoothing)} at an interval of "
            f"{format_duration(config.interval)} keeps {samples} observations, at most "
            f"{_MAX_SAMPLES}: shorten the smoothing or lengthen the interval",
        )
    if config.options:
        refused = strategy_problem(config.strategy, _strategy_kwargs_for_check(config))
        if refused is not None:
            key, problem = refused
            where: Path = path
            if "options" in mapping:
                where = (*path, "options", key) if key in config.options else (*path, "options")
            reader.fail(where, f"strategy {config.strategy}: {problem}")
    return config


def _trial_cluster() -> Cluster:
    """Two nodes, two guests on the first: a cluster every strategy has work to do on."""
    gib = 1024**3
    nodes = (Node("a", 8.0, 16 * gib), Node("b", 8.0, 16 * gib))
    guests = tuple(
        Guest(str(i), "a", cpu=2.0, memory=2 * gib, cpu_used=1.0, memory_used=gib, uptime=86400)
        for i in (1, 2)
    )
    return Cluster(nodes, guests)


def _strategy_kwargs_for_check(config: PolicyConfig) -> dict[str, Any]:
    params = inspect.signature(REGISTRY[config.strategy].propose).parameters
    return _strategy_kwargs(config, params, Memory(), 0.0)


def strategy_problem(strategy: str, options: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why ``strategy`` refuses ``options``: ``(option, one line)``, or ``None`` when it takes
    them. ``option`` is the option refused on its own, or ``""`` when no single one is.

    Strategies check their options when they run; they are tried here on a small cluster, so
    that a configuration (or a command line) with an option a strategy refuses is refused when
    it is read, not when the daemon decides. A strategy that fails on that cluster whatever the
    options is not the options' fault: its error propagates.
    """

    def refuses(given: Mapping[str, Any]) -> str | None:
        try:
            REGISTRY[strategy].propose(_trial_cluster(), forbidden=frozenset(), **given)
        except Exception as exc:  # the options' fault, if the defaults run (below)
            return " ".join(str(exc).split()) or type(exc).__name__
        return None

    problem = refuses(options)
    if problem is None:
        return None
    if options:
        REGISTRY[strategy].propose(_trial_cluster(), forbidden=frozenset())  # a broken strategy
    for key, value in options.items():
        alone = refuses({key: value})
        if alone is not None:
            return key, alone
    return "", problem


__all__ = [
    "METRICS",
    "POLICY_KEYS",
    "PRESETS",
    "Decision",
    "DecisionKind",
    "Memory",
    "Metric",
    "PolicyConfig",
    "PolicyState",
    "Repair",
    "UsageWindow",
    "WhyNot",
    "decide",
    "first_moves",
    "forbidden_placements",
    "format_metric",
    "measure",
    "parse_policy",
    "repair",
    "repairs_needed",
    "stuck_after",
    "truncate",
    "warn_stuck",
    "why_not",
]
