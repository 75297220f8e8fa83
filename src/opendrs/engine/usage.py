"""Usage accounting: what load each guest puts on which node.

Two views, both as numpy arrays over (guest, resource) and (node, resource):

* **Balance load** (:class:`LoadModel`) — what the imbalance metrics see, in the three modes of
  Proxmox CRS: ``basic`` (each guest counts 1), ``static`` (configured vCPUs and memory) and
  ``dynamic`` (measured cores and bytes, plus the host's own load). Fractions are taken against
  the node's capacity less its reserves. With ``Settings.balance_source = "pressure"`` the load
  is pressure instead, whatever the mode: each guest's cpu and memory PSI (percent) weighted by
  its ``priority / 2``, against 100 on every node, with no host load (proxlb-solver's PSI
  footprint, up to the constant factor 2: its priority 2, the default, counts a pressure as it is).
* **Capacity** (:class:`CapacityModel`) — what the hard capacity checks see: configured vCPUs
  against cores × overcommit, configured memory against memory × overcommit, measured use (in
  dynamic mode) against the physical capacity, and local disks against each node's storage pools,
  all net of reserves.

Which nodes a guest loads follows Proxmox (``PVE::HA::Usage::get_used_service_nodes``) for
HA-managed guests with a known HA state, and the guest state otherwise: a running or paused guest
loads its node, and a guest being migrated loads both its source and its target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from functools import cached_property

import numpy as np

from opendrs.model.cluster import (
    BalanceSource,
    Cluster,
    Guest,
    Node,
    Settings,
    UsageMode,
    updater,
)
from opendrs.model.units import format_bytes

_guest_with_usage = updater(Guest, "cpu_used", "memory_used")

#: Resources that the balance metrics consider, in column order.
RESOURCES: tuple[str, ...] = ("cpu", "memory")
#: A node's balance capacity when pressure is balanced: pressure is a percentage.
PRESSURE_CAPACITY = 100.0
#: The priority at which a guest's pressure counts as it is (proxlb-solver's default priority).
PRESSURE_PRIORITY = 2


def arch_groups(cluster: Cluster, mask: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """The CPU architectures of the nodes in ``mask`` (sorted), and (N,) each node's index among
    them (-1 outside ``mask``).

    Guests cannot move between architectures, so each architecture's nodes are balanced — and
    their imbalance measured — on their own, as Incus does.
    """
    nodes = cluster.nodes
    arches = tuple(sorted({n.arch for n, keep in zip(nodes, mask, strict=True) if keep}))
    index = {arch: i for i, arch in enumerate(arches)}
    group = np.array(
        [index[n.arch] if keep else -1 for n, keep in zip(nodes, mask, strict=True)],
        dtype=np.intp,
    )
    return arches, group


# Proxmox HA state -> which nodes it loads ("current", "target").
_HA_LOADS: dict[str, tuple[str, ...]] = {
    "stopped": (),
    "request_start": (),
    "started": ("current",),
    "request_stop": ("current",),
    "fence": ("current",),
    "freeze": ("current",),
    "error": ("current",),
    "recovery": ("current",),
    "migrate": ("current", "target"),
    "relocate": ("current", "target"),
    "request_start_balance": ("target",),
}


def loaded_nodes(guest: Guest) -> tuple[str, ...]:
    """The nodes a guest puts load on, source first.

    HA-managed guests with a known HA state follow Proxmox's rules: ``stopped`` and
    ``request_start`` load nothing; ``started``, ``request_stop``, ``fence``, ``freeze``, ``error``
    and ``recovery`` load the current node; ``migrate`` and ``relocate`` load the current node and
    the target; ``request_start_balance`` loads only the target. Other guests load their node when
    running or paused, and the migration target too while a migration is in progress.
    """
    if guest.ha and guest.ha_state is not None:
        which = _HA_LOADS.get(guest.ha_state, ("current",))
        nodes = []
        for part in which:
            if part == "current":
                nodes.append(guest.node)
            elif guest.migrating_to is not None:
                nodes.append(guest.migrating_to)
        return tuple(dict.fromkeys(nodes))
    if guest.state == "stopped":
        return ()
    if guest.migrating_to is not None and guest.migrating_to != guest.node:
        return (guest.node, guest.migrating_to)
    return (guest.node,)


@dataclass(frozen=True, eq=False)
class MeasuredUsage:
    """Measured usage aligned with one cluster's guests and nodes, as arrays: what the load
    models read in ``dynamic`` mode in place of the guests' and nodes' own values.

    This is how the policy's smoothing reaches the engine: the usage window yields these arrays
    (its average for balancing, its recent usage for the capacity checks) and the cycle's view
    builds its loads and constraints on them, while its cluster stays the observation. Each
    guest's ``cpu`` (cores) and ``memory`` (whole bytes) is its measured load, or its configured
    size where it is not measured (:attr:`Guest.cpu_load`); each node's ``base_cpu`` and
    ``base_memory`` is the host's own load.
    """

    guest_ids: tuple[str, ...]
    node_names: tuple[str, ...]
    cpu: np.ndarray  # (G,)
    memory: np.ndarray  # (G,)
    base_cpu: np.ndarray  # (N,)
    base_memory: np.ndarray  # (N,)
    #: The nodes whose own load here includes the rise their load is forecast to bring
    #: (:mod:`~opendrs.engine.policy.trend`): running hot on it, they are forecast to.
    forecast: frozenset[str] = frozenset()

    @classmethod
    def of(cls, cluster: Cluster) -> MeasuredUsage:
        """The cluster's own measured usage."""
        guests, nodes = cluster.guests, cluster.nodes
        return cls(
            tuple(g.id for g in guests),
            tuple(n.name for n in nodes),
            _frozen([g.cpu_load for g in guests]),
            _frozen([float(g.memory_load) for g in guests]),
            _frozen([n.base_cpu for n in nodes]),
            _frozen([float(n.base_memory) for n in nodes]),
        )

    @classmethod
    def replacing(
        cls,
        cluster: Cluster,
        cpu: np.ndarray,
        memory: np.ndarray,
        base_cpu: np.ndarray,
        base_memory: np.ndarray,
    ) -> MeasuredUsage:
        """The cluster's own usage with other values where they are known (not NaN): a guest's
        only where it is measured now, a node's wherever known; memory rounded to whole bytes."""
        return cls.replacing_each(cluster, (cpu, memory, base_cpu, base_memory))[0]

    @classmethod
    def replacing_each(
        cls, cluster: Cluster, *values: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    ) -> tuple[MeasuredUsage, ...]:
        """:meth:`replacing` for each set of ``(cpu, memory, base_cpu, base_memory)``, the
        cluster's own usage read once."""
        own = cls.of(cluster)
        measured = np.array([g.cpu_used is not None for g in cluster.guests], dtype=bool)
        memory_measured = np.array([g.memory_used is not None for g in cluster.guests], dtype=bool)
        return tuple(
            cls(
                own.guest_ids,
                own.node_names,
                _where_known(own.cpu, cpu, measured),
                _where_known(own.memory, np.rint(memory), memory_measured),
                _where_known(own.base_cpu, base_cpu, True),
                _where_known(own.base_memory, np.rint(base_memory), True),
            )
            for cpu, memory, base_cpu, base_memory in values
        )

    def check(self, cluster: Cluster) -> None:
        """Raise ValueError unless made for ``cluster``'s guests and nodes, in their order."""
        if (
            tuple(g.id for g in cluster.guests) != self.guest_ids
            or tuple(n.name for n in cluster.nodes) != self.node_names
        ):
            raise ValueError("measured usage: made for another cluster's guests or nodes")

    @property
    def guest_columns(self) -> np.ndarray:
        """Each guest's (cpu, memory), shape (G, 2)."""
        return np.column_stack([self.cpu, self.memory]).reshape(len(self.cpu), 2)

    @property
    def node_columns(self) -> np.ndarray:
        """Each node's own (cpu, memory), shape (N, 2)."""
        return np.column_stack([self.base_cpu, self.base_memory]).reshape(len(self.base_cpu), 2)


