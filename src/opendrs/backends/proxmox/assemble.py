"""Guests and nodes made of what an observation read: the rows of ``/cluster/resources``, each
guest's config and RRD points, each node's status and RRD points, the HA view. No API calls.

Measured usage is the average of the RRD points over the usage window (CPU, memory, pressure), or
the current values of ``/cluster/resources`` when the RRD has none; a node's base load is the
part of its measured usage that its guests do not account for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opendrs.backends.proxmox.guest_config import GuestConfig, parse_tags
from opendrs.backends.proxmox.ha import HaService, HaView, listed_service
from opendrs.backends.proxmox.values import as_int, as_number
from opendrs.model.cluster import HA_STATES, Guest, GuestState, Node, Pressure


@dataclass(slots=True)
class KnownGuest:
    """What the last observation knew about a guest (to start its migration)."""

    kind: Literal["qemu", "lxc"]
    node: str
    #: Its HA service, when the HA stack manages it.
    ha: HaService | None


@dataclass(slots=True)
class GuestRead:
    """What an observation read about one guest, besides its row of ``/cluster/resources``."""

    config: GuestConfig | None = None
    rrd: list[dict[str, Any]] = field(default_factory=list)
    target: str | None = None
    #: Its config could not be read (gone, moved meanwhile, or its node unreachable).
    unreadable: bool = False


@dataclass(slots=True)
class NodeRead:
    """What an observation read about one node, besides its row of ``/cluster/resources``."""

    arch: str | None = None
    rrd: list[dict[str, Any]] = field(default_factory=list)
    reachable: bool = True
    #: Bytes KSM shares on the node (``ksm.shared`` of its status); 0 when not known.
    ksm_shared: int = 0


def build_guests(
    rows: Sequence[Mapping[str, Any]], reads: Mapping[str, GuestRead], ha: HaView
) -> tuple[list[Guest], dict[str, KnownGuest]]:
    """The guests, by id, and what starting the migration of each needs to know."""
    guests: list[Guest] = []
    known: dict[str, KnownGuest] = {}
    for row in sorted(rows, key=lambda r: as_int(r.get("vmid"))):
        vmid = str(row["vmid"])
        guest, known[vmid] = _build_guest(row, reads.get(vmid, GuestRead()), ha)
        guests.append(guest)
    return guests, known


def build_nodes(
    rows: Mapping[str, Mapping[str, Any]],
    reads: Mapping[str, NodeRead],
    resources: Sequence[Mapping[str, Any]],
    shared: frozenset[str],
    ha: HaView,
    guests: Sequence[Guest],
    capacity: dict[str, tuple[float, int]],
) -> list[Node]:
    """The nodes, by name. ``capacity`` remembers each node's cores and memory, for when its row
    lacks them (an offline node); it is updated here."""
    storage = _local_storage(resources, shared)
    nodes: list[Node] = []
    for name in sorted(rows):
        row = rows[name]
        read = reads.get(name, NodeRead())
        online = row.get("status") == "online" and read.reachable
        cpu = as_number(row.get("maxcpu"))
        memory = as_int(row.get("maxmem"))
        if cpu and memory:
            capacity[name] = (cpu, memory)
        else:
            cpu, memory = capacity.get(name, (0.0, 0))
        base_cpu, base_memory, pressure = _base_load(name, row, read, cpu, guests, online)
        nodes.append(
            Node(
                name=name,
                cpu=float(cpu),
                memory=int(memory),
                storage=storage.get(name, {}),
                arch=read.arch or "x86_64",
                online=online,
                maintenance=name in ha.maintenance,
                base_cpu=base_cpu,
                base_memory=base_memory,
                pressure=pressure,
                ksm_shared=read.ksm_shared if online else 0,
            )
        )
    return nodes


def _build_guest(row: Mapping[str, Any], read: GuestRead, ha: HaView) -> tuple[Guest, KnownGuest]:
    vmid = str(row["vmid"])
    node = str(row["node"])
    kind: Literal["qemu", "lxc"] = "qemu" if row["type"] == "qemu" else "lxc"
    config = read.config
    maxcpu = as_number(row.get("maxcpu")) or 1.0
    status = row.get("status")
    state: GuestState = "running" if status == "running" else "stopped"
    if status == "paused" or row.get("qmpstatus") == "paused":
        state = "paused"
    service, ha_state = _guest_ha(row, ha, kind, vmid, node)
    cpu_used, memory_used, pressure = _guest_usage(row, read.rrd, state, maxcpu)
    guest = Guest(
        id=vmid,
        node=node,
        kind="vm" if kind == "qemu" else "ct",
        name=str(row.get("name") or vmid),
        state=state,
        cpu=config.vcpus if config else maxcpu,
        memory=config.memory if config else as_int(row.get("maxmem")),
        disks=config.disks if config else (),
        cpu_used=cpu_used,
        memory_used=memory_used,
        pressure=pressure,
        devices=config.devices if config else (),
        uptime=as_int(row.get("uptime")),
        lock=_guest_lock(row, read),
        ha=service is not None,
        ha_state=ha_state if ha_state in HA_STATES else None,
        failback=service.failback if service is not None else True,
        tags=parse_tags(row.get("tags")) or (config.tags if config else ()),
        migrating_to=_guest_target(read, service, node),
    )
    return guest, KnownGuest(kind, node, service)


def _guest_ha(
    row: Mapping[str, Any], ha: HaView, kind: Literal["qemu", "lxc"], vmid: str, node: str
) -> tuple[HaService | None, str | None]:
    """The guest's HA service when the HA stack manages it (``ignored`` is not managed), and
    its HA state."""
    service = ha.services.get(vmid)
    managed = service is not None and service.request != "ignored"
    if service is None and row.get("hastate"):
        # Listed by /cluster/resources as HA-managed although the HA views missed it.
        service = listed_service(kind, vmid, row["hastate"], node)
        managed = True
    if not managed or service is None:
        return None, None
    return service, service.state or (
        row.get("hastate") if isinstance(row.get("hastate"), str) else None
    )


def _guest_lock(row: Mapping[str, Any], read: GuestRead) -> str | None:
    """The guest's lock; a guest whose config could not be read counts as locked."""
    lock = row.get("lock") if isinstance(row.get("lock"), str) else None
    if lock is None and read.config is not None:
        lock = read.config.lock
    if lock is None and read.unreadable:
        lock = "config-unreadable"  # not moved on what may be stale knowledge
    return lock


