"""A fake Proxmox VE cluster for the Proxmox backend's tests, built on fakepve (test-only, AGPL).

:class:`DrsFakePve` extends fakepve's ``FakePve`` with what opendrs reads and does that fakepve
0.5.0 leaves generic:

* per-node capacity (cores, memory, the host's own memory, CPU architecture, KSM sharing), and
  node usage derived from the *running* guests, in ``/nodes`` and ``/cluster/resources``;
  containers' usage from ``ct.stats``;
* ``GET /nodes/{node}/status`` with ``cpuinfo``, ``memory``, ``ksm`` and ``current-kernel``;
* guests that run have been up for a while, as on a real cluster: a running guest added without
  ``uptime=`` started :data:`DEFAULT_UPTIME` seconds (a day) ago (``uptime=SECONDS`` says
  otherwise; fakepve alone starts them at the moment they are added);
* RRD data for nodes and guests (points given by the test, else the current values);
* ``POST /nodes/{node}/qemu/{vmid}/migrate`` really moving the VM with ``FakePve.migrate`` and
  answering with Proxmox's errors; ``GET`` on it, Proxmox's migration precheck;
* the HA stack: resources, manager status (services, targets, node maintenance), rules (or
  legacy groups, as before Proxmox VE 9), and migrate/relocate requests that the "HA manager"
  carries out a little later, as a ``qmigrate``/``vzmigrate`` task owned by root@pam;
* replication jobs (``GET /cluster/replication``; a live migration of a replicated VM to a node
  that is not a replication target fails, as qemu-server refuses it), PCI mappings
  (``GET /cluster/mapping/pci``; mapped devices move when their mapping allows it, local devices
  as qemu-server counts them), the containers' own precondition with the nodes HA rules block,
  HA motions queued or under way (``cmd`` and states in the manager status) and a master that
  moves (:meth:`DrsFakePve.queue_ha_motion`, :attr:`DrsFakePve.ha_master`);
* ``DELETE /nodes/{node}/tasks/{upid}``, stopping a running task as Proxmox does (its owner may,
  others need ``Sys.Modify`` on the node): the task ends with the error ``received interrupt``,
  and a stopped migration leaves the guest on its source;
* answers withheld after the work is done (:meth:`DrsFakePve.withhold`): the request reaches the
  server and takes effect, but its answer comes late, or the connection breaks instead; or a proxy
  in front of the API answers an error instead (:meth:`DrsFakePve.answer_as_proxy`: 502, 504);
* the HA stack as Proxmox VE 9.2 ships it (the methods under "HA rules, failback and the CRS
  options"): node-affinity rules with ``affinity: negative``, an HA resource's ``failback`` and
  ``auto-rebalance`` flags in ``/cluster/ha/resources``, ``GET /cluster/options`` with the
  datacenter's ``crs`` (``ha-auto-rebalance``), and CRM rounds (:meth:`DrsFakePve.crm_rounds`)
  in which the HA manager moves a guest that is not where its rules want it — back to its
  highest-priority nodes when ``failback`` is on — as ``select_service_node`` does.

:class:`FakeCluster` serves one on 127.0.0.1 (a port the system picks) over TLS with a
certificate made by ``fakepve.certs.make_cert``, on its own event loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from fakepve import FakeCt, FakePve, FakeVm, PveError, TaskError
from fakepve.certs import make_cert
from fakepve.routing import param_error
from fakepve.server import USER

GiB = 1024**3
MiB = 1024**2
HOST = "127.0.0.1"
#: Seconds a running guest has been up when it is added without ``uptime=`` (a day).
DEFAULT_UPTIME = 86400


def _true(value: Any) -> bool:
    """A Proxmox boolean parameter, as the schema check leaves it (1, True, "1", "true")."""
    return value in (1, True, "1", "true", "on", "yes")


def _row_key(item: dict[str, Any]) -> tuple[str, Any]:
    """A row of /cluster/resources as (type, key): ("node", name), ("qemu", vmid)…"""
    kind = item.get("type")
    return (str(kind), item.get("node") if kind == "node" else item.get("vmid"))


class HaCrsMixin:
    """HA rules, failback and the CRS options, as Proxmox VE 9.2 ships them (a part of
    :class:`DrsFakePve`, kept apart)."""

    # -- HA rules, failback and the CRS options ------------------------------------------------

    def _init_ha_crs(self: Any) -> None:
        #: An HA resource's ``failback`` (default on) and ``auto-rebalance`` (default on) flags,
        #: by vmid; listed only when set, as Proxmox lists them.
        self.ha_failback: dict[int, bool] = {}
        self.ha_auto_rebalance: dict[int, bool] = {}
        #: The datacenter's ``crs`` option, as ``GET /cluster/options`` returns it (parsed).
        self.crs: dict[str, Any] = {"ha": "basic"}
        #: Moves the fake HA manager made on its own in its CRM rounds: (vmid, source, target).
        self.crm_moves: list[tuple[int, str, str]] = []
        self._crm_task: asyncio.Future[None] | None = None

    def _routes_ha_crs(self: Any) -> list[tuple[str, str, Any]]:
        return [("GET", "/cluster/options", self._cluster_options)]

    async def _cluster_options(self: Any, v: dict[str, Any], user: str) -> dict[str, Any]:
        """``GET /cluster/options``: ``datacenter.cfg`` parsed (``crs`` as an object), to a user
        with ``Sys.Audit`` on ``/``; others get only ``console`` and ``tag-style`` (and their
        allowed tags), as pve-manager's ``Cluster.pm`` ``get_options``."""
        options: dict[str, Any] = {"allowed-tags": []}
        if self.allowed(user, "/", "Sys.Audit"):
            options.update(keyboard="en-us", crs=dict(self.crs))
        return options

    def _ha_resource_flags(self: Any, guest: Any, item: dict[str, Any]) -> None:
        if guest.vmid in self.ha_failback:
            item["failback"] = int(self.ha_failback[guest.vmid])
        if guest.vmid in self.ha_auto_rebalance:
            item["auto-rebalance"] = int(self.ha_auto_rebalance[guest.vmid])

    def _ha_node_affinity(self: Any, sid: str) -> tuple[dict[str, int], bool] | None:
        """The node priorities and strictness of ``sid``'s enabled node-affinity rule, a
        negative rule as the positive one on the other nodes (``NodeAffinity.pm``); ``None``
        without one (a negative rule naming every node or giving priorities is dropped)."""
        nodes = sorted(self.nodes)
        for rule in self.ha_rules:
            if rule.get("type") != "node-affinity" or _true(rule.get("disable")):
                continue
            if sid not in str(rule.get("resources", "")).split(","):
                continue
            listed = {}
            for entry in str(rule.get("nodes", "")).split(","):
                name, _, priority = entry.partition(":")
                listed[name] = int(priority or 0)
            if rule.get("affinity") == "negative":
                if len(listed) >= len(nodes) or any(listed.values()):
                    return None
                listed = {n: 0 for n in nodes if n not in listed}
            return listed, _true(rule.get("strict"))
        return None

    def _ha_wanted(self: Any, guest: Any) -> str | None:
        """Where the HA manager moves ``guest`` this round, or ``None`` (it stays): as
        ``select_service_node`` with preference ``none`` — a guest stays where its rule allows
        unless ``failback`` is on, then it goes to (or stays on) its highest-priority online
        nodes, the one with the fewest HA guests first."""
        online = [
            n
            for n, state in sorted(self.nodes.items())
            if state.get("online", True) and n not in self.ha_maintenance
        ]
        affinity = self._ha_node_affinity(self._sid(guest))
        if affinity is None:
            priorities = dict.fromkeys(online, 0)
        else:
            priorities, strict = affinity
            priorities = {n: p for n, p in priorities.items() if n in online}
            if not strict:
                for node in online:
                    priorities.setdefault(node, -1)
        if not priorities:
            return None
        if not self.ha_failback.get(guest.vmid, True) and guest.node in priorities:
            return None
        top = max(priorities.values())
        preferred = sorted(n for n, p in priorities.items() if p == top)
        if guest.node in preferred:
            return None
        count = {n: sum(1 for g in self._ha_guests() if g.node == n) for n in preferred}
        return min(preferred, key=lambda n: (count[n], n))

    async def crm_round(self: Any) -> None:
        """One round of the HA manager: every started HA guest that is not moving goes where
        :meth:`_ha_wanted` says."""
        for guest in self._ha_guests():
            sid = self._sid(guest)
            if guest.ha_state != "started" or guest.lock or sid in self.ha_targets:
                continue
            if self.ha_request.get(guest.vmid, "started") != "started":
                continue
            target = self._ha_wanted(guest)
            if target is not None:
                self.crm_moves.append((guest.vmid, guest.node, target))
                self._ha_later(
                    guest, target, "relocate" if isinstance(guest, FakeCt) else "migrate"
                )

    def crm_rounds(self: Any, secs: float = 10.0) -> None:
        """Run a CRM round every ``secs`` PVE seconds (a round is about 10 s on Proxmox,
        ``CRM.pm``) until the fake stops; call on the fake's loop (``FakeCluster.crm_rounds``)."""

        async def rounds() -> None:
            while True:
                await self.crm_round()
                await self.pause(secs)
                await asyncio.sleep(0.01)

        self._crm_task = asyncio.ensure_future(rounds())