def _frozen(values: Sequence[float]) -> np.ndarray:
    out = np.array(values, dtype=np.float64)
    out.setflags(write=False)
    return out


def _where_known(own: np.ndarray, other: np.ndarray, allowed: np.ndarray | bool) -> np.ndarray:
    out = np.where(np.isfinite(other) & allowed, other, own)
    out.setflags(write=False)
    return out


def with_usage(cluster: Cluster, usage: MeasuredUsage) -> Cluster:
    """``cluster`` with ``usage`` written into its guests (those measured now) and nodes: for
    what reads usage from a :class:`Cluster` rather than from a load model (the peers' own
    models, a snapshot written to a file). ``cluster`` itself when nothing differs."""
    usage.check(cluster)
    guests, nodes = cluster.guests, cluster.nodes
    new_guests: tuple[Guest, ...] = guests
    changed = [
        j
        for j, g in enumerate(guests)
        if (g.cpu_used is not None and g.cpu_used != usage.cpu[j])
        or (g.memory_used is not None and g.memory_used != usage.memory[j])
    ]
    if changed:
        out = list(guests)
        for j in changed:
            g = guests[j]
            out[j] = _guest_with_usage(
                g,
                g.cpu_used if g.cpu_used is None else float(usage.cpu[j]),
                g.memory_used if g.memory_used is None else int(usage.memory[j]),
            )
        new_guests = tuple(out)
    new_nodes: tuple[Node, ...] = nodes
    moved = [
        i
        for i, n in enumerate(nodes)
        if n.base_cpu != usage.base_cpu[i] or n.base_memory != usage.base_memory[i]
    ]
    if moved:
        out_nodes = list(nodes)
        for i in moved:
            out_nodes[i] = replace(
                nodes[i], base_cpu=float(usage.base_cpu[i]), base_memory=int(usage.base_memory[i])
            )
        new_nodes = tuple(out_nodes)
    if new_guests is guests and new_nodes is nodes:
        return cluster
    return replace(cluster, nodes=new_nodes, guests=new_guests)


