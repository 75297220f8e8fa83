"""Members and instances made of what an observation read, as :class:`Node` s and :class:`Guest` s.
No API calls.

* A member is online when its status is ``Online``, ``Evacuated``, ``Evacuating`` or
  ``Restoring``; in the last three it is in maintenance (Incus takes no instance there:
  ``GetCandidateMembers`` in ``internal/server/db/node.go`` keeps only members in the created
  state), and while Incus evacuates or restores it its instances are held (Incus moves them).
  Its cores are ``/1.0/resources``' CPU threads, its memory the total there. Its own load is its
  measured use (the 1-minute load average from the member's state, where the server has it, and
  the used memory) less its instances' measured use.
* An instance's size is ``limits.cpu`` (a count, or the number of CPUs a set pins) and
  ``limits.memory`` (a size, or a percentage of its member's memory); without them, a VM has
  Incus's defaults (1 vCPU, 1 GiB) and a container its measured use (it may use the whole
  member). A running VM that Incus would not move live (:mod:`~.movement`: ``cluster.evacuate``,
  ``migration.stateful``, its boot state) is locked, unless ``settings.allow_restart_migration``
  lets it move by a stop and start. Its disks are the disk devices on a storage pool (local
  unless the pool's driver is a remote one); passed-through devices (GPU, USB, PCI, unix devices,
  InfiniBand) and disks bound to a host path pin it to its member.
* Measured CPU is a rate: the growth of the instance's CPU counter (nanoseconds) between this
  observation and the last, in cores; at the first observation, the counter over the time since
  the instance started (``last_used_at``). Measured memory is the state's memory in use.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from opendrs.backends.incus.movement import live_refusal
from opendrs.backends.incus.values import as_int, cpu_limit, memory_limit, timestamp
from opendrs.model.cluster import Disk, Guest, GuestState, Node

#: Storage drivers whose volumes every member reaches.
REMOTE_DRIVERS: Final = frozenset({"ceph", "cephfs", "cephobject", "lvmcluster", "truenas"})
#: Device types that tie an instance to the hardware of its member.
PINNING_DEVICES: Final = frozenset(
    {"gpu", "usb", "pci", "unix-char", "unix-block", "unix-hotplug", "infiniband"}
)
#: Member statuses that are online (``internal/server/db/node.go``: ``ToAPI``).
ONLINE_STATUSES: Final = frozenset({"Online", "Evacuated", "Evacuating", "Restoring"})
#: Online statuses in which Incus places nothing on the member: maintenance to opendrs.
MAINTENANCE_STATUSES: Final = frozenset({"Evacuated", "Evacuating", "Restoring"})
#: Incus's sizes of a VM that sets no limits.
VM_DEFAULT_CPU: Final = 1.0
VM_DEFAULT_MEMORY: Final = 1024**3
_STATES: Final[Mapping[str, GuestState]] = {"Running": "running", "Frozen": "paused"}


@dataclass(slots=True)
class MemberRead:
    """What an observation read about one member besides its row of ``/1.0/cluster/members``."""

    threads: float = 0.0
    memory: int = 0
    arch: str | None = None
    #: Memory in use on the member (``/1.0/resources``), bytes; ``None`` when not known.
    used_memory: int | None = None
    #: The 1-minute load average (the member's state); ``None`` when the server has none.
    load: float | None = None
    #: Each local pool's size on the member, bytes.
    storage: dict[str, int] = field(default_factory=dict)
    reachable: bool = True
    #: The answers read as they came (``/1.0/resources``, the member's state), for the
    #: placement scriptlet.
    resources: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CpuSample:
    """An instance's CPU counter (ns) when it was read (monotonic seconds)."""

    usage: int
    at: float


def guest_id(project: str, name: str) -> str:
    """An instance's guest id: its name in the project ``default``, else ``project/name``."""
    return name if project == "default" else f"{project}/{name}"


def split_id(guest: str) -> tuple[str, str]:
    """``(project, name)`` of a guest id (see :func:`guest_id`)."""
    if "/" in guest:
        project, _, name = guest.partition("/")
        return project, name
    return "default", guest


def build_node(
    row: Mapping[str, Any], read: MemberRead, guests_cpu: float, guests_memory: int
) -> Node:
    """A member as a node; its base load is its measured use beyond its instances'."""
    status = str(row.get("status", ""))
    online = status in ONLINE_STATUSES and read.reachable
    base_cpu = 0.0
    base_memory = 0
    if online:
        if read.load is not None:
            base_cpu = max(0.0, min(read.load, read.threads) - guests_cpu)
        if read.used_memory is not None:
            base_memory = max(0, read.used_memory - guests_memory)
    groups = row.get("groups")
    return Node(
        name=str(row["server_name"]),
        cpu=read.threads,
        memory=read.memory,
        storage=read.storage,
        arch=read.arch or str(row.get("architecture") or "x86_64"),
        online=online,
        maintenance=status in MAINTENANCE_STATUSES,
        tags=tuple(sorted(str(g) for g in groups)) if isinstance(groups, list) else (),
        base_cpu=base_cpu,
        base_memory=base_memory,
    )


