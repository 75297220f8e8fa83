"""Observation: the cluster as the Proxmox API shows it now, as a :class:`Cluster`.

:meth:`Observer.observe` reads, per observation:

* ``GET /cluster/resources`` once: nodes, guests (qemu and lxc, templates left out), storages;
* ``GET /storage``: which storages are shared (disks elsewhere are local
  :class:`~opendrs.model.cluster.Disk` s);
* ``GET /cluster/ha/resources`` and ``GET /cluster/ha/status/manager_status``: HA-managed guests,
  their HA state and migration target (a move the HA manager has queued counts as under way),
  nodes in HA maintenance, the HA manager's master (:mod:`~opendrs.backends.proxmox.motions`);
* ``GET /cluster/replication`` and ``GET /cluster/mapping/pci``: where the platform can move a
  guest at all (:mod:`~opendrs.backends.proxmox.limits`);
* the rules (:mod:`opendrs.backends.proxmox.rules`);
* ``GET /cluster/options``: whether Proxmox VE balances HA guests itself (``crs``'s
  ``ha-auto-rebalance``);
* per online node, ``/nodes/{n}/status`` (CPU architecture, the memory KSM shares) and
  ``/nodes/{n}/rrddata``;
* per guest on an online node, its config (vCPUs, memory, disks, passed-through devices) and, when
  it runs, its ``rrddata`` over ``usage_window`` (averages of CPU, memory and pressure; the current
  values of ``/cluster/resources`` when the RRD has none);
* for a guest locked by a migration, the running task's log, which names the target.

The per-node and per-guest reads are made a few at a time. An observation ends at its first read
that fails for good (the reads under way are given up on, those not started dropped), and an RRD
read that gets no answer makes the observation skip the other RRD reads, so an API that stops
answering ends an observation within about two reads' worst case.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from opendrs.backends.base import BackendError, check_observation
from opendrs.backends.proxmox.assemble import (
    GuestRead,
    KnownGuest,
    NodeRead,
    build_guests,
    build_nodes,
)
from opendrs.backends.proxmox.client import Abandoned, Client, HttpError, gather
from opendrs.backends.proxmox.config import ProxmoxConfig
from opendrs.backends.proxmox.guest_config import parse_guest_config
from opendrs.backends.proxmox.ha import HaView, parse_ha_view
from opendrs.backends.proxmox.limits import (
    PciMapping,
    read_pci_mappings,
    read_replication,
    with_limits,
)
from opendrs.backends.proxmox.motions import Master, Motion, ha_master, ha_motions
from opendrs.backends.proxmox.rules import read_rules
from opendrs.backends.proxmox.values import as_bool, as_dict, as_list, as_number
from opendrs.model.cluster import Cluster, Guest, HaScheduler, Settings
from opendrs.model.document import MAX_BYTES

log = logging.getLogger(__name__)

#: Proxmox's statuses for a node it cannot reach (pveproxy's proxying to another node failed).
_UNREACHABLE: Final = frozenset({595, 596})
#: Storage types that are shared by nature, whatever their ``shared`` flag says.
_NETWORK_STORAGE: Final = frozenset(
    {"rbd", "cephfs", "nfs", "cifs", "glusterfs", "iscsi", "iscsidirect", "pbs", "zfs"}
)
_MIGRATION_TARGET = re.compile(
    r"migration of (?:VM|CT) \d+ to node '?([A-Za-z0-9][A-Za-z0-9.-]*)'?"
)


class Observer:
    """Observes a cluster through ``client``; remembers what the next observation (and a
    migration) needs from the last one."""

    def __init__(
        self,
        client: Client,
        config: ProxmoxConfig,
        settings: Settings,
        cluster_name: str | None = None,
    ) -> None:
        self._client = client
        self._config = config
        self._settings = settings
        self._cluster_name = cluster_name
        #: What the last observation knew about each guest, by id.
        self.known: dict[str, KnownGuest] = {}
        self._shared: frozenset[str] | None = None
        self._seen_storages: frozenset[str] = frozenset()
        self._capacity: dict[str, tuple[float, int]] = {}
        self._warned: set[str] = set()
        #: Set when an RRD read of the observation under way failed: the others are skipped.
        self._rrd_failed = threading.Event()
        #: The PCI mappings of the observation under way (``None``: they cannot be read).
        self._pci: dict[str, PciMapping] | None = None
        #: The HA manager's motions and master, as the last observation read them.
        self.motions: tuple[Motion, ...] = ()
        self.master = Master(None, None)
        #: The cluster's nodes, and those online, as the last observation saw them.
        self.nodes: tuple[str, ...] = ()
        self.online: tuple[str, ...] = ()

    def observe(self) -> Cluster:
        with self._client.only_backend_errors("cannot read the cluster"):
            return self._observe()

    def live_pci(self) -> dict[str, bool] | None:
        """The PCI mappings the last observation read, each live-migration capable or not
        (``None``: they could not be read)."""
        return None if self._pci is None else {k: m.live for k, m in self._pci.items()}

    def shared(self) -> frozenset[str]:
        """The shared storages: as the last observation saw them, else read now."""
        return self._shared if self._shared is not None else self._shared_storages([])

    def _observe(self) -> Cluster:
        self._rrd_failed = threading.Event()
        resources = as_list(self._client.get("cluster/resources"), "/cluster/resources")
        listed = [str(r["node"]) for r in resources if r.get("type") == "node" and r.get("node")]
        node_rows = {
            str(r["node"]): r for r in resources if r.get("type") == "node" and r.get("node")
        }
        if len(listed) != len(node_rows):
            twice = next(n for n in listed if listed.count(n) > 1)
            raise BackendError(
                f"the observation is refused: node {twice}: listed twice by /cluster/resources"
            )
        guest_rows = [
            r
            for r in resources
            if r.get("type") in ("qemu", "lxc")
            and not as_bool(r.get("template"))
            and r.get("vmid") is not None
            and r.get("node") in node_rows
        ]
        shared = self._shared_storages(resources)
        ha = self._ha_view()
        jobs = read_replication(self._client, self._warn_once)
        self._pci = read_pci_mappings(self._client, self._warn_once)
        online = {n for n, r in node_rows.items() if r.get("status") == "online"}
        node_reads, guest_reads = self._read_nodes_and_guests(
            sorted(online), [r for r in guest_rows if r["node"] in online], shared
        )
        guests, known = build_guests(guest_rows, guest_reads, ha)
        mapped = {vmid: r.config.mapped for vmid, r in guest_reads.items() if r.config}
        guests = _with_queued_motions(
            with_limits(guests, jobs, mapped, self._pci), self.motions, node_rows
        )
        self._unseen_storages(guests)
        nodes = build_nodes(node_rows, node_reads, resources, shared, ha, guests, self._capacity)
        node_names = {n.name for n in nodes}
        rules = read_rules(self._client, self._config, guests, node_names, ha, self._warn_once)
        self.known = known
        self.nodes, self.online = tuple(sorted(node_rows)), tuple(sorted(online))
        name = self._cluster_name or self._name_of_cluster(node_names)
        crs = self._crs()
        cluster = Cluster(
            tuple(nodes),
            tuple(guests),
            rules,
            self._settings,
            name,
            crs_auto_rebalance(crs),
            crs_ha_scheduler(crs),
        )
        return check_observation(cluster, FIELDS)

    def _read_nodes_and_guests(
        self, nodes: list[str], guest_rows: list[dict[str, Any]], shared: frozenset[str]
    ) -> tuple[dict[str, NodeRead], dict[str, GuestRead]]:
        """The reads of each node and each guest, made a few at a time."""
        jobs: list[Callable[[], Any]] = [lambda n=n: self._read_node(n) for n in nodes]
        jobs += [lambda r=r: self._read_guest(r, shared) for r in guest_rows]
        results = gather(jobs)
        node_reads: dict[str, NodeRead] = dict(zip(nodes, results[: len(nodes)], strict=True))
        guest_reads: dict[str, GuestRead] = {
            str(r["vmid"]): g for r, g in zip(guest_rows, results[len(nodes) :], strict=True)
        }
        return node_reads, guest_reads

    def _read_node(self, name: str) -> NodeRead:
        try:
            status = as_dict(self._client.get(f"nodes/{name}/status"), f"/nodes/{name}/status")
        except HttpError as exc:
            if exc.status not in _UNREACHABLE:
                raise
            self._warn_once(f"node {name} is unreachable: {exc.message}")
            return NodeRead(reachable=False)
        kernel = status.get("current-kernel")
        arch = kernel.get("machine") if isinstance(kernel, dict) else None
        rrd = self._rrd(f"nodes/{name}/rrddata")
        return NodeRead(
            arch if isinstance(arch, str) and arch else None,
            rrd,
            ksm_shared=_ksm_shared(status.get("ksm")),
        )

    def _read_guest(self, row: Mapping[str, Any], shared: frozenset[str]) -> GuestRead:
        node, vmid, kind = row["node"], row["vmid"], row["type"]
        base = f"nodes/{node}/{kind}/{vmid}"
        try:
            raw = as_dict(self._client.get(f"{base}/config"), f"/{base}/config")
        except HttpError as exc:
            # Gone or moved since /cluster/resources was read, or its node just went away.
            if exc.status not in _UNREACHABLE and "does not exist" not in exc.message:
                raise
            log.debug("guest %s: %s", vmid, exc)
            return GuestRead(unreadable=True)
        maxcpu = as_number(row.get("maxcpu")) or 0.0
        running = row.get("status") == "running"
        config = parse_guest_config(
            kind, raw, maxcpu, shared, running=running, live_pci=self.live_pci()
        )
        read = GuestRead(config=config)
        if row.get("status") == "running":
            read.rrd = self._rrd(f"{base}/rrddata")
        if row.get("lock") == "migrate":
            read.target = self._migration_target(str(node), str(vmid), kind)
        return read

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    def _rrd(self, path: str) -> list[dict[str, Any]]:
        """RRD points over the usage window; none when the RRD cannot be read (the current
        values stand in), unless the credentials are the problem.

        Once an RRD read of an observation got no answer (after its retries), the observation's
        other RRD reads are skipped: a node whose RRD hangs costs one call's worst case, not one
        per guest.
        """
        if self._rrd_failed.is_set():
            return []
        try:
            return as_list(
                self._client.get(path, timeframe=self._config.usage_window, cf="AVERAGE"),
                f"/{path}",
            )
        except HttpError as exc:
            if exc.status in (401, 403):
                raise
            log.debug("no RRD data: %s", exc)
        except Abandoned:
            raise
        except BackendError as exc:
            if not self._rrd_failed.is_set():
                self._rrd_failed.set()
                log.info("no RRD data: %s; the current values stand in this time", exc)
                self._warn_once(
                    "RRD data cannot be read (no answer): the current values stand in for the "
                    "measured usage while it cannot"
                )
        return []

    def _name_of_cluster(self, nodes: Iterable[str]) -> str:
        try:
            status = as_list(self._client.get("cluster/status"), "/cluster/status")
        except BackendError as exc:
            if exc.transient:
                raise
            self._warn_once(f"cannot read the cluster's name: {exc}")
            status = []
        for item in status:
            if item.get("type") == "cluster" and isinstance(item.get("name"), str):
                self._cluster_name = item["name"]
                return self._cluster_name
        self._cluster_name = min(nodes, default="proxmox")
        return self._cluster_name

    def _shared_storages(self, resources: Sequence[Mapping[str, Any]]) -> frozenset[str]:
        """Storages whose volumes every node sees: ``/storage`` (storage.cfg), together with the
        storage entries of ``/cluster/resources``; network storage types are shared by nature.

        Both list only the storages the user may audit (``Datastore.Audit``): a disk on a storage
        seen in neither counts as local, and :meth:`_unseen_storages` says so once.
        """
        try:
            storages = as_list(self._client.get("storage"), "/storage")
        except HttpError as exc:
            if exc.transient:
                raise
            self._warn_once(f"{exc}; the shared flags come from /cluster/resources instead")
            storages = []
        storages += [
            {"storage": r.get("storage"), "shared": r.get("shared"), "type": r.get("plugintype")}
            for r in resources
            if r.get("type") == "storage"
        ]
        shared: set[str] = set()
        seen: set[str] = set()
        for item in storages:
            name = item.get("storage")
            if not isinstance(name, str):
                continue
            seen.add(name)
            if as_bool(item.get("shared")) or item.get("type") in _NETWORK_STORAGE:
                shared.add(name)
        self._shared = frozenset(shared)
        self._seen_storages = frozenset(seen)
        return self._shared

    def _unseen_storages(self, guests: Sequence[Guest]) -> None:
        """Warn (once) about storages that guests use but that no listing showed."""
        unseen = sorted(
            {d.pool for g in guests for d in g.disks} - self._seen_storages - self.shared()
        )
        if unseen:
            what = "storage {} is" if len(unseen) == 1 else "storages {} are"
            self._warn_once(
                f"{what.format(', '.join(unseen))} not listed for {self._config.auth_id} (is "
                "Datastore.Audit on /storage missing?): disks there count as local"
            )

    def _ha_view(self) -> HaView:
        resources = as_list(self._client.get("cluster/ha/resources"), "/cluster/ha/resources")
        status = as_dict(
            self._client.get("cluster/ha/status/manager_status"),
            "/cluster/ha/status/manager_status",
        )
        self.motions = ha_motions(status)
        self.master = ha_master(status, time.time())
        return parse_ha_view(resources, status)

    def _crs(self) -> object:
        """The ``crs`` datacenter option (pve-cluster ``DataCenterConfig.pm``; read by
        pve-ha-manager 5.2 ``Manager.pm`` ``update_crs_scheduler_mode``): whether Proxmox VE's
        own balancer of HA guests is on (``ha-auto-rebalance``) and the HA scheduler mode
        (``ha``). None when the options cannot be read for good (a cluster older than the
        option, or a user without ``Sys.Audit`` on ``/``, to whom Proxmox shows no ``crs``):
        the balancer is then taken to be off and the mode unknown."""
        try:
            options = as_dict(self._client.get("cluster/options"), "/cluster/options")
        except HttpError as exc:
            if exc.transient or exc.status in (401,):
                raise
            self._warn_once(
                f"cannot read the datacenter options ({exc}): Proxmox VE's own "
                "balancing of HA guests (ha-auto-rebalance) is taken to be off"
            )
            return None
        return options.get("crs")

    def _migration_target(self, node: str, vmid: str, kind: str) -> str | None:
        """The target of the migration task running for a guest, from the task's log; ``None``
        when it cannot be told (the guest then stays locked and is not moved)."""
        try:
            return self._read_migration_target(node, vmid, kind)
        except HttpError as exc:
            if exc.status in (401, 403):
                raise
            log.debug("guest %s: no migration target: %s", vmid, exc)
            return None

    def _read_migration_target(self, node: str, vmid: str, kind: str) -> str | None:
        tasks = as_list(
            self._client.get(f"nodes/{node}/tasks", vmid=vmid, source="active", limit=50),
            f"/nodes/{node}/tasks",
        )
        task_type = "qmigrate" if kind == "qemu" else "vzmigrate"
        for task in tasks:
            upid = task.get("upid")
            if (
                not isinstance(upid, str)
                or task.get("type") != task_type
                or str(task.get("id")) != vmid
                or task.get("endtime")
            ):
                continue
            lines = as_list(
                self._client.get(f"nodes/{node}/tasks/{upid}/log", start=0, limit=20),
                f"/nodes/{node}/tasks/…/log",
            )
            for line in lines:
                found = _MIGRATION_TARGET.search(str(line.get("t", "")))
                if found and found.group(1) != node:
                    return found.group(1)
        return None


def _with_queued_motions(
    guests: list[Guest], motions: Iterable[Motion], nodes: Mapping[str, object]
) -> list[Guest]:
    """``guests`` with each move the HA manager has queued to one of ``nodes`` counted as under
    way (on both nodes, as :attr:`Guest.migrating_to
    <opendrs.model.cluster.Guest.migrating_to>` counts it)."""
    queued = {m.guest: m.target for m in motions if m.queued and m.target in nodes}
    if not queued:
        return guests
    return [
        replace(g, migrating_to=queued[g.id])
        if g.id in queued and g.migrating_to is None and queued[g.id] != g.node
        else g
        for g in guests
    ]


#: Where each value of a node or guest comes from, for :func:`check_observation`'s message.
FIELDS: Final = {
    "guest.id": "vmid of /cluster/resources",
    "guest.name": "name of /cluster/resources",
    "guest.node": "node of /cluster/resources",
    "guest.cpu": "the config's vcpus or cores × sockets (maxcpu of /cluster/resources)",
    "guest.memory": "the config's memory (maxmem of /cluster/resources)",
    "guest.disks": "the disk sizes of the config",
    "guest.usage.cpu": "cpu of the guest's rrddata (of /cluster/resources without one)",
    "guest.usage.memory": "mem of the guest's rrddata (of /cluster/resources without one)",
    "guest.pressure": "the pressure fields of the guest's rrddata",
    "guest.uptime": "uptime of /cluster/resources",
    "guest.devices": "the config's hostpci and usb entries",
    "guest.tags": "tags",
    "guest.lock": "lock",
    "guest.migrating_to": "the target of its migration task (or of a move the HA manager queued)",
    "guest.failback": "failback of /cluster/ha/resources",
    "guest.limits": "/cluster/replication and /cluster/mapping/pci",
    "node.name": "node of /cluster/resources",
    "node.cpu": "maxcpu of /cluster/resources",
    "node.memory": "maxmem of /cluster/resources",
    "node.usage.cpu": "cpu of the node's rrddata, less its guests'",
    "node.usage.memory": "memused of the node's rrddata, less its guests'",
    "node.pressure": "the pressure fields of the node's rrddata",
    "node.storage": "maxdisk of its local storages in /cluster/resources",
    "node.ksm": "ksm.shared of /nodes/{node}/status",
    "node.arch": "current-kernel.machine of /nodes/{node}/status",
}


def _ksm_shared(value: object) -> int:
    """Bytes of ``ksm: {shared: BYTES}`` in a node's status; 0 when missing or not a size."""
    shared = value.get("shared") if isinstance(value, dict) else None
    if isinstance(shared, bool):
        return 0
    number = as_number(shared)
    if number is None or not 0 <= number <= MAX_BYTES:
        return 0
    return int(number)


def _crs_items(crs: object) -> dict[str, object] | None:
    """The ``crs`` option as a mapping: an object as ``/cluster/options`` gives it, or the
    property string of ``datacenter.cfg`` (``ha=static,ha-auto-rebalance=1``); None if neither."""
    if isinstance(crs, str):
        crs = dict(item.partition("=")[::2] for item in crs.split(",") if "=" in item)
    return crs if isinstance(crs, dict) else None


def crs_auto_rebalance(crs: object) -> bool:
    """``ha-auto-rebalance`` of the ``crs`` option (:func:`_crs_items`)."""
    items = _crs_items(crs)
    return items is not None and as_bool(items.get("ha-auto-rebalance"))


def crs_ha_scheduler(crs: object) -> HaScheduler | None:
    """The HA scheduler mode the ``crs`` option sets: ``ha=static`` is ``static``, any other
    (or none, Proxmox's default) ``basic``; None without a ``crs`` option: not set and not
    shown to the user cannot be told apart."""
    items = _crs_items(crs)
    if items is None:
        return None
    return "static" if items.get("ha") == "static" else "basic"