def guest_demand(
    cluster: Cluster,
    mode: UsageMode | None = None,
    source: BalanceSource | None = None,
    usage: MeasuredUsage | None = None,
) -> np.ndarray:
    """Balance load of each guest, shape (guests, len(RESOURCES)), as float64.

    With ``source`` (default: the cluster's ``balance_source``) ``pressure``: each guest's cpu
    and memory pressure times ``priority / 2``, whatever the mode. In ``dynamic`` mode the
    measured load is ``usage``'s (default: the guests' own).
    """
    mode = mode or cluster.settings.mode
    source = source or cluster.settings.balance_source
    guests = cluster.guests
    if source == "pressure":
        return (
            np.array(
                [[g.pressure.cpu * g.priority, g.pressure.memory * g.priority] for g in guests],
                dtype=np.float64,
            ).reshape(len(guests), len(RESOURCES))
            / PRESSURE_PRIORITY
        )
    if mode == "basic":
        return np.ones((len(guests), len(RESOURCES)))
    if mode == "static":
        return np.array([[g.cpu, float(g.memory)] for g in guests], dtype=np.float64).reshape(
            len(guests), len(RESOURCES)
        )
    if usage is not None:
        return usage.guest_columns
    return np.array([[g.cpu_load, float(g.memory_load)] for g in guests], dtype=np.float64).reshape(
        len(guests), len(RESOURCES)
    )


def node_capacity(
    cluster: Cluster, mode: UsageMode | None = None, source: BalanceSource | None = None
) -> np.ndarray:
    """Balance capacity of each node net of reserves, shape (nodes, len(RESOURCES)).

    In basic mode every node has capacity 1, so a node's load is its guest count. When pressure
    is balanced (``source``, default the cluster's), every node has 100 (percent).
    """
    mode = mode or cluster.settings.mode
    source = source or cluster.settings.balance_source
    nodes = cluster.nodes
    if source == "pressure":
        return np.full((len(nodes), len(RESOURCES)), PRESSURE_CAPACITY)
    if mode == "basic":
        return np.ones((len(nodes), len(RESOURCES)))
    return net_capacity(cluster)