class DrsFakePve(FakePve, HaCrsMixin):
    """FakePve with node capacity, derived usage, RRD, node status, migration and HA."""

    def __init__(self, user: str = "root@pam", password: str = "secret") -> None:
        super().__init__(user=user, password=password, host=HOST, port=0)
        #: node -> {cpu, memory, base_memory, base_cpu, arch, ksm_shared}
        self.capacity: dict[str, dict[str, Any]] = {}
        self._set_capacity("pve1")
        #: Offline nodes show their size (maxcpu, maxmem) in /cluster/resources, as Proxmox does
        #: while it has RRD data of the node; False: no size, as when it has none.
        self.offline_sizes = False
        #: RRD points given by the test: vmid -> points, node -> points.
        self.guest_rrd: dict[int, list[dict[str, Any]]] = {}
        self.node_rrd: dict[str, list[dict[str, Any]]] = {}
        #: (what, timeframe, cf) of every RRD request.
        self.rrd_requests: list[tuple[str, str, str]] = []
        #: The parameters of every migration request: (path, params).
        self.migrations: list[tuple[str, dict[str, Any]]] = []
        #: PVE seconds a migration takes.
        self.migrate_secs = 20.0
        #: HA: requested state, legacy group, and where a service is moving.
        self.ha_request: dict[int, str] = {}
        self.ha_group: dict[int, str] = {}
        self.ha_targets: dict[str, str] = {}
        self.ha_maintenance: set[str] = set()
        self.ha_rules: list[dict[str, Any]] = []
        self.ha_groups: list[dict[str, Any]] = []
        #: False: the cluster predates Proxmox VE 9 (no /cluster/ha/rules).
        self.rules_api = True
        #: Rows /cluster/resources lists again after its own (a node or guest listed twice),
        #: each a (type, key) as ("node", "pve2") or ("qemu", 101), and values to override in
        #: a guest's or node's row: (type, key) -> fields.
        self.listed_twice: list[tuple[str, Any]] = []
        self.row_fields: dict[tuple[str, Any], dict[str, Any]] = {}
        self._background: set[asyncio.Future[None]] = set()
        #: The HA manager refuses moves (as PVE 9 does with blocking resources).
        self.ha_blocking: list[dict[str, str]] = []
        #: Answers withheld: (method, path suffix) -> seconds of delay, or None to break the
        #: connection instead of answering.
        self.withheld: dict[tuple[str, str], float | None] = {}
        #: The paths of the requests whose answer is (or was) withheld, as they came.
        self.held_back: list[str] = []
        #: (method, path suffix) -> the status a proxy answers instead of the API's answer.
        self.proxied: dict[tuple[str, str], int] = {}
        #: Set when the fake stops, to end withheld answers at once (made on the fake's loop).
        self._stopping: asyncio.Event | None = None
        #: Stop requests of running tasks: upid -> event.
        self._task_stops: dict[str, asyncio.Event] = {}
        #: UPIDs of the tasks stopped through the API.
        self.stopped_tasks: list[str] = []
        #: Replication jobs as ``/cluster/replication`` lists them (id, type, guest, target,
        #: source); a job's target follows the guest when it moves there.
        self.replication_jobs: list[dict[str, Any]] = []
        #: PCI mappings by id: {"map": ["node=pve1,path=0000:01:00.0", …],
        #: "live-migration-capable": 0|1}.
        self.pci_mappings: dict[str, dict[str, Any]] = {}
        #: Moves the HA manager has queued (sid -> [action, target]), shown as ``cmd``.
        self.ha_cmds: dict[str, list[str]] = {}
        #: The HA manager's master (None: the first node) and the age of its status in seconds.
        self.ha_master: str | None = None
        self.ha_master_age = 0.0
        self._init_ha_crs()

    # -- withheld answers ----------------------------------------------------------------------

    def withhold(self, method: str, suffix: str, secs: float | None = None) -> None:
        """Do what requests ``method`` on a path ending with ``suffix`` ask, then answer only
        after ``secs`` real seconds — or, with ``secs`` None, break the connection instead."""
        self.withheld[(method, suffix)] = secs

    def answer_as_proxy(self, method: str, suffix: str, status: int) -> None:
        """Do what requests ``method`` on a path ending with ``suffix`` ask, then answer as a
        proxy in front of the API would when the API's answer did not reach it: ``status`` (502
        Bad Gateway, 504 Gateway Timeout) with the proxy's own page."""
        self.proxied[(method, suffix)] = status

    def _withheld(self, request: web.Request) -> tuple[bool, float | None]:
        for (method, suffix), secs in self.withheld.items():
            if request.method == method and request.path.endswith(suffix):
                return True, secs
        return False, None

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response = await super()._middleware(request, handler)
        for (method, suffix), status in self.proxied.items():
            if request.method == method and request.path.endswith(suffix):
                page = f"<html><body><h1>{status} proxy error</h1></body></html>"
                return web.Response(status=status, text=page, content_type="text/html")
        withheld, secs = self._withheld(request)
        if not withheld:
            return response
        self.held_back.append(request.path)
        if secs is None:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("fakepve: connection broken before the answer")
        if self._stopping is None:
            self._stopping = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), secs)
        return response

    async def stop(self) -> None:
        if self._crm_task is not None:
            self._crm_task.cancel()
        if self._stopping is not None:
            self._stopping.set()
        for event in self._task_stops.values():
            event.set()
        await super().stop()

    # -- tasks that can be stopped -------------------------------------------------------------

    async def task(
        self,
        node: str,
        ttype: str,
        tid: Any,
        user: str,
        body: Any,
        vm: Any = None,
        lock: bool = True,
        log: Any = (),
    ) -> str:
        """fakepve's task, which ``DELETE /nodes/{node}/tasks/{upid}`` can stop while it runs."""
        stop = asyncio.Event()
        started: list[str] = []

        async def stoppable() -> Any:
            work = asyncio.ensure_future(body())
            stopped = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                if started:
                    self._task_stops.pop(started[0], None)
            if work.done():
                return work.result()
            work.cancel()  # the body's own clean-up runs: a migration leaves the guest where it was
            with contextlib.suppress(asyncio.CancelledError):
                await work
            raise TaskError("received interrupt")

        upid: str = await super().task(node, ttype, tid, user, stoppable, vm=vm, lock=lock, log=log)
        if self.tasks[upid]["status"] == "running":  # it runs on (time_scale > 0): stoppable
            started.append(upid)
            self._task_stops[upid] = stop
        return upid

    async def _task_stop(self, v: dict[str, Any], user: str) -> None:
        upid = v["upid"]
        task = self.tasks.get(upid)
        if task is None or task["node"] != v["node"]:
            raise param_error(upid="unable to parse worker upid")
        if not self._task_owner(user, task):
            self.require(user, f"/nodes/{task['node']}", "Sys.Modify")
        stop = self._task_stops.pop(upid, None)
        if stop is not None and task["status"] == "running":
            self.stopped_tasks.append(upid)
            stop.set()
        return None

    # -- nodes ---------------------------------------------------------------------------------

    def _set_capacity(
        self,
        name: str,
        cpu: int = 8,
        memory: int = 32 * GiB,
        base_memory: int = 2 * GiB,
        base_cpu: float = 0.25,
        arch: str = "x86_64",
        ksm_shared: int | None = 0,
    ) -> None:
        """``ksm_shared``: the bytes KSM shares on the node (``None``: ``/status`` has no
        ``ksm``, as a node without KSM support)."""
        self.capacity[name] = {
            "cpu": cpu,
            "memory": memory,
            "base_memory": base_memory,
            "base_cpu": base_cpu,
            "arch": arch,
            "ksm_shared": ksm_shared,
        }

    def add_node(self, name: str, online: bool = True, **capacity: Any) -> None:
        super().add_node(name, online)
        self._set_capacity(name, **capacity)

    def add_vm(self, *args: Any, uptime: float = DEFAULT_UPTIME, **kwargs: Any) -> FakeVm:
        """fakepve's ``add_vm``; a running VM has been up ``uptime`` seconds (a day)."""
        vm = super().add_vm(*args, **kwargs)
        self.capacity.setdefault(vm.node, self.capacity.get("pve1", {}).copy())
        self._up_since(vm, uptime)
        return vm

    def add_ct(self, *args: Any, uptime: float = DEFAULT_UPTIME, **kwargs: Any) -> FakeCt:
        """fakepve's ``add_ct``; a running container has been up ``uptime`` seconds (a day)."""
        ct = super().add_ct(*args, **kwargs)
        self.capacity.setdefault(ct.node, self.capacity.get("pve1", {}).copy())
        self._up_since(ct, uptime)
        return ct

    @staticmethod
    def _up_since(guest: Any, uptime: float) -> None:
        if guest.status == "running":
            guest.started_at = time.time() - uptime

    def _guest_cpu_mem(self, guest: Any) -> tuple[float, float, int]:
        """(cpu fraction, maxcpu, mem bytes) of a running guest."""
        if isinstance(guest, FakeCt):
            maxcpu = float(self._cpus(guest))
            return float(guest.stats.get("cpu", 0.0)), maxcpu, int(guest.stats.get("mem", 0))
        use = self._vm_usage(guest)
        return float(use["cpu"]), float(use["maxcpu"]), int(use["mem"])

    def node_usage(self, node: str) -> tuple[float, int]:
        """(cpu fraction, memory used) of a node: its own load plus its running guests'."""
        cap = self.capacity[node]
        cores = cap["base_cpu"]
        mem = cap["base_memory"]
        for guest in [*self.vms, *self.cts]:
            if guest.node == node and guest.status == "running":
                cpu, maxcpu, used = self._guest_cpu_mem(guest)
                cores += cpu * maxcpu
                mem += used
        return min(1.0, cores / cap["cpu"]), mem

    def _node_fields(self, item: dict[str, Any]) -> None:
        name = item.get("node")
        if name not in self.capacity:
            return
        cap = self.capacity[name]
        if item.get("status") != "online":
            if self.offline_sizes:
                item.update(maxcpu=cap["cpu"], maxmem=cap["memory"])
            return
        cpu, mem = self.node_usage(name)
        item.update(cpu=cpu, maxcpu=cap["cpu"], mem=mem, maxmem=cap["memory"])

    @staticmethod
    def _data(response: web.Response) -> Any:
        return json.loads(response.text)["data"]

    async def _nodes(self, request: web.Request) -> web.Response:
        data = self._data(await super()._nodes(request))
        for item in data:
            self._node_fields(item)
        return web.json_response({"data": data})

    async def _resources(self, request: web.Request) -> web.Response:
        data = self._data(await super()._resources(request))
        user = request[USER]
        # As PVE: a storage is listed only to those who may audit it (fakepve lists it to all).
        data = [
            item
            for item in data
            if item.get("type") != "storage"
            or self.allowed(user, f"/storage/{item['storage']}", "Datastore.Audit")
            or self.allowed(user, f"/storage/{item['storage']}", "Datastore.AllocateSpace")
        ]
        for item in data:
            if item.get("type") == "node":
                self._node_fields(item)
            elif item.get("type") == "lxc":
                ct = self.ct(item["vmid"])
                if ct is not None and ct.status == "running":
                    item.update((k, v) for k, v in ct.stats.items() if k in ("cpu", "mem"))
        for item in data:
            item.update(self.row_fields.get(_row_key(item), {}))
        data += [dict(item) for key in self.listed_twice for item in data if _row_key(item) == key]
        return web.json_response({"data": data})

    # -- routes --------------------------------------------------------------------------------

    def _routes_drs(self) -> list[tuple[str, str, Any]]:
        qemu = "/nodes/{node}/qemu/{vmid}"
        return [
            ("GET", "/nodes/{node}/status", self._node_status),
            ("GET", "/nodes/{node}/rrddata", self._node_rrddata),
            ("GET", qemu + "/rrddata", self._qemu_rrddata),
            ("GET", "/nodes/{node}/lxc/{vmid}/rrddata", self._lxc_rrddata),
            ("GET", qemu + "/migrate", self._qemu_migrate_check),
            ("POST", qemu + "/migrate", self._qemu_migrate),
            ("GET", "/cluster/ha/resources", self._ha_resources),
            ("GET", "/cluster/ha/status/manager_status", self._ha_manager_status),
            ("GET", "/cluster/ha/rules", self._ha_rules_list),
            ("GET", "/cluster/ha/groups", self._ha_groups_list),
            ("POST", "/cluster/ha/resources/{sid}/migrate", self._ha_migrate),
            ("POST", "/cluster/ha/resources/{sid}/relocate", self._ha_relocate),
            ("DELETE", "/nodes/{node}/tasks/{upid}", self._task_stop),
        ]

    async def _node_status(self, v: dict[str, Any], user: str) -> dict[str, Any]:
        node = v["node"]
        cap = self.capacity[node]
        cpu, mem = self.node_usage(node)
        return {
            "cpu": cpu,
            "cpuinfo": {
                "cpus": cap["cpu"],
                "cores": max(1, cap["cpu"] // 2),
                "sockets": 1,
                "model": "Fake CPU @ 3.0GHz",
            },
            "memory": {
                "total": cap["memory"],
                "used": mem,
                "free": cap["memory"] - mem,
                "available": cap["memory"] - mem,
            },
            **({} if cap["ksm_shared"] is None else {"ksm": {"shared": cap["ksm_shared"]}}),
            "loadavg": ["0.10", "0.20", "0.30"],
            "current-kernel": {
                "sysname": "Linux",
                "release": "6.14.8-2-pve",
                "version": "#1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2",
                "machine": cap["arch"],
            },
            "pveversion": "pve-manager/9.0.10/deadbeef",
            "uptime": 3600,
        }

    def _record_rrd(self, what: str, v: dict[str, Any]) -> None:
        self.rrd_requests.append((what, str(v.get("timeframe")), str(v.get("cf"))))

    async def _node_rrddata(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        node = v["node"]
        self._record_rrd(f"node/{node}", v)
        if node in self.node_rrd:
            return self.node_rrd[node]
        cap = self.capacity[node]
        cpu, mem = self.node_usage(node)
        now = int(time.time())
        return [
            {
                "time": now - 60 * k,
                "cpu": cpu,
                "maxcpu": cap["cpu"],
                "memused": mem,
                "memtotal": cap["memory"],
            }
            for k in range(3)
        ]

    def _guest_rrd(self, guest: Any, what: str, v: dict[str, Any]) -> list[dict[str, Any]]:
        self._record_rrd(f"{what}/{guest.vmid}", v)
        if guest.vmid in self.guest_rrd:
            return self.guest_rrd[guest.vmid]
        if guest.status != "running":
            return [{}]
        cpu, maxcpu, mem = self._guest_cpu_mem(guest)
        now = int(time.time())
        return [{"time": now - 60 * k, "cpu": cpu, "maxcpu": maxcpu, "mem": mem} for k in range(3)]

    async def _qemu_rrddata(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        return self._guest_rrd(self.find(v["node"], v["vmid"]), "qemu", v)

    async def _lxc_rrddata(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        return self._guest_rrd(self._find_ct(v["node"], v["vmid"]), "lxc", v)

    # -- migration -----------------------------------------------------------------------------

    def _local_disks(self, vm: FakeVm) -> list[str]:
        out = []
        for key in vm.devices():
            if key.startswith(("net", "usb", "hostpci")):
                continue
            volume = str(vm.config[key]).split(",")[0]
            if "media=cdrom" in str(vm.config[key]):
                continue
            storage = volume.split(":")[0]
            if not self.storages.get(storage, {}).get("shared"):
                out.append(key)
        return out

    async def _qemu_migrate_check(self, v: dict[str, Any], user: str) -> dict[str, Any]:
        vm = self.find(v["node"], v["vmid"])
        allowed, refused = [], {}
        storages = {str(vm.config[k]).split(":")[0] for k in self._local_disks(vm)}
        for node in sorted(self.nodes):
            if node == vm.node:
                continue
            missing = sorted(s for s in storages if not self._storage_enabled(s, node))
            if missing:
                refused[node] = {"unavailable_storages": missing}
            else:
                allowed.append(node)
        running = vm.status == "running"
        for node, missing in self._missing_mappings(vm).items():
            if node != vm.node and missing:
                refused.setdefault(node, {})["unavailable-resources"] = missing
                allowed = [n for n in allowed if n != node]
        return {
            "running": 1 if running else 0,
            "allowed_nodes": allowed,
            "not_allowed_nodes": refused,
            "local_disks": [{"volid": vm.config[k], "drivename": k} for k in self._local_disks(vm)],
            "local_resources": self._vm_local_resources(vm, running),
            "mapped-resources": sorted(self._vm_mapped(vm)),
        }

    async def _qemu_migrate(self, v: dict[str, Any], user: str) -> str:
        node, vmid, target = v["node"], int(v["vmid"]), v["target"]
        self.migrations.append((f"/nodes/{node}/qemu/{vmid}/migrate", dict(v)))
        if target == node:
            raise PveError(
                400, "Parameter verification failed.", {"target": "target is local node."}
            )
        self.need_quorum()
        if target not in self.nodes:
            raise PveError(500, f"no such cluster node '{target}'")
        vm = self.find(node, vmid)
        if vm.lock:
            raise PveError(500, f"VM is locked ({vm.lock})")
        online = _true(v.get("online"))
        if vm.status == "running" and not online:
            raise PveError(500, "can't migrate running VM without --online")
        if vm.status == "running":
            self._refuse_unreplicated_target(vm, target, v)
        if vm.ha_managed:
            # PVE hands an HA-managed VM's migration to the HA stack: a short 'hamigrate' task.
            async def request() -> str:
                self._ha_later(vm, target, "migrate")
                return f"Requesting HA migration for VM {vmid} to node {target}"

            return await self.task(node, "hamigrate", vmid, user, request)
        devices = self._vm_local_resources(vm, vm.status == "running")
        if devices:
            raise PveError(500, f"can't migrate VM which uses local devices: {', '.join(devices)}")
        missing = self._missing_mappings(vm).get(target)
        if missing:
            raise PveError(500, f"can't migrate to '{target}': missing mapped devices {missing}")
        local_disks = _true(v.get("with-local-disks"))
        if online and self._local_disks(vm) and not local_disks:
            raise PveError(
                500, "can't live migrate attached local disks without with-local-disks option"
            )
        if not self.nodes[target].get("online", True):
            start = f"starting migration of VM {vmid} to node '{target}' (192.0.2.99)"
            problem = (
                "ERROR: migration aborted (duration 00:00:03): Can't connect to destination "
                "address using public key"
            )

            async def abort() -> None:
                raise TaskError("migration aborted")

            return await self.task(node, "qmigrate", vmid, user, abort, vm=vm, log=[start, problem])
        return await self.migrate(vmid, target, secs=self.migrate_secs, user=user)

    # -- HA ------------------------------------------------------------------------------------

    def _ha_guests(self) -> list[Any]:
        return [g for g in [*self.vms, *self.cts] if g.ha_managed]

    @staticmethod
    def _sid(guest: Any) -> str:
        return f"{'ct' if isinstance(guest, FakeCt) else 'vm'}:{guest.vmid}"

    async def _ha_resources(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        out = []
        for guest in self._ha_guests():
            item = {
                "sid": self._sid(guest),
                "type": "ct" if isinstance(guest, FakeCt) else "vm",
                "state": self.ha_request.get(guest.vmid, "started"),
                "max_relocate": 1,
                "max_restart": 1,
                "digest": "0" * 40,
            }
            if guest.vmid in self.ha_group:
                item["group"] = self.ha_group[guest.vmid]
            self._ha_resource_flags(guest, item)
            if v.get("type") in (None, item["type"]):
                out.append(item)
        return out

    async def _ha_manager_status(self, v: dict[str, Any], user: str) -> dict[str, Any]:
        now = int(time.time())
        node_status = {}
        for name, state in sorted(self.nodes.items()):
            if name in self.ha_maintenance:
                node_status[name] = "maintenance"
            else:
                node_status[name] = "online" if state.get("online", True) else "unknown"
        services = {}
        for guest in self._ha_guests():
            sid = self._sid(guest)
            entry = {"node": guest.node, "state": guest.ha_state, "uid": "fake" + sid}
            if sid in self.ha_targets:
                entry["target"] = self.ha_targets[sid]
            services[sid] = entry
        lrm = {
            name: {
                "mode": "maintenance" if name in self.ha_maintenance else "active",
                "state": "active",
                "timestamp": now,
                "results": {},
            }
            for name in sorted(self.nodes)
        }
        return {
            "manager_status": {
                "master_node": self.ha_master or sorted(self.nodes)[0],
                "node_status": node_status,
                "service_status": self._with_ha_cmds(services),
                "timestamp": int(now - self.ha_master_age),
            },
            "lrm_status": lrm,
            "quorum": {"node": sorted(self.nodes)[0], "quorate": "1"},
        }

    async def _ha_rules_list(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        if not self.rules_api:
            raise PveError(501, "Method 'GET /api2/json/cluster/ha/rules' not implemented")
        return [r for r in self.ha_rules if v.get("type") in (None, r.get("type"))]

    async def _ha_groups_list(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        return list(self.ha_groups)

    def _ha_guest(self, sid: str) -> Any:
        vmid = sid.partition(":")[2]
        guest = self.guest(int(vmid)) if vmid.isdigit() else None
        if guest is None or not guest.ha_managed or self._sid(guest) != sid:
            raise PveError(500, f"service '{sid}' not defined")
        return guest

    async def _ha_request(self, v: dict[str, Any], action: str) -> dict[str, Any]:
        sid, target = v["sid"], v["node"]
        guest = self._ha_guest(sid)
        if target not in self.nodes:
            raise PveError(500, f"no such cluster node '{target}'")
        if self.ha_blocking:
            return {"sid": sid, "requested-node": target, "blocking-resources": self.ha_blocking}
        self._ha_later(guest, target, action)
        return {"sid": sid, "requested-node": target, "comigrated-resources": []}

    async def _ha_migrate(self, v: dict[str, Any], user: str) -> dict[str, Any]:
        return await self._ha_request(v, "migrate")

    async def _ha_relocate(self, v: dict[str, Any], user: str) -> dict[str, Any]:
        return await self._ha_request(v, "relocate")

    def _ha_later(self, guest: Any, target: str, action: str) -> None:
        """The HA manager carries out the request a round later, as root@pam."""
        task = asyncio.ensure_future(self._ha_move(guest, target, action))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _ha_move(self, guest: Any, target: str, action: str) -> None:
        await asyncio.sleep(0)  # after the request's answer, as PVE's CRM round
        await self.pause(self.ha_delay)
        if guest.node == target:
            return
        sid = self._sid(guest)
        guest.ha_state = action
        self.ha_targets[sid] = target
        try:
            if isinstance(guest, FakeCt):
                upid = await self._ct_relocate(guest, target)
            else:
                upid = await self.migrate(guest.vmid, target, secs=self.migrate_secs)
            while self.tasks[upid]["status"] == "running":
                await asyncio.sleep(0.005)
        finally:
            self.ha_targets.pop(sid, None)
            guest.ha_state = "started"

    async def _ct_relocate(self, ct: FakeCt, target: str) -> str:
        async def move() -> str:
            ct.lock = "migrate"
            try:
                await self.pause(self.migrate_secs)
                ct.node = target
            finally:
                ct.lock = None
            return "migration finished successfully"

        return await self.task(
            ct.node,
            "vzmigrate",
            ct.vmid,
            "root@pam",
            move,
            vm=ct,
            log=[f"starting migration of CT {ct.vmid} to node '{target}' (192.0.2.99)"],
        )

    # -- Proxmox VE 9: replication, mapped PCI, the containers' precondition, HA motions ------

    def _routes_drs_platform(self) -> list[tuple[str, str, Any]]:
        return [
            ("GET", "/cluster/replication", self._replication_list),
            ("GET", "/cluster/mapping/pci", self._pci_mapping_list),
        ]

    async def _replication_list(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        for job in self.replication_jobs:
            guest = self.guest(int(job["guest"]))
            if guest is not None and guest.node == job["target"]:
                # The guest moved to the job's target: the job now replicates back to its
                # source (ReplicationConfig.pm, switch_replication_job_target).
                job["target"], job["source"] = job.get("source", ""), guest.node
        # Listed to those who may audit the guest, or the whole system (ReplicationConfig.pm).
        return [
            dict(job)
            for job in self.replication_jobs
            if self.allowed(user, "/", "Sys.Audit")
            or self.allowed(user, f"/vms/{job['guest']}", "VM.Audit")
        ]

    async def _pci_mapping_list(self, v: dict[str, Any], user: str) -> list[dict[str, Any]]:
        # Listed only where the user may audit, use or modify the mapping (Mapping/PCI.pm).
        return [
            {"id": name, **entry}
            for name, entry in sorted(self.pci_mappings.items())
            if any(
                self.allowed(user, f"/mapping/pci/{name}", priv)
                for priv in ("Mapping.Audit", "Mapping.Use", "Mapping.Modify")
            )
        ]

    def _refuse_unreplicated_target(self, vm: FakeVm, target: str, v: dict[str, Any]) -> None:
        """A running replicated VM live-migrates only to a replication target (Qemu.pm)."""
        jobs = [j for j in self.replication_jobs if int(j["guest"]) == vm.vmid]
        to_target = [j for j in jobs if j.get("type", "local") == "local" and j["target"] == target]
        if jobs and not to_target and not _true(v.get("force")):
            raise PveError(
                500,
                f"Cannot live-migrate replicated VM to node '{target}' - not a replication "
                "target. Use 'force' to override.",
            )

    def _vm_mapped(self, vm: FakeVm) -> dict[str, str]:
        """The VM's mapped PCI devices: config key -> mapping id."""
        out = {}
        for key, value in vm.config.items():
            if key.startswith("hostpci"):
                props = dict(p.partition("=")[::2] for p in str(value).split(",") if "=" in p)
                if props.get("mapping"):
                    out[key] = props["mapping"]
        return out

    def _vm_local_resources(self, vm: FakeVm, running: bool) -> list[str]:
        """What qemu-server counts as local resources (QemuMigrate/Helpers.pm)."""
        mapped = self._vm_mapped(vm)
        out = []
        for key, value in sorted(vm.config.items()):
            text = str(value)
            if key in mapped:
                entry = self.pci_mappings.get(mapped[key], {})
                if _true(entry.get("live-migration-capable")) or not running:
                    continue
                out.append(key)
            elif key.startswith("usb") and key[3:].isdigit():
                if not text.startswith("spice"):
                    out.append(key)
            elif key.startswith("serial") and key[6:].isdigit():
                if text != "socket":
                    out.append(key)
            elif (
                (
                    key.startswith(("hostpci", "parallel", "virtiofs"))
                    and key.rstrip("0123456789") != key
                )
                or key == "ivshmem"
                or (key in ("amd-sev", "intel-tdx") and running)
            ):
                out.append(key)
        return out

    def _missing_mappings(self, vm: FakeVm) -> dict[str, list[str]]:
        """Per node, the VM's mapped devices whose mapping has no entry there."""
        out: dict[str, list[str]] = {}
        for key, name in sorted(self._vm_mapped(vm).items()):
            present = _mapping_nodes(self.pci_mappings.get(name, {}))
            for node in self.nodes:
                if node not in present:
                    out.setdefault(node, []).append(key)
        return out

    async def _lxc_migrate_check(self, user: str, v: dict[str, Any]) -> dict[str, Any]:
        """pve-container's precondition, with the nodes HA rules block for an HA resource."""
        answer: dict[str, Any] = await super()._lxc_migrate_check(user, v)  # type: ignore[misc]
        ct = self._find_ct(v["node"], v["vmid"])
        if not ct.ha_managed:
            return answer
        for node, blocking in sorted(self._ha_blockers(self._sid(ct)).items()):
            if node != ct.node:
                answer["not-allowed-nodes"][node] = {"blocking-ha-resources": blocking}
                answer["allowed-nodes"] = [n for n in answer["allowed-nodes"] if n != node]
        return answer

    def _ha_blockers(self, sid: str) -> dict[str, list[dict[str, str]]]:
        """Per node, the HA rules that forbid ``sid`` there: strict node affinity without the
        node, negative resource affinity with a resource on it (get_resource_motion_info)."""
        out: dict[str, list[dict[str, str]]] = {}
        for rule in self.ha_rules:
            members = [r.strip() for r in str(rule.get("resources", "")).split(",")]
            if _true(rule.get("disable")) or sid not in members:
                continue
            if rule.get("type") == "node-affinity" and _true(rule.get("strict")):
                named = {n.partition(":")[0] for n in str(rule.get("nodes", "")).split(",")}
                for node in self.nodes:
                    if node not in named:
                        out.setdefault(node, []).append({"sid": sid, "cause": "node-affinity"})
            elif rule.get("type") == "resource-affinity" and rule.get("affinity") == "negative":
                for other in members:
                    guest = self._ha_guest(other) if other != sid else None
                    if guest is not None:
                        cause = {"sid": other, "cause": "resource-affinity"}
                        out.setdefault(guest.node, []).append(cause)
        return out

    def _with_ha_cmds(self, services: dict[str, Any]) -> dict[str, Any]:
        """The service status with the queued moves as ``cmd``, as the CRM keeps them."""
        for sid, cmd in self.ha_cmds.items():
            if sid in services:
                services[sid]["cmd"] = list(cmd)
        return services

    def queue_ha_motion(self, vmid: int, target: str) -> None:
        """An operator (or failback, or Proxmox's balancer) asks the HA manager to move a guest:
        the command waits in the queue until :meth:`carry_out_ha_motions` (on the fake's loop:
        ``FakeCluster.run``)."""
        guest = self._ha_guest(f"{'ct' if self.ct(vmid) else 'vm'}:{vmid}")
        action = "relocate" if isinstance(guest, FakeCt) else "migrate"
        self.ha_cmds[self._sid(guest)] = [action, target]

    async def carry_out_ha_motions(self) -> None:
        """The HA manager's next round: every queued move starts."""
        for sid, (action, target) in list(self.ha_cmds.items()):
            self._carry_out(self._ha_guest(sid), target, action)

    def _carry_out(self, guest: Any, target: str, action: str) -> None:
        async def run() -> None:
            # The command leaves the queue as the service enters its state (one CRM round).
            move = asyncio.ensure_future(self._ha_move(guest, target, action))
            while guest.ha_state != action and not move.done():
                await asyncio.sleep(0.005)
            self.ha_cmds.pop(self._sid(guest), None)
            await move

        task = asyncio.ensure_future(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _mapping_nodes(entry: dict[str, Any]) -> set[str]:
    """The nodes a PCI mapping has an entry on (``node=NAME,…`` items of its ``map``)."""
    nodes = set()
    for item in entry.get("map", []):
        for part in str(item).split(","):
            key, _, value = part.partition("=")
            if key == "node":
                nodes.add(value)
    return nodes


def packed(pve: DrsFakePve, vmids: Sequence[int], *, memory_gib: int = 3) -> None:
    """Three nodes of 8 cores and 32 GiB (pve1–pve3), a Ceph storage, and running VMs ``vmids``
    of one core and ``memory_gib`` GiB, 30 % busy, all on pve1: any balancer spreads them."""
    for name in ("pve1", "pve2", "pve3"):
        pve.add_node(name, cpu=8, memory=32 * GiB, base_memory=1 * GiB)
    pve.add_ceph_storage("ceph")
    running_on_pve1(pve, vmids, memory_gib=memory_gib)


def running_on_pve1(pve: DrsFakePve, vmids: Sequence[int], *, memory_gib: int = 3) -> None:
    """Running VMs ``vmids`` of one core and ``memory_gib`` GiB on the Ceph storage, 30 % busy,
    all on pve1."""
    for vmid in vmids:
        vm = pve.add_vm(
            vmid,
            f"vm{vmid}",
            node="pve1",
            status="running",
            config={
                "cores": 1,
                "memory": memory_gib * 1024,
                "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G",
            },
        )
        vm.stats.update(cpu=0.3, mem=memory_gib * GiB)


class FakeCluster:
    """A :class:`DrsFakePve` served over TLS on 127.0.0.1 from a daemon thread."""

    def __init__(self, directory: str, *, time_scale: float = 0.0) -> None:
        self.cafile, keyfile, _ = make_cert(directory, hosts=(HOST,))
        self.pve = DrsFakePve()
        self.pve.time_scale = time_scale
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="drs-fakepve", daemon=True)
        self.thread.start()
        self.run(self.pve.start(self.cafile, keyfile))

    @property
    def address(self) -> str:
        return f"{HOST}:{self.pve.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        """Run a coroutine of the fake (``pve.migrate(…)``, ``pve.backup(…)``) on its loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def settle(self) -> None:
        """Let the fake's background work (HA requests, tasks) run."""

        async def idle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        self.run(idle())

    def crm_rounds(self, secs: float = 10.0) -> None:
        """Let the fake HA manager run its rounds (:meth:`HaCrsMixin.crm_rounds`)."""

        async def start() -> None:
            self.pve.crm_rounds(secs)

        self.run(start())

    def __enter__(self) -> FakeCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        try:
            self.run(self.pve.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():
                self.loop.close()


#: The API token the helpers below give ``opendrs@pve!drs``.
TOKEN_ID = "opendrs@pve!drs"
TOKEN_SECRET = "9f1c2e7a-5b3d-4c1e-8a6f-0d2b4e6f8a1c"


def three_nodes(
    directory: str, token_id: str = TOKEN_ID, secret: str = TOKEN_SECRET
) -> FakeCluster:
    """A fake served for ``opendrs`` run as a command: its certificate in ``directory/tls``, three
    nodes pve1, pve2, pve3 of 8 cores and 32 GiB (1 GiB the host's own), shared Ceph storage, the
    token ``token_id`` with ``secret``; its time runs at 1/100 of Proxmox's (a migration, 100 PVE
    seconds, takes a second). No guest yet."""
    tls = os.path.join(directory, "tls")
    os.mkdir(tls)
    cluster = FakeCluster(tls, time_scale=0.01)
    pve = cluster.pve
    pve.apitokens[token_id] = secret
    pve.migrate_secs = 100
    for name in ("pve1", "pve2", "pve3"):
        pve.add_node(name, cpu=8, memory=32 * GiB, base_memory=1 * GiB)
    pve.add_ceph_storage("ceph")
    return cluster


def proxmox_config(
    directory: Path,
    cluster: FakeCluster,
    *,
    mode: str,
    token: str = TOKEN_SECRET,
    executor: str = "{max_parallel: 1, poll_interval: 1s}",
    extra: str = "",
) -> Path:
    """``directory/opendrs.yaml`` against ``cluster`` as :data:`TOKEN_ID` with ``token``
    (``daemon.write_proxmox_config``: a policy that acts at the first observation, every second,
    ``extra`` appended as it is)."""
    from daemon import write_proxmox_config

    return write_proxmox_config(
        directory,
        cluster.address,
        cluster.cafile,
        user=TOKEN_ID,
        token=token,
        mode=mode,
        executor=executor,
        extra=extra,
    )


def shadow_config(directory: Path, cluster: FakeCluster) -> Path:
    """``directory/opendrs.yaml``: shadow mode against ``cluster`` with :data:`TOKEN_ID`."""
    return proxmox_config(directory, cluster, mode="shadow")
