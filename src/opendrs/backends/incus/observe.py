"""Observation: the cluster as the Incus API shows it now, as a :class:`Cluster`.

:meth:`Observer.observe` reads, per observation:

* ``GET /1.0``: the server's config (``cluster.rebalance.*``) and the member answering
  (``environment.server_name``);
* ``GET /1.0/cluster/members?recursion=1``: status, roles (the database leader), architecture,
  cluster groups, failure domain (read, not used yet), config (``scheduler.instance``); a server
  that is not clustered is one member;
* ``GET /1.0/storage-pools?recursion=1``: which pools are remote (their drivers);
* per online member, a few at a time: ``/1.0/resources?target=M`` (CPU threads, memory total
  and in use), ``/1.0/cluster/members/M/state`` (the load average; a server that answers 501 or
  404, as LXD 5.0 does, is not asked again) and each local pool's size there;
* ``GET /1.0/instances?recursion=2`` in the project, or every project (``all-projects=true``):
  config, devices, location, status and state (CPU counter, memory in use);
* the projects' config (groups a restricted project may use) and the running operations (an
  instance an operation works on is locked; one opendrs migrates counts on both members).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opendrs.backends.base import Abandoned, BackendError, check_observation
from opendrs.backends.incus.assemble import (
    ONLINE_STATUSES,
    REMOTE_DRIVERS,
    VM_DEFAULT_CPU,
    VM_DEFAULT_MEMORY,
    CpuSample,
    MemberRead,
    build_guest,
    build_node,
    cpu_rate,
    guest_id,
)
from opendrs.backends.incus.client import Client, HttpError
from opendrs.backends.incus.config import IncusConfig
from opendrs.backends.incus.movement import (
    live_refusal,
    member_hold,
    project_hold,
    records_boot_state,
)
from opendrs.backends.incus.rules import Restrictions, read_rules
from opendrs.backends.incus.scriptlet import KEY as SCRIPTLET_KEY
from opendrs.backends.incus.scriptlet import (
    Observed,
    Scriptlet,
    instance_resources,
    request,
    score,
)
from opendrs.backends.incus.values import (
    as_int,
    as_number,
    cpu_limit,
    memory_limit,
    object_of,
    objects_of,
)
from opendrs.backends.proxmox.client import gather
from opendrs.model.cluster import Cluster, Guest, Node, Settings

log = logging.getLogger(__name__)

#: Instance keys that record a move's time (Unix seconds): Incus's, and opendrs's where Incus's
#: cannot be written (LXD).
LAST_MOVE_KEYS: Final = ("volatile.rebalance.last_move", "user.opendrs.last_move")
_UNSUPPORTED: Final = frozenset({404, 501})


#: Where each value of a node or guest comes from, for :func:`check_observation`'s message.
FIELDS: Final = {
    "guest.id": "project and name of /1.0/instances",
    "guest.name": "name of /1.0/instances",
    "guest.node": "location of /1.0/instances",
    "guest.cpu": "limits.cpu of the instance's expanded_config",
    "guest.memory": "limits.memory of the instance's expanded_config (state.memory.usage without)",
    "guest.disks": "the sizes of the instance's local disk devices",
    "guest.usage.cpu": "state.cpu.usage of /1.0/instances, over the time between observations",
    "guest.usage.memory": "state.memory.usage of /1.0/instances",
    "guest.uptime": "the instance's last_used_at",
    "guest.priority": "user.opendrs.priority",
    "guest.migrating_to": "the target of its migration",
    "node.name": "server_name of /1.0/cluster/members",
    "node.cpu": "cpu.total of the member's /1.0/resources",
    "node.memory": "memory.total of the member's /1.0/resources",
    "node.usage.cpu": "the member's load average, less its instances'",
    "node.usage.memory": "memory.used of the member's /1.0/resources, less its instances'",
    "node.storage": "space.total of the member's /1.0/storage-pools/{pool}/resources",
    "node.arch": "cpu.architecture of the member's /1.0/resources",
}


@dataclass(frozen=True, slots=True)
class KnownInstance:
    """What the last observation knew about an instance (to move it)."""

    project: str
    name: str
    vm: bool
    location: str
    running: bool


class Observer:
    """Observes a cluster through ``client``; remembers what the next observation (the CPU
    rates) and the migrations need from the last one."""

    def __init__(
        self,
        client: Client,
        config: IncusConfig,
        settings: Settings,
        cluster_name: str | None = None,
    ) -> None:
        self._client = client
        self._config = config
        self._settings = settings
        self._cluster_name = cluster_name or "incus"
        self._samples: dict[str, CpuSample] = {}
        self._capacity: dict[str, tuple[float, int]] = {}
        self._member_state = True
        self._clustered = True
        self._local_pools: list[str] = []
        self._warned: set[str] = set()
        #: What the last observation knew: instances by guest id, the server's config, the
        #: member that answered, the database leader, each guest's last recorded move.
        self.known: dict[str, KnownInstance] = {}
        self.server_config: dict[str, str] = {}
        self.local: str | None = None
        self.leader: str | None = None
        #: Whether the server checks a running VM's boot state before a live move.
        self.boot_state_checked = False
        self._scriptlet: Scriptlet | None = None
        self.last_moves: dict[str, float] = {}
        #: Targets of the migrations opendrs started, by guest id (set by the migrator).
        self.targets: dict[str, str] = {}

    def observe(self) -> Cluster:
        try:
            return self._observe()
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"cannot read the cluster: {type(exc).__name__}: {exc}") from None

    def _observe(self) -> Cluster:
        server = object_of(self._client.get("/1.0"), "/1.0")
        config = server.get("config")
        self.server_config = {str(k): str(v) for k, v in (config or {}).items()}
        environment = server.get("environment")
        environment = environment if isinstance(environment, dict) else {}
        self.local = str(environment.get("server_name") or "")
        self.boot_state_checked = records_boot_state(environment)
        members = self._members()
        self.leader = next(
            (str(m["server_name"]) for m in members if "database-leader" in (m.get("roles") or ())),
            None,
        )
        remote = self._remote_pools()
        online = [str(m["server_name"]) for m in members if m.get("status") in ONLINE_STATUSES]
        reads = dict(
            zip(online, gather([lambda n=n: self._read_member(n) for n in online]), strict=True)
        )
        for member in members:
            name = str(member["server_name"])
            read = reads.setdefault(name, MemberRead(reachable=False))
            if read.threads and read.memory:
                self._capacity[name] = (read.threads, read.memory)
            else:
                read.threads, read.memory = self._capacity.get(name, (0.0, 0))
        instances = self._instances()
        locked = self._busy_instances()
        projects = self._projects()
        holds = self._holds(instances, members, projects, locked)
        threads = {name: read.threads for name, read in reads.items()}
        rules = read_rules(
            instances, members, threads, projects, self._config.user_keys, self._warn_once
        )
        self._placement(instances, members, reads, projects, rules, holds)
        guests = self._guests(instances, reads, remote, holds, locked)
        nodes = self._nodes(members, reads, guests)
        cluster = Cluster(
            tuple(nodes), tuple(guests), rules.rules(), self._settings, self._cluster_name
        )
        return check_observation(cluster, FIELDS)

    # -- members -------------------------------------------------------------------------------

    def _members(self) -> list[dict[str, Any]]:
        try:
            members = objects_of(
                self._client.get("/1.0/cluster/members", recursion=1), "/1.0/cluster/members"
            )
            self._clustered = True
            return members
        except HttpError as exc:
            if "not clustered" not in exc.message.lower():
                raise
        self._clustered = False
        self._warn_once("the server is not clustered: it is observed as a cluster of one member")
        return [
            {"server_name": self.local or "local", "status": "Online", "roles": ["database-leader"]}
        ]

    def _read_member(self, name: str) -> MemberRead:
        # A server that is not clustered takes no target, and has no member state.
        target = {"target": name} if self._clustered else {}
        try:
            resources = object_of(self._client.get("/1.0/resources", **target), "/1.0/resources")
        except HttpError as exc:
            if exc.status not in (500, 503) and exc.status not in _UNSUPPORTED:
                raise
            self._warn_once(f"member {name} is unreachable: {exc.message}")
            return MemberRead(reachable=False)
        except BackendError as exc:
            # No answer in time: the server is waiting for the member (LXD 5.0 answers for a
            # member whose daemon stopped only after about 10 s). The server itself answered the
            # reads before this one.
            if not exc.transient or isinstance(exc, Abandoned):
                raise
            self._warn_once(f"member {name} is unreachable: {exc.reason}")
            return MemberRead(reachable=False)
        cpu = resources.get("cpu") if isinstance(resources.get("cpu"), dict) else {}
        memory = resources.get("memory") if isinstance(resources.get("memory"), dict) else {}
        arch = cpu.get("architecture")
        used = as_number(memory.get("used"))
        state = self._state(name)
        sysinfo = state.get("sysinfo") if state else None
        loads = sysinfo.get("load_averages") if isinstance(sysinfo, dict) else None
        return MemberRead(
            threads=float(as_number(cpu.get("total")) or 0.0),
            memory=as_int(memory.get("total")),
            arch=arch if isinstance(arch, str) and arch else None,
            used_memory=int(used) if used is not None else None,
            load=as_number(loads[0]) if isinstance(loads, list) and loads else None,
            storage=self._storage(name),
            resources=resources,
            state=state or {},
        )

    def _state(self, name: str) -> dict[str, Any] | None:
        """The member's state (its load averages), where the server has one."""
        if not self._member_state or not self._clustered:
            return None
        try:
            state = object_of(
                self._client.get(f"/1.0/cluster/members/{name}/state"), "member state"
            )
        except HttpError as exc:
            if exc.status not in _UNSUPPORTED:
                raise
            self._member_state = False
            log.info(
                "the server has no member state (HTTP %d): host load is not measured", exc.status
            )
            return None
        return state

    def _remote_pools(self) -> frozenset[str]:
        try:
            pools = objects_of(
                self._client.get("/1.0/storage-pools", recursion=1), "/1.0/storage-pools"
            )
        except HttpError as exc:
            if exc.transient:
                raise
            self._warn_once(
                f"cannot list the storage pools ({exc.message}): every disk counts as local"
            )
            pools = []
        self._local_pools = sorted(
            str(p["name"]) for p in pools if p.get("name") and p.get("driver") not in REMOTE_DRIVERS
        )
        return frozenset(str(p["name"]) for p in pools if p.get("driver") in REMOTE_DRIVERS)

    def _storage(self, member: str) -> dict[str, int]:
        """Each local pool's size on ``member``."""
        sizes: dict[str, int] = {}
        target = {"target": member} if self._clustered else {}
        for pool in self._local_pools:
            try:
                space = object_of(
                    self._client.get(f"/1.0/storage-pools/{pool}/resources", **target),
                    "pool resources",
                ).get("space")
            except HttpError as exc:
                if exc.transient:
                    raise
                continue
            if isinstance(space, dict) and as_int(space.get("total")) > 0:
                sizes[pool] = as_int(space.get("total"))
        return sizes

    def _nodes(
        self,
        members: Sequence[Mapping[str, Any]],
        reads: Mapping[str, MemberRead],
        guests: Sequence[Guest],
    ) -> list[Node]:
        cpu: dict[str, float] = {}
        memory: dict[str, int] = {}
        for guest in guests:
            if guest.state != "stopped":
                cpu[guest.node] = cpu.get(guest.node, 0.0) + (guest.cpu_used or 0.0)
                memory[guest.node] = memory.get(guest.node, 0) + (guest.memory_used or 0)
        rows = sorted(members, key=lambda m: str(m["server_name"]))
        return [
            build_node(
                m,
                reads[str(m["server_name"])],
                cpu.get(str(m["server_name"]), 0.0),
                memory.get(str(m["server_name"]), 0),
            )
            for m in rows
        ]

    # -- instances -----------------------------------------------------------------------------

    def _scope(self) -> dict[str, Any]:
        if self._config.all_projects:
            return {"all-projects": True}
        return {"project": self._config.project}

    def _instances(self) -> list[dict[str, Any]]:
        rows = objects_of(
            self._client.get("/1.0/instances", recursion=2, **self._scope()), "/1.0/instances"
        )
        return [r for r in rows if isinstance(r.get("name"), str) and r.get("location")]

    def _busy_instances(self) -> set[str]:
        """The guests a running operation works on."""
        try:
            operations = object_of(
                self._client.get("/1.0/operations", recursion=1, **self._scope()), "/1.0/operations"
            )
        except HttpError as exc:
            if exc.transient:
                raise
            return set()
        busy: set[str] = set()
        for operation in objects_of(operations.get("running") or [], "running operations"):
            resources = operation.get("resources")
            urls = resources.get("instances") if isinstance(resources, dict) else None
            for url in urls or ():
                busy.add(_instance_of_url(str(url)))
        return busy

    def _holds(
        self,
        rows: Sequence[Mapping[str, Any]],
        members: Sequence[Mapping[str, Any]],
        projects: Mapping[str, Mapping[str, Any]],
        busy: set[str],
    ) -> dict[str, str]:
        """Guest id → why Incus keeps it where it is: an operation works on it, its member is
        being evacuated or restored, its project blocks choosing a member."""
        status = {str(m["server_name"]): str(m.get("status") or "") for m in members}
        holds: dict[str, str] = {}
        for row in rows:
            project = str(row.get("project") or "default")
            gid = guest_id(project, str(row["name"]))
            location = str(row["location"])
            why = (
                ("operation" if gid in busy else None)
                or member_hold(location, status.get(location, ""))
                or project_hold(project, projects.get(project, {}))
            )
            if why is not None:
                holds[gid] = why
        return holds

    def _placement(
        self,
        rows: Sequence[Mapping[str, Any]],
        members: Sequence[Mapping[str, Any]],
        reads: Mapping[str, MemberRead],
        projects: Mapping[str, Mapping[str, Any]],
        rules: Restrictions,
        holds: dict[str, str],
    ) -> None:
        """The placement scriptlet's verdict on each instance opendrs may move (see
        :mod:`~.scriptlet`): the member it chose becomes a rule, a failure holds the instance."""
        source = self.server_config.get(SCRIPTLET_KEY, "")
        if not self._config.placement_scriptlet or not source.strip():
            self._scriptlet = None
            return
        if self._scriptlet is None or self._scriptlet.source != source:
            self._scriptlet = Scriptlet(source, self._config.scriptlet_timeout)
        scriptlet = self._scriptlet
        online = {
            str(m["server_name"]): m
            for m in members
            if m.get("status") == "Online" and reads[str(m["server_name"])].reachable
        }
        scores = {
            name: score(read.used_memory or 0, read.memory, read.load or 0.0, read.threads)
            for name, read in reads.items()
        }
        scriptlet.observe(
            Observed(
                members,
                {n: r.resources for n, r in reads.items() if r.resources},
                {n: r.state for n, r in reads.items() if r.state},
                [_listed(r) for r in rows],
                {name: {"name": name, "config": dict(c)} for name, c in projects.items()},
            )
        )
        cut_off: str | None = None
        for row in rows:
            gid = guest_id(str(row.get("project") or "default"), str(row["name"]))
            location = str(row["location"])
            if not self._may_move(row, gid, location in online, rules, holds):
                continue
            names = sorted(
                (rules.allowed(gid) & online.keys()) - {location},
                key=lambda n: (scores[n], n),
            )
            if not names:
                continue
            if cut_off is not None:
                holds[gid] = f"{SCRIPTLET_KEY} was not run: {cut_off}"
                continue
            config = row.get("expanded_config") or {}
            vcpus, _ = cpu_limit(config.get("limits.cpu"))
            memory = memory_limit(config.get("limits.memory"), reads[location].memory)
            vm = row.get("type") == "virtual-machine"
            verdict = scriptlet.run(
                request(row),
                names,
                instance_resources(
                    vcpus or (VM_DEFAULT_CPU if vm else 0.0),
                    memory or (VM_DEFAULT_MEMORY if vm else 0),
                    row,
                ),
            )
            if verdict.error is not None:
                holds[gid] = f"{SCRIPTLET_KEY} failed: {verdict.error}"
                self._warn_once(f"instance {gid}: {holds[gid]}: it stays on {location}")
                if verdict.timed_out:
                    cut_off = f"a run on {gid} ran longer than scriptlet_timeout"
            elif verdict.chose is not None:
                rules.add(gid, f"{SCRIPTLET_KEY} chose {verdict.chose}", {verdict.chose, location})

    def _may_move(
        self,
        row: Mapping[str, Any],
        gid: str,
        usable: bool,
        rules: Restrictions,
        holds: Mapping[str, str],
    ) -> bool:
        """Whether opendrs may move the instance ``row`` at all (so the scriptlet is asked)."""
        if not usable or gid in holds or gid in rules.ignored or row.get("status") != "Running":
            return False
        if row.get("type") != "virtual-machine":
            return self._settings.allow_restart_migration
        config = row.get("expanded_config") or {}
        return self._settings.allow_restart_migration or (
            live_refusal(config, boot_state_checked=self.boot_state_checked) is None
        )

    def _guests(
        self,
        rows: Sequence[Mapping[str, Any]],
        reads: Mapping[str, MemberRead],
        remote: frozenset[str],
        holds: Mapping[str, str],
        busy: set[str],
    ) -> list[Guest]:
        now = time.monotonic()
        samples: dict[str, CpuSample] = {}
        known: dict[str, KnownInstance] = {}
        last_moves: dict[str, float] = {}
        guests: list[Guest] = []
        for row in sorted(rows, key=lambda r: (str(r.get("project") or "default"), r["name"])):
            project = str(row.get("project") or "default")
            gid = guest_id(project, str(row["name"]))
            # A server that is not clustered is the one member: its instances are there,
            # whatever their location says ("none").
            location = str(row["location"]) if self._clustered else self.local or "local"
            rate = cpu_rate(row, self._samples.get(gid), now)
            usage = (
                row.get("state", {}).get("cpu", {}).get("usage")
                if isinstance(row.get("state"), dict)
                else None
            )
            if usage is not None:
                samples[gid] = CpuSample(as_int(usage), now)
            target = self.targets.get(gid)
            migrating = target if gid in busy and target not in (None, location) else None
            lock = holds.get(gid) if migrating is None else None
            member = reads.get(location)
            guests.append(
                build_guest(
                    {**row, "location": location},
                    member.memory if member else 0,
                    remote,
                    rate,
                    migrating,
                    lock,
                    restart_moves=self._settings.allow_restart_migration,
                    boot_state_checked=self.boot_state_checked,
                )
            )
            known[gid] = KnownInstance(
                project,
                str(row["name"]),
                row.get("type") == "virtual-machine",
                location,
                row.get("status") == "Running",
            )
            moved = _last_move(row)
            if moved is not None:
                last_moves[gid] = moved
        self._samples, self.known, self.last_moves = samples, known, last_moves
        return guests

    def _projects(self) -> dict[str, dict[str, Any]]:
        """Each project's config (for the groups a restricted project may use)."""
        try:
            if self._config.all_projects:
                rows = objects_of(self._client.get("/1.0/projects", recursion=1), "/1.0/projects")
            else:
                rows = [
                    object_of(self._client.get(f"/1.0/projects/{self._config.project}"), "project")
                ]
        except HttpError as exc:
            if exc.transient:
                raise
            self._warn_once(
                f"cannot read the projects ({exc.message}): their group restrictions are not known"
            )
            return {}
        return {
            str(r["name"]): r.get("config") if isinstance(r.get("config"), dict) else {}
            for r in rows
            if r.get("name")
        }

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)


def _listed(row: Mapping[str, Any]) -> dict[str, Any]:
    """An instance as ``get_instances`` lists it (Incus's ``api.Instance``: no state)."""
    return {k: v for k, v in row.items() if k != "state"}


def _instance_of_url(url: str) -> str:
    """The guest id of ``/1.0/instances/NAME?project=P``."""
    path, _, query = url.partition("?")
    name = path.rstrip("/").rsplit("/", 1)[-1]
    project = "default"
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "project" and value:
            project = value
    return guest_id(project, name)


def _last_move(row: Mapping[str, Any]) -> float | None:
    """The latest move an instance's keys record (Unix seconds), if any."""
    config = row.get("expanded_config") if isinstance(row.get("expanded_config"), dict) else {}
    times = [as_number(config.get(key)) for key in LAST_MOVE_KEYS]
    found = [t for t in times if t is not None and t > 0]
    return max(found) if found else None


__all__ = ["LAST_MOVE_KEYS", "KnownInstance", "Observer"]