def build_guest(
    row: Mapping[str, Any],
    member_memory: int,
    remote_pools: frozenset[str],
    cpu_used: float | None,
    migrating_to: str | None,
    lock: str | None,
    *,
    restart_moves: bool = False,
    boot_state_checked: bool = False,
) -> Guest:
    """An instance as a guest (``cpu_used`` measured by the observer). ``restart_moves``:
    ``settings.allow_restart_migration``; ``boot_state_checked``: the server checks a running
    VM's boot state (:func:`~.movement.records_boot_state`)."""
    project = str(row.get("project") or "default")
    name = str(row["name"])
    config = _mapping(row.get("expanded_config"))
    devices = _mapping(row.get("expanded_devices"))
    vm = row.get("type") == "virtual-machine"
    state: GuestState = _STATES.get(str(row.get("status")), "stopped")
    measured = _mapping(_mapping(row.get("state")).get("memory")).get("usage")
    memory_used = as_int(measured) if state != "stopped" and measured is not None else None
    vcpus, _ = cpu_limit(config.get("limits.cpu"))
    memory = memory_limit(config.get("limits.memory"), member_memory)
    if vcpus is None:
        vcpus = VM_DEFAULT_CPU if vm else max(1.0, round(cpu_used or 0.0, 3))
    if memory is None:
        memory = VM_DEFAULT_MEMORY if vm else (memory_used or 0)
    disks, pinning = _devices(devices, remote_pools)
    if lock is None and vm and state == "running" and not restart_moves:
        # Incus would not move it live, and it may not move by a restart: held.
        lock = live_refusal(config, boot_state_checked=boot_state_checked)
    priority = as_int(config.get("user.opendrs.priority"), 2)
    return Guest(
        id=guest_id(project, name),
        node=str(row.get("location") or ""),
        kind="vm" if vm else "ct",
        name=name,
        state=state,
        cpu=vcpus,
        memory=memory,
        disks=disks,
        cpu_used=cpu_used if state != "stopped" else 0.0,
        memory_used=memory_used if state != "stopped" else 0,
        devices=pinning,
        uptime=uptime(row) if state != "stopped" else 0,
        lock=lock,
        priority=priority if 1 <= priority <= 3 else 2,
        migrating_to=migrating_to,
    )


def cpu_rate(row: Mapping[str, Any], last: CpuSample | None, now: float) -> float | None:
    """Cores an instance keeps busy: its counter's growth since ``last``, else since it started;
    ``None`` when neither can be told."""
    usage = _mapping(_mapping(row.get("state")).get("cpu")).get("usage")
    if usage is None or row.get("status") != "Running":
        return None
    counter = as_int(usage)
    if last is not None and now > last.at and counter >= last.usage:
        return (counter - last.usage) / 1e9 / (now - last.at)
    up = uptime(row)
    return counter / 1e9 / up if up > 0 else None


def uptime(row: Mapping[str, Any]) -> int:
    """Seconds since the instance started (``last_used_at``), 0 when not known."""
    started = timestamp(row.get("last_used_at"))
    return 0 if started is None else max(0, int(time.time() - started))


def _devices(
    devices: Mapping[str, Any], remote_pools: frozenset[str]
) -> tuple[tuple[Disk, ...], tuple[str, ...]]:
    """The disks on storage pools, and the devices that pin the instance to its member."""
    disks: list[Disk] = []
    pinning: list[str] = []
    for name in sorted(devices):
        device = _mapping(devices[name])
        kind = str(device.get("type", ""))
        if kind in PINNING_DEVICES:
            pinning.append(f"{name} ({kind})")
        elif kind == "disk":
            pool = device.get("pool")
            if isinstance(pool, str) and pool:
                size = memory_limit(device.get("size"), 0) or 0
                disks.append(Disk(pool, size, shared=pool in remote_pools))
            elif str(device.get("source", "")).startswith("/"):
                pinning.append(f"{name} (host path)")
    return tuple(disks), tuple(pinning)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


__all__ = [
    "MAINTENANCE_STATUSES",
    "ONLINE_STATUSES",
    "PINNING_DEVICES",
    "REMOTE_DRIVERS",
    "CpuSample",
    "MemberRead",
    "build_guest",
    "build_node",
    "cpu_rate",
    "guest_id",
    "split_id",
    "uptime",
]