def net_capacity(cluster: Cluster) -> np.ndarray:
    """Each node's cores and memory left to guests, net of reserves, shape (nodes, 2): the one
    derivation of capacity net of reserves (:meth:`Cluster.net_cpu`, :meth:`Cluster.net_memory`)
    that the balance loads, the capacity checks and the simulator share."""
    return np.array(
        [[cluster.net_cpu(n), float(cluster.net_memory(n))] for n in cluster.nodes],
        dtype=np.float64,
    ).reshape(len(cluster.nodes), 2)


def node_base(
    cluster: Cluster,
    mode: UsageMode | None = None,
    source: BalanceSource | None = None,
    usage: MeasuredUsage | None = None,
) -> np.ndarray:
    """The host's own load (dynamic mode only, never when pressure is balanced), shape
    (nodes, len(RESOURCES)): ``usage``'s (default: the nodes' own)."""
    mode = mode or cluster.settings.mode
    source = source or cluster.settings.balance_source
    if mode != "dynamic" or source == "pressure":
        return np.zeros((len(cluster.nodes), len(RESOURCES)))
    if usage is not None:
        return usage.node_columns
    return np.array(
        [[n.base_cpu, float(n.base_memory)] for n in cluster.nodes], dtype=np.float64
    ).reshape(len(cluster.nodes), len(RESOURCES))


