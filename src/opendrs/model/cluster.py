"""The cluster model: nodes, guests, rules and settings — immutable values.

Units: CPU in cores (configured vCPUs for guests; measured use in cores, so a guest that keeps two
vCPUs busy uses 2.0), memory and disks in bytes, durations in seconds, pressure (PSI) in percent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from types import MappingProxyType
from typing import Literal

from opendrs.model.rules import Rules

GuestKind = Literal["vm", "ct"]
GuestState = Literal["running", "stopped", "paused"]
UsageMode = Literal["basic", "static", "dynamic"]
BalanceSource = Literal["usage", "pressure"]
HaScheduler = Literal["basic", "static"]

GUEST_KINDS: tuple[str, ...] = ("vm", "ct")
GUEST_STATES: tuple[str, ...] = ("running", "stopped", "paused")
USAGE_MODES: tuple[str, ...] = ("basic", "static", "dynamic")
#: What the balance objective evens out: the usage mode's load, or pressure (PSI).
BALANCE_SOURCES: tuple[str, ...] = ("usage", "pressure")
#: The scheduler modes of Proxmox VE's HA manager (``ha`` of the datacenter's ``crs`` option).
HA_SCHEDULERS: tuple[str, ...] = ("basic", "static")

#: Proxmox HA service states (``PVE::HA::Manager``); see :mod:`opendrs.engine.usage`.
HA_STATES: tuple[str, ...] = (
    "started",
    "stopped",
    "request_start",
    "request_stop",
    "migrate",
    "relocate",
    "fence",
    "recovery",
    "freeze",
    "error",
    "request_start_balance",
)


def guest_label(guest_id: str, name: str = "") -> str:
    """How an operator knows a guest, everywhere opendrs writes for one (plan, place, show,
    the daemon's log, status, history, the dashboard, the reports): ``name (id)``, the id alone
    when the guest has no name (or its name is its id). JSON keeps the id as it is."""
    return f"{name} ({guest_id})" if name and name != guest_id else guest_id


def _frozen(value: Mapping[str, int] | None) -> Mapping[str, int]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True, slots=True)
class Pressure:
    """Pressure stall information, ``some`` averages in percent (0–100); ``full`` where known."""

    cpu: float = 0.0
    memory: float = 0.0
    io: float = 0.0
    memory_full: float = 0.0
    io_full: float = 0.0


@dataclass(frozen=True, slots=True)
class Disk:
    """A guest disk on a storage pool. A disk on a pool that is not shared is local to its node."""

    pool: str
    size: int
    shared: bool = False

    @property
    def local(self) -> bool:
        return not self.shared


@dataclass(frozen=True, slots=True)
class NodeLimit:
    """The only nodes the platform can move a guest to, and why only those: a VM's replication
    targets on Proxmox VE (a live migration elsewhere fails), the nodes a mapped device of the
    guest exists on. The guest's own node is always among ``nodes``."""

    nodes: frozenset[str]
    #: One plain sentence an operator reads when a node outside ``nodes`` is refused.
    reason: str


@dataclass(frozen=True, slots=True)
class Node:
    """A hypervisor node."""

    name: str
    cpu: float
    memory: int
    storage: Mapping[str, int] = field(default_factory=dict)
    arch: str = "x86_64"
    online: bool = True
    maintenance: bool = False
    tags: tuple[str, ...] = ()
    #: Per-node reserves; ``None`` takes the cluster default from :class:`Settings`.
    reserve_cpu: float | None = None
    reserve_memory: int | None = None
    #: Measured load of the host itself (not of its guests), added in dynamic mode.
    base_cpu: float = 0.0
    base_memory: int = 0
    pressure: Pressure = Pressure()
    #: Memory KSM (kernel same-page merging) saves on the node by sharing pages, in bytes
    #: (Proxmox's ``ksm.shared``); 0 when none is shared or it is not known.
    ksm_shared: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage", _frozen(self.storage))

    @property
    def usable(self) -> bool:
        """Online and not in maintenance: may receive guests."""
        return self.online and not self.maintenance


@dataclass(frozen=True, slots=True)
class Guest:
    """A VM or container."""

    id: str
    node: str
    kind: GuestKind = "vm"
    name: str = ""
    state: GuestState = "running"
    #: Configured size.
    cpu: float = 1.0
    memory: int = 0
    disks: tuple[Disk, ...] = ()
    #: Measured use (``None`` when not measured: the configured size stands in).
    cpu_used: float | None = None
    memory_used: int | None = None
    pressure: Pressure = Pressure()
    #: Passed-through local devices (``hostpci0``, ``usb1``, …): they pin the guest to its node.
    devices: tuple[str, ...] = ()
    uptime: int = 0
    lock: str | None = None
    ha: bool = False
    #: Proxmox HA state when the guest is HA-managed and the state is known.
    ha_state: str | None = None
    #: Proxmox HA ``failback`` (an HA resource's flag, on by default): the HA manager moves the
    #: guest back to its highest-priority node-affinity nodes whenever it can.
    failback: bool = True
    tags: tuple[str, ...] = ()
    #: 1 (low) … 3 (high), as in ProxLB: weighs the guest's footprint.
    priority: int = 2
    #: Target node of a migration in progress (the guest loads both nodes meanwhile).
    migrating_to: str | None = None
    #: CPU architecture the guest needs; ``None``: the architecture of its current node.
    arch: str | None = None
    #: Nodes the platform limits the guest's moves to (each limit holds): a hard filter.
    limits: tuple[NodeLimit, ...] = ()

    @property
    def label(self) -> str:
        """How an operator knows the guest: ``name (id)``, the id alone without a name."""
        return guest_label(self.id, self.name)

    @property
    def local_disk_bytes(self) -> int:
        return sum(d.size for d in self.disks if d.local)

    @property
    def cpu_load(self) -> float:
        """Measured CPU use in cores, or the configured vCPUs when not measured."""
        return self.cpu if self.cpu_used is None else self.cpu_used

    @property
    def memory_load(self) -> int:
        """Measured memory in bytes, or the configured memory when not measured."""
        return self.memory if self.memory_used is None else self.memory_used


@dataclass(frozen=True, slots=True)
class Settings:
    """Cluster-wide settings that shape accounting and constraints."""

    #: What load a guest puts on a node: ``basic`` counts guests, ``static`` uses configured
    #: sizes, ``dynamic`` measured use (the three modes of Proxmox CRS).
    mode: UsageMode = "dynamic"
    #: vCPUs a node may carry per core (capacity check on configured vCPUs).
    cpu_overcommit: float = 4.0
    #: Configured memory a node may carry per byte of RAM (1.0: no overcommit).
    memory_overcommit: float = 1.0
    #: Whether measured use (dynamic mode) is checked against the same limits as configured
    #: sizes — cores × ``cpu_overcommit``, memory × ``memory_overcommit`` — rather than against
    #: the hot level of each node's capacity: proxlb-solver's limits, whose only CPU check is
    #: vCPUs against cores × overcommit. Set by the proxlb-solver import; not in snapshots.
    measured_overcommit: bool = False
    #: Default per-node reserves (cores, bytes) kept free for the host itself.
    reserve_cpu: float = 0.0
    reserve_memory: int = 0
    #: Containers can only move by stop-and-start; allowed only when this is true.
    allow_restart_migration: bool = False
    #: Guests with disks on local storage move only when this is true (the disks are copied).
    allow_local_disks: bool = False
    #: Guests up for less than this many seconds are not moved.
    min_uptime: int = 0
    #: Weights of the resources in the combined balance objective.
    weight_cpu: float = 1.0
    weight_memory: float = 1.0
    #: What is balanced: ``usage`` — the load of ``mode`` — or ``pressure`` — each guest's cpu and
    #: memory pressure (PSI, percent) weighted by ``priority / 2``, against 100 per node, whatever
    #: the mode (see :class:`~opendrs.engine.usage.LoadModel`). The hard capacity checks follow
    #: ``mode`` either way.
    balance_source: BalanceSource = "usage"
    #: Migrations running at once in the cluster, and into any one node.
    max_parallel: int = 4
    max_node_inflow: int = 1
    #: Migration cost: ``max(1, ⌊memory/cost_unit⌋) + cost_disk_factor·⌊local disk/cost_unit⌋``.
    cost_unit: int = 256 * 1024**2
    cost_disk_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.balance_source not in BALANCE_SOURCES:
            raise ValueError(
                f"balance_source: expected one of {', '.join(BALANCE_SOURCES)}, "
                f"got {self.balance_source!r}"
            )


@dataclass(frozen=True, slots=True)
class Move:
    """One migration of ``guest`` from ``source`` to ``target``."""

    guest: str
    source: str
    target: str


@dataclass(frozen=True)
class Cluster:
    """An immutable snapshot of a cluster."""

    nodes: tuple[Node, ...]
    guests: tuple[Guest, ...]
    rules: Rules = field(default_factory=Rules)
    settings: Settings = field(default_factory=Settings)
    name: str = "cluster"
    #: Proxmox VE balances its HA guests itself (``ha-auto-rebalance`` in the datacenter's
    #: ``crs`` options, pve-ha-manager 5.2): a second balancer, which opendrs leaves them to.
    ha_auto_rebalance: bool = False
    #: The scheduler mode Proxmox VE's HA manager places recoveries with (``ha`` of the
    #: datacenter's ``crs`` option: ``basic`` or ``static``); None when not known (not Proxmox,
    #: or the options cannot be read).
    ha_scheduler: HaScheduler | None = None

    @cached_property
    def node_index(self) -> Mapping[str, int]:
        return MappingProxyType({n.name: i for i, n in enumerate(self.nodes)})

    @cached_property
    def guest_index(self) -> Mapping[str, int]:
        return MappingProxyType({g.id: i for i, g in enumerate(self.guests)})

    def node(self, name: str) -> Node:
        return self.nodes[self.node_index[name]]

    def guest(self, guest_id: str) -> Guest:
        return self.guests[self.guest_index[guest_id]]

    def guest_label(self, guest_id: str) -> str:
        """:func:`guest_label` of the guest ``guest_id`` (its id alone when it is not here)."""
        index = self.guest_index.get(guest_id)
        return guest_id if index is None else self.guests[index].label

    @cached_property
    def _guests_by_node(self) -> Mapping[str, tuple[Guest, ...]]:
        by_node: dict[str, list[Guest]] = {}
        for guest in self.guests:
            by_node.setdefault(guest.node, []).append(guest)
        return MappingProxyType({node: tuple(on) for node, on in by_node.items()})

    def guests_on(self, node: str) -> tuple[Guest, ...]:
        """The guests on ``node``, in the cluster's order (grouped once: a call per node stays
        linear in the guests)."""
        return self._guests_by_node.get(node, ())

    def reserve_cpu(self, node: Node) -> float:
        return self.settings.reserve_cpu if node.reserve_cpu is None else node.reserve_cpu

    def reserve_memory(self, node: Node) -> int:
        return self.settings.reserve_memory if node.reserve_memory is None else node.reserve_memory

    def net_cpu(self, node: Node) -> float:
        """The cores of ``node`` left to guests: its cores less its reserve, never below 0."""
        return max(node.cpu - self.reserve_cpu(node), 0.0)

    def net_memory(self, node: Node) -> int:
        """The memory of ``node`` left to guests: its memory less its reserve, never below 0."""
        return max(node.memory - self.reserve_memory(node), 0)

    def guest_arch(self, guest: Guest) -> str:
        """The CPU architecture a guest needs: its own, or its current node's."""
        if guest.arch is not None:
            return guest.arch
        index = self.node_index.get(guest.node)
        return self.nodes[index].arch if index is not None else "x86_64"

    def with_placement(self, placement: Mapping[str, str]) -> Cluster:
        """A copy with some guests on other nodes (``guest id → node``), migrations finished."""
        guests = tuple(
            g
            if g.id not in placement
            else replace(g, node=placement[g.id], migrating_to=None, arch=self.guest_arch(g))
            for g in self.guests
        )
        return replace(self, guests=guests)

    def apply(self, moves: tuple[Move, ...] | list[Move]) -> Cluster:
        return self.with_placement({m.guest: m.target for m in moves})


def updater(cls: type, *changing: str) -> Callable[..., object]:
    """A fast ``replace`` for a frozen slots dataclass that changes only the fields ``changing``.

    ``updater(Guest, "cpu_used", "memory_used")(guest, 1.5, 2 * GiB)`` equals
    ``dataclasses.replace(guest, cpu_used=1.5, memory_used=2 * GiB)``, several times faster: it
    fills the slots of a new object directly (no ``__init__`` or ``__post_init__`` runs, so the
    class must have no ``__post_init__`` that normalises those fields). Hot loops only — the
    simulator and the smoothing of measured usage copy hundreds of guests every observation.
    """
    names = tuple(f.name for f in fields(cls))
    unknown = [c for c in changing if c not in names]
    if unknown:
        raise ValueError(f"{cls.__name__} has no field {unknown[0]!r}")
    namespace: dict[str, object] = {"new": object.__new__, "cls": cls}
    lines = [f"def update(src, {', '.join(changing)}):", "    out = new(cls)"]
    for index, name in enumerate(names):
        namespace[f"set{index}"] = vars(cls)[name].__set__
        value = name if name in changing else f"src.{name}"
        lines.append(f"    set{index}(out, {value})")
    lines.append("    return out")
    exec("\n".join(lines), namespace)  # like the initialisers dataclasses generates
    return namespace["update"]  # type: ignore[return-value]