def _guest_target(read: GuestRead, service: HaService | None, node: str) -> str | None:
    """Where the guest is migrating to: its migration task's target, else the HA manager's."""
    if (
        read.target is None
        and service is not None
        and service.target not in (None, node)
        and service.state in ("migrate", "relocate")
    ):
        return service.target
    return read.target


def _guest_usage(
    row: Mapping[str, Any], points: Sequence[Mapping[str, Any]], state: GuestState, maxcpu: float
) -> tuple[float, int, Pressure]:
    """A guest's CPU use in cores, memory use in bytes and pressure; none when it is stopped."""
    if state == "stopped":
        return 0.0, 0, Pressure()
    # RRD averages over the window; the current values when the RRD has none.
    cpu_used = _average_cores(points, maxcpu)
    if cpu_used is None:
        cpu_used = (as_number(row.get("cpu")) or 0.0) * maxcpu
    mem = _average(points, "mem")
    memory_used = int(mem if mem is not None else (as_number(row.get("mem")) or 0))
    return cpu_used, memory_used, _pressure(points, row)


def _base_load(
    name: str,
    row: Mapping[str, Any],
    read: NodeRead,
    cpu: float,
    guests: Sequence[Guest],
    online: bool,
) -> tuple[float, int, Pressure]:
    """A node's CPU and memory use beyond its guests', and its pressure; none when offline."""
    if not online:
        return 0, 0, Pressure()
    used_cpu = _average_cores(read.rrd, cpu)
    if used_cpu is None:
        used_cpu = (as_number(row.get("cpu")) or 0.0) * cpu
    used_mem = _average(read.rrd, "memused")
    if used_mem is None:
        used_mem = as_number(row.get("mem")) or 0.0
    on_node = [g for g in guests if g.node == name and g.state != "stopped"]
    guest_cpu = sum(g.cpu_used or 0.0 for g in on_node)
    guest_mem = sum(g.memory_used or 0 for g in on_node)
    base_cpu = max(0.0, used_cpu - guest_cpu)
    base_memory = max(0, int(used_mem) - guest_mem)
    return base_cpu, base_memory, _pressure(read.rrd, {})


def _local_storage(
    resources: Sequence[Mapping[str, Any]], shared: frozenset[str]
) -> dict[str, dict[str, int]]:
    """Each node's local storages that hold guest disks, with their sizes in bytes."""
    storage: dict[str, dict[str, int]] = {}
    for item in resources:
        if item.get("type") != "storage" or item.get("storage") in shared:
            continue
        if item.get("status") not in (None, "available"):
            continue
        content = item.get("content")
        if isinstance(content, str) and not {"images", "rootdir"} & set(content.split(",")):
            continue  # holds no guest disks (ISO images, templates, backups)
        name, pool = item.get("node"), item.get("storage")
        if isinstance(name, str) and isinstance(pool, str):
            storage.setdefault(name, {})[pool] = as_int(item.get("maxdisk"))
    return storage


def _average(points: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [v for v in (as_number(p.get(key)) for p in points) if v is not None]
    return sum(values) / len(values) if values else None


def _average_cores(points: Sequence[Mapping[str, Any]], maxcpu: float) -> float | None:
    """Average CPU use in cores of RRD points (``cpu`` is a fraction of ``maxcpu``)."""
    values = []
    for point in points:
        cpu = as_number(point.get("cpu"))
        if cpu is not None:
            values.append(cpu * (as_number(point.get("maxcpu")) or maxcpu))
    return sum(values) / len(values) if values else None


def _pressure(points: Sequence[Mapping[str, Any]], current: Mapping[str, Any]) -> Pressure:
    """PSI averages (percent) from RRD points, else from the current values."""

    def value(key: str) -> float:
        found = _average(points, key)
        if found is None:
            found = as_number(current.get(key))
        return max(0.0, found or 0.0)

    return Pressure(
        cpu=value("pressurecpusome"),
        memory=value("pressurememorysome"),
        io=value("pressureiosome"),
        memory_full=value("pressurememoryfull"),
        io_full=value("pressureiofull"),
    )