def _load_pairs(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(guest index, node index) for every (guest, node) the guest loads."""
    gi: list[int] = []
    ni: list[int] = []
    index = cluster.node_index
    for g_idx, guest in enumerate(cluster.guests):
        for node in loaded_nodes(guest):
            n_idx = index.get(node)
            if n_idx is not None:
                gi.append(g_idx)
                ni.append(n_idx)
    return np.array(gi, dtype=np.intp), np.array(ni, dtype=np.intp)


def accumulate(
    demand: np.ndarray, guest_idx: np.ndarray, node_idx: np.ndarray, n_nodes: int
) -> np.ndarray:
    """Sum ``demand[guest_idx]`` into rows ``node_idx``: shape (n_nodes, demand.shape[1])."""
    out = np.zeros((n_nodes, demand.shape[1]), dtype=np.float64)
    if guest_idx.size:
        for col in range(demand.shape[1]):
            out[:, col] = np.bincount(node_idx, weights=demand[guest_idx, col], minlength=n_nodes)
    return out


@dataclass(frozen=True)
class LoadModel:
    """Balance load of a cluster as arrays; cheap to re-evaluate for another placement.

    ``source`` says what the load is: ``usage`` (the ``mode``'s cores and bytes, or guest counts)
    or ``pressure`` (PSI percent × priority / 2 against 100 per node; ``mode`` then only names
    the cluster's usage mode). The hard capacity checks never read it: :class:`CapacityModel`.
    """

    mode: UsageMode
    demand: np.ndarray  # (G, R)
    capacity: np.ndarray  # (N, R), net of reserves
    base: np.ndarray  # (N, R)
    #: Node index of each guest (``-1``: its node is unknown).
    assign: np.ndarray  # (G,)
    #: Whether each guest puts load on its node (running, paused, or HA state that loads).
    active: np.ndarray  # (G,) bool
    #: Extra loads of migrations in progress: (guest index, node index) pairs beyond ``assign``.
    extra_guest: np.ndarray
    extra_node: np.ndarray
    #: What the load is: ``usage`` or ``pressure`` (see the class docstring).
    source: BalanceSource = "usage"

    @classmethod
    def build(
        cls,
        cluster: Cluster,
        mode: UsageMode | None = None,
        source: BalanceSource | None = None,
        usage: MeasuredUsage | None = None,
    ) -> LoadModel:
        """The balance load of ``cluster`` in ``mode`` and from ``source`` (default: the
        cluster's settings), measured usage read from ``usage`` (default: the cluster's own)."""
        mode = mode or cluster.settings.mode
        source = source or cluster.settings.balance_source
        gi, ni = _load_pairs(cluster)
        assign = np.array(
            [cluster.node_index.get(g.node, -1) for g in cluster.guests], dtype=np.intp
        )
        active = np.zeros(len(cluster.guests), dtype=bool)
        on_own = ni == assign[gi] if gi.size else np.zeros(0, dtype=bool)
        active[gi[on_own]] = True
        return cls(
            mode=mode,
            demand=guest_demand(cluster, mode, source, usage),
            capacity=node_capacity(cluster, mode, source),
            base=node_base(cluster, mode, source, usage),
            assign=assign,
            active=active,
            extra_guest=gi[~on_own],
            extra_node=ni[~on_own],
            source=source,
        )

    @property
    def n_nodes(self) -> int:
        return int(self.capacity.shape[0])

    @property
    def memory_is_bytes(self) -> bool:
        """Whether the memory column counts bytes (not guests, not pressure)."""
        return self.source == "usage" and self.mode != "basic"

    def loads(self, assign: np.ndarray | None = None) -> np.ndarray:
        """Node loads (N, R) for ``assign`` (default: the current placement)."""
        assign = self.assign if assign is None else assign
        mask = self.active & (assign >= 0)
        idx = np.nonzero(mask)[0]
        out = self.base + accumulate(self.demand, idx, assign[idx], self.n_nodes)
        if self.extra_guest.size:
            out += accumulate(self.demand, self.extra_guest, self.extra_node, self.n_nodes)
        return out

    def fractions(self, assign: np.ndarray | None = None) -> np.ndarray:
        """Node loads as fractions of capacity (N, R); a node without capacity reads 0 or inf."""
        return safe_divide(self.loads(assign), self.capacity)


def usage_loads(
    cluster: Cluster, loads: LoadModel | None = None, usage: MeasuredUsage | None = None
) -> LoadModel:
    """``loads`` when it counts measured usage, else the cluster's usage :class:`LoadModel`
    (measured usage from ``usage``, default the cluster's own): the capacity checks read usage,
    even where pressure is what is balanced."""
    if loads is not None and loads.source == "usage":
        return loads
    return LoadModel.build(cluster, source="usage", usage=usage)


def safe_divide(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` where a zero denominator gives 0 for a zero numerator and +inf otherwise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
    return out


# --------------------------------------------------------------------------------------------
# Capacity


class DimensionKind(Enum):
    """What a capacity dimension counts."""

    #: Configured vCPUs, against the cores times the CPU overcommit.
    VCPUS = "vcpus"
    #: Configured memory, against the memory times the memory overcommit.
    MEMORY = "memory"
    #: Measured CPU use in cores (dynamic mode), against the cores times the hot level.
    CPU_USED = "cpu_used"
    #: Measured memory use (dynamic mode), against the memory times the hot level.
    MEMORY_USED = "memory_used"
    #: Local disks in one storage pool, against the pool's size.
    STORAGE = "storage"

    @property
    def measured(self) -> bool:
        """Whether the dimension is measured usage rather than a configured size."""
        return self in (DimensionKind.CPU_USED, DimensionKind.MEMORY_USED)

    @property
    def in_cores(self) -> bool:
        """Whether the dimension counts CPUs (else bytes)."""
        return self in (DimensionKind.VCPUS, DimensionKind.CPU_USED)


@dataclass(frozen=True, slots=True)
class Dimension:
    """One hard capacity dimension: its kind and, for storage, the pool. ``str()`` is its name
    in messages and JSON (``vcpus``, ``memory``, ``cpu_used``, ``memory_used``,
    ``storage:POOL``)."""

    kind: DimensionKind
    pool: str | None = None

    def __str__(self) -> str:
        if self.kind is DimensionKind.STORAGE:
            return f"storage:{self.pool}"
        return self.kind.value

    def amount(self, value: float) -> str:
        """``value`` of this dimension as an operator reads it: ``4.0 cores``, ``8.0 GiB``; a
        fraction of a core keeps two significant digits (``0.006 cores``, not ``0.0 cores``)."""
        if self.kind.in_cores:
            small = 0 < abs(value) < 1
            return f"{value:.2g} cores" if small else f"{value:.1f} cores"
        return format_bytes(value)


@dataclass(frozen=True)
class CapacityModel:
    """Hard capacity dimensions: committed amounts vs limits, as (N, D) and (G, D) arrays."""

    dimensions: tuple[Dimension, ...]
    limit: np.ndarray  # (N, D)
    demand: np.ndarray  # (G, D)
    #: (G, D) what each guest brings to a node it moves to: its demand, only its storage when it
    #: loads no node (stopped); read-only.
    moving: np.ndarray
    base: np.ndarray  # (N, D) committed by the host itself
    #: (guest, node) pairs that commit cpu and memory in the current state.
    compute_guest: np.ndarray
    compute_node: np.ndarray
    #: (guest, node) pairs that commit local storage in the current state.
    storage_guest: np.ndarray
    storage_node: np.ndarray
    #: The share of a node's capacity measured usage may fill (dynamic mode): 1, or the policy's
    #: hot level, above which a node runs hot; 1 where ``Settings.measured_overcommit`` makes
    #: the overcommits the limits (:func:`measured_capacity_factor`).
    measured_limit: float = 1.0
    #: The nodes (indexes) whose measured load includes a forecast rise (``usage.forecast``).
    forecast: frozenset[int] = frozenset()

    @classmethod
    def build(
        cls, cluster: Cluster, usage: MeasuredUsage | None = None, measured_limit: float = 1.0
    ) -> CapacityModel:
        """The capacity dimensions of ``cluster``, measured usage (dynamic mode) from ``usage``
        (default: the cluster's own) against ``measured_limit`` of each node's capacity, or the
        overcommits (:func:`measured_capacity_factor`)."""
        settings = cluster.settings
        pools = sorted(
            {p for n in cluster.nodes for p in n.storage}
            | {d.pool for g in cluster.guests for d in g.disks if d.local}
        )
        dims = [Dimension(DimensionKind.VCPUS), Dimension(DimensionKind.MEMORY)]
        dynamic = settings.mode == "dynamic"
        if dynamic:
            dims += [Dimension(DimensionKind.CPU_USED), Dimension(DimensionKind.MEMORY_USED)]
        dims += [Dimension(DimensionKind.STORAGE, p) for p in pools]
        n_nodes, n_guests, n_dims = len(cluster.nodes), len(cluster.guests), len(dims)
        limit = np.zeros((n_nodes, n_dims))
        base = np.zeros((n_nodes, n_dims))
        net = net_capacity(cluster)
        measured_factor = measured_capacity_factor(settings, measured_limit)
        if settings.measured_overcommit:
            measured_limit = 1.0
        for i, node in enumerate(cluster.nodes):
            cores, mem = float(net[i, 0]), float(net[i, 1])
            row = [cores * settings.cpu_overcommit, mem * settings.memory_overcommit]
            if dynamic:
                row += [cores * measured_factor[0], mem * measured_factor[1]]
            row += [float(node.storage.get(p, 0)) for p in pools]
            limit[i] = row
        demand = np.zeros((n_guests, n_dims))
        pool_col = {p: dims.index(Dimension(DimensionKind.STORAGE, p)) for p in pools}
        for j, guest in enumerate(cluster.guests):
            demand[j, 0] = guest.cpu
            demand[j, 1] = float(guest.memory)
            for disk in guest.disks:
                if disk.local:
                    demand[j, pool_col[disk.pool]] += float(disk.size)
        forecast: frozenset[int] = frozenset()
        if dynamic:
            measured = usage if usage is not None else MeasuredUsage.of(cluster)
            demand[:, 2:4] = measured.guest_columns
            base[:, 2:4] = measured.node_columns
            forecast = frozenset(cluster.node_index[n] for n in measured.forecast)
        compute, storage, idle = _commitments(cluster)
        storage_cols = np.array([d.kind is DimensionKind.STORAGE for d in dims], dtype=bool)
        moving = np.where(idle[:, None] & ~storage_cols[None, :], 0.0, demand)
        moving.setflags(write=False)
        return cls(
            dimensions=tuple(dims),
            limit=limit,
            demand=demand,
            moving=moving,
            base=base,
            compute_guest=compute[0],
            compute_node=compute[1],
            storage_guest=storage[0],
            storage_node=storage[1],
            measured_limit=measured_limit,
            forecast=forecast,
        )

    @cached_property
    def storage_cols(self) -> np.ndarray:
        """(D,) bool: the dimensions of storage pools."""
        return np.array([d.kind is DimensionKind.STORAGE for d in self.dimensions], dtype=bool)

    def committed(self) -> np.ndarray:
        """Committed amounts (N, D) in the current state."""
        n_nodes = len(self.limit)
        compute = np.where(self.storage_cols[None, :], 0.0, self.demand)
        storage = np.where(self.storage_cols[None, :], self.demand, 0.0)
        return (
            self.base
            + accumulate(compute, self.compute_guest, self.compute_node, n_nodes)
            + accumulate(storage, self.storage_guest, self.storage_node, n_nodes)
        )

    def headroom(self) -> np.ndarray:
        """Limit minus committed, (N, D); negative where a node is already over a limit."""
        return self.limit - self.committed()

    def fits(self, guest_demand: np.ndarray, headroom: np.ndarray) -> np.ndarray:
        """For one guest's demand (D,), which nodes (N,) have room for it."""
        return np.all(guest_demand[None, :] <= headroom + tolerance(self.limit), axis=1)

    @cached_property
    def measured_cols(self) -> np.ndarray:
        """(D,) bool: the dimensions of measured usage (dynamic mode)."""
        return np.array([d.kind.measured for d in self.dimensions], dtype=bool)

    def over(self, committed: np.ndarray) -> np.ndarray:
        """(N, D) boolean: where committed exceeds the limit (beyond rounding)."""
        return committed > self.limit + tolerance(self.limit)


def measured_capacity_factor(settings: Settings, hot: float | None) -> tuple[float, float]:
    """The share (cpu, memory) of each node's capacity net of reserves that measured usage may
    fill in dynamic mode: the ``hot`` level (None: all of it), or the overcommits where
    ``settings.measured_overcommit`` (proxlb-solver's limits)."""
    if settings.measured_overcommit:
        return settings.cpu_overcommit, settings.memory_overcommit
    level = 1.0 if hot is None else hot
    return level, level


Pairs = tuple[np.ndarray, np.ndarray]


def _commitments(cluster: Cluster) -> tuple[Pairs, Pairs, np.ndarray]:
    """The (guest, node) index pairs that commit cpu and memory now, those that commit local
    storage, and (G,) whether each guest loads no node (stopped)."""
    compute_g: list[int] = []
    compute_n: list[int] = []
    storage_g: list[int] = []
    storage_n: list[int] = []
    idle = np.zeros(len(cluster.guests), dtype=bool)
    for j, guest in enumerate(cluster.guests):
        loaded = loaded_nodes(guest)
        idle[j] = not loaded
        for node in loaded:
            idx = cluster.node_index.get(node)
            if idx is not None:
                compute_g.append(j)
                compute_n.append(idx)
        # Local disks occupy their node's pools whatever the guest's state, and the target's
        # too while a migration copies them.
        for node in dict.fromkeys((guest.node, *loaded)):
            idx = cluster.node_index.get(node)
            if idx is not None:
                storage_g.append(j)
                storage_n.append(idx)
    compute = (np.array(compute_g, dtype=np.intp), np.array(compute_n, dtype=np.intp))
    storage = (np.array(storage_g, dtype=np.intp), np.array(storage_n, dtype=np.intp))
    return compute, storage, idle


def tolerance(limit: np.ndarray) -> np.ndarray:
    """Rounding slack for capacity comparisons."""
    return 1e-9 * np.maximum(np.abs(limit), 1.0)


def demand_rows(model: CapacityModel, guest_indices: Sequence[int]) -> np.ndarray:
    """The capacity demand of some guests, summed (D,)."""
    if not guest_indices:
        return np.zeros(len(model.dimensions))
    return model.demand[list(guest_indices)].sum(axis=0)
