"""Migrations: start one, follow its task, find one whose answer was lost, stop one.

A VM moves by live migration (``online=1``, ``with-local-disks=1`` when it has local disks and the
settings allow it); a container only by restart migration, and only when
``settings.allow_restart_migration``; HA-managed guests through the HA stack
(``/cluster/ha/resources/{sid}/migrate``, ``relocate`` for containers), so the HA manager does not
fight the move. The reads before the request (the guest's status and config, Proxmox's own
precheck) end early once the start's :class:`~opendrs.backends.base.StartGate` closes (a reload),
and the gate is asked once more right before the request. The handle's id is the task's UPID
(which names the node to poll it on); for a request to the HA stack it is
``ha:<sid>:<source>:<target>:<since>`` until :meth:`Migrator.poll`
finds the task the HA manager started. :meth:`Migrator.cancel` stops the migration's task
(``DELETE /nodes/{node}/tasks/{upid}``); a request to the HA stack can be stopped only once its
task is known. HA node maintenance has no API call: :meth:`Migrator.set_maintenance` says so.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from opendrs.backends.base import (
    DONE,
    RUNNING,
    BackendError,
    Handle,
    InFlightAges,
    Progress,
    StartGate,
    failed,
)
from opendrs.backends.proxmox.assemble import KnownGuest
from opendrs.backends.proxmox.client import Client, HttpError
from opendrs.backends.proxmox.guest_config import GuestConfig, parse_guest_config
from opendrs.backends.proxmox.ha import listed_service, service_id
from opendrs.backends.proxmox.motions import Motion, ha_motions
from opendrs.backends.proxmox.observe import Observer
from opendrs.backends.proxmox.values import as_bool, as_dict, as_int, as_list, as_number, clip
from opendrs.model.cluster import Move, Settings
from opendrs.model.units import format_bytes

log = logging.getLogger(__name__)

#: Task ids remembered to tell new HA tasks from old ones.
_REMEMBERED: Final = 4096
#: A request to the HA stack with no task and no HA state change after this long has failed
#: (seconds on the monotonic clock, from the request or, after a restart, from when this process
#: first asks about it).
_HA_START_GRACE: Final = 300.0
#: Clock difference tolerated between opendrs and the cluster when finding an HA task, seconds.
_CLOCK_SLACK: Final = 10


@dataclass(frozen=True, slots=True)
class _Upid:
    text: str
    node: str
    type: str
    id: str
    starttime: int


def _parse_upid(text: str) -> _Upid | None:
    """``UPID:node:pid:pstart:starttime:type:id:user:`` (pid, pstart, starttime in hex)."""
    parts = text.split(":")
    if len(parts) < 8 or parts[0] != "UPID" or not parts[1]:
        return None
    try:
        starttime = int(parts[4], 16)
    except ValueError:
        return None
    return _Upid(text, parts[1], parts[5], parts[6], starttime)


class Migrator:
    """Starts, follows and stops migrations through ``client``; where a guest is and which
    storages are shared come from ``observer``'s last observation. The HA manager's grace to
    start a requested move is measured on ``monotonic``."""

    def __init__(
        self,
        client: Client,
        settings: Settings,
        observer: Observer,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._settings = settings
        self._observer = observer
        #: The task found for a handle, by handle id.
        self._resolved: dict[str, str] = {}
        #: The tasks followed already (an HA task found is not another handle's).
        self._followed: dict[str, None] = {}
        #: How long each request to the HA stack has waited for its task, by handle id.
        self._ha_waits = InFlightAges(monotonic, _REMEMBERED)

    # -- start ---------------------------------------------------------------------------------

    def start(self, move: Move, gate: StartGate) -> Handle:
        """Start ``move`` once what it needs is read and ``gate`` still lets it."""
        with self._client.only_backend_errors(f"cannot migrate {move.guest}"):
            return self._start(move, gate)

    def _start(self, move: Move, gate: StartGate) -> Handle:
        vmid, source, target = move.guest, move.source, move.target
        label = f"guest {vmid}"
        if source == target:
            raise BackendError(f"{label} is already on {target}", transient=False)
        if not vmid.isdigit():
            raise BackendError(f"{label}: not a Proxmox guest id", transient=False)
        known = self._locate(vmid)
        base = f"nodes/{source}/{known.kind}/{vmid}"
        status, config = self._read_guest(base, label, source, known.kind)
        running = status.get("status") == "running"
        self._refuse_unmovable(label, known.kind, status, config, running)
        ha_status = status.get("ha")
        managed = isinstance(ha_status, dict) and as_bool(ha_status.get("managed"))
        if known.ha is not None and known.ha.request == "ignored":
            managed = False
        if known.kind == "qemu":
            self._precheck(base, label, target)
        else:
            self._lxc_precheck(base, label, target)
        if managed:
            return self._start_ha(move, known, gate)
        local_disks = any(d.local for d in config.disks)
        params = _migrate_params(known.kind, target, running, local_disks)
        gate.enter(f"POST /{base}/migrate")
        upid = self._client.post(f"{base}/migrate", **params)
        if not isinstance(upid, str) or _parse_upid(upid) is None:
            raise BackendError(f"{label}: the API answered the migration with no task")
        log.info("migrating %s from %s to %s: task %s", label, source, target, upid)
        self._remember(upid)
        return Handle(upid, move, time.time())

    def _locate(self, vmid: str) -> KnownGuest:
        """Where a guest is and what it is: from the last observation, else the API."""
        known = self._observer.known.get(vmid)
        if known is not None:
            return known
        rows = as_list(self._client.get("cluster/resources", type="vm"), "/cluster/resources")
        for row in rows:
            if str(row.get("vmid")) == vmid and row.get("type") in ("qemu", "lxc"):
                kind: Literal["qemu", "lxc"] = "qemu" if row["type"] == "qemu" else "lxc"
                ha = None
                if row.get("hastate"):
                    ha = listed_service(kind, vmid, row["hastate"], None)
                return KnownGuest(kind, str(row.get("node")), ha)
        raise BackendError(f"guest {vmid} does not exist", transient=False)

    def _read_guest(
        self, base: str, label: str, source: str, kind: Literal["qemu", "lxc"]
    ) -> tuple[dict[str, Any], GuestConfig]:
        """A guest's current status and its config, read now."""
        try:
            status = as_dict(self._client.get(f"{base}/status/current"), f"/{base}/status/current")
            raw = as_dict(self._client.get(f"{base}/config"), f"/{base}/config")
        except HttpError as exc:
            if "does not exist" in exc.message:
                raise BackendError(
                    f"{label} is not on {source} (any more)", transient=False
                ) from None
            raise
        maxcpu = as_number(status.get("cpus")) or 1.0
        config = parse_guest_config(
            kind,
            raw,
            maxcpu,
            self._observer.shared(),
            running=status.get("status") == "running",
            live_pci=self._observer.live_pci(),
        )
        return status, config

    def _refuse_unmovable(
        self,
        label: str,
        kind: Literal["qemu", "lxc"],
        status: dict[str, Any],
        config: GuestConfig,
        running: bool,
    ) -> None:
        """Raise when the guest cannot move now (locked), or at all with these settings."""
        lock = status.get("lock") if isinstance(status.get("lock"), str) else config.lock
        if lock:
            raise BackendError(f"{label} is locked ({lock})", transient=True)
        if config.devices:
            raise BackendError(
                f"{label} uses local devices ({', '.join(config.devices)}): it cannot move",
                transient=False,
            )
        local = sum(d.size for d in config.disks if d.local)
        if any(d.local for d in config.disks) and not self._settings.allow_local_disks:
            raise BackendError(
                f"{label} has disks on local storage ({format_bytes(local)}) and "
                "settings.allow_local_disks is off",
                transient=False,
            )
        if kind == "lxc" and running and not self._settings.allow_restart_migration:
            raise BackendError(
                f"{label} is a running container: it can only move by a restart migration, "
                "which settings.allow_restart_migration does not allow",
                transient=False,
            )

    def _precondition(self, base: str, label: str, target: str) -> dict[str, Any] | None:
        """``GET {base}/migrate?target=``: Proxmox's own check of a migration to ``target``;
        ``None`` when the API has none for the guest."""
        try:
            return as_dict(self._client.get(f"{base}/migrate", target=target), f"/{base}/migrate")
        except HttpError as exc:
            if exc.transient or exc.status in (401, 403):
                raise
            log.debug("%s: no migration precondition: %s", label, exc)
            return None

    def _precheck(self, base: str, label: str, target: str) -> None:
        """Proxmox's own check of a VM migration to ``target`` (storages, HA resources)."""
        check = self._precondition(base, label, target)
        if check is None:
            return
        _refuse_not_allowed(label, target, check.get("not_allowed_nodes"))
        resources = check.get("local_resources")
        if isinstance(resources, list) and resources:
            raise BackendError(
                f"{label} uses local resources ({', '.join(map(str, resources))}): it cannot move",
                transient=False,
            )

    def _lxc_precheck(self, base: str, label: str, target: str) -> None:
        """The containers' own migration precondition (``GET /nodes/{n}/lxc/{id}/migrate``,
        pve-container ``src/PVE/API2/LXC.pm`` 1479-1617): nodes that HA resources block, in
        dash-style keys. An API without it (before Proxmox VE 9) leaves the check out."""
        check = self._precondition(base, label, target)
        if check is not None:
            _refuse_not_allowed(label, target, check.get("not-allowed-nodes"))

    def ha_motions(self) -> tuple[Motion, ...]:
        """The moves the HA manager has queued or under way now, read from its status just
        before a migration starts (see :mod:`~opendrs.backends.proxmox.motions`)."""
        with self._client.only_backend_errors("cannot read the HA manager's status"):
            status = as_dict(
                self._client.get("cluster/ha/status/manager_status"),
                "/cluster/ha/status/manager_status",
            )
            return ha_motions(status)

    def _start_ha(self, move: Move, known: KnownGuest, gate: StartGate) -> Handle:
        vmid, target = move.guest, move.target
        sid = service_id(known.kind, vmid)
        action = "migrate" if known.kind == "qemu" else "relocate"
        path = f"cluster/ha/resources/{sid}/{action}"
        gate.enter(f"POST /{path}")
        since = int(time.time())
        answer = self._client.post(path, node=target)
        if isinstance(answer, dict):
            blocking = answer.get("blocking-resources")
            if isinstance(blocking, list) and blocking:
                names = [
                    f"{b.get('sid')} ({b.get('cause')})" if isinstance(b, dict) else str(b)
                    for b in blocking
                ]
                raise BackendError(
                    f"the HA manager will not {action} {sid} to {target}: blocked by "
                    f"{', '.join(names)}",
                    transient=False,
                )
            comigrated = answer.get("comigrated-resources")
            if isinstance(comigrated, list) and comigrated:
                log.warning(
                    "the HA manager moves %s along with %s (positive affinity)",
                    ", ".join(map(str, comigrated)),
                    sid,
                )
        log.info("asked the HA manager to %s %s from %s to %s", action, sid, move.source, target)
        handle_id = f"ha:{sid}:{move.source}:{target}:{since}"
        self._ha_waits.start(handle_id)
        return Handle(handle_id, move, time.time())

    # -- follow --------------------------------------------------------------------------------

    def poll(self, handle: Handle) -> Progress:
        with self._client.only_backend_errors(f"cannot follow {handle.id}"):
            if handle.id.startswith("ha:"):
                return self._poll_ha(handle.id, handle.id)
            return self._poll_task(self._resolved.get(handle.id, handle.id), handle)

    def _poll_task(self, upid: str, handle: Handle | None) -> Progress:
        task = _parse_upid(upid)
        if task is None:
            raise BackendError(f"not a Proxmox task id: {upid!r}", transient=False)
        path = f"nodes/{task.node}/tasks/{upid}"
        try:
            status = as_dict(
                self._client.get(f"{path}/status"), f"/nodes/{task.node}/tasks/…/status"
            )
        except HttpError as exc:
            lowered = exc.message.lower()
            if "no such task" in lowered or "unable to parse worker upid" in lowered:
                return failed(f"task {task.type} on {task.node} is gone: {exc.message}")
            raise
        if status.get("status") == "running":
            return RUNNING
        exitstatus = str(status.get("exitstatus") or "unknown").strip()
        if task.type == "hamigrate" and handle is not None and upid == handle.id:
            # A plain migration request for a guest that the HA stack manages: the HA manager
            # starts the real migration later, as for a request to the HA stack.
            if exitstatus != "OK":
                return failed(f"the HA manager refused the migration: {exitstatus}")
            known = self._observer.known.get(task.id)
            kind = "ct" if known is not None and known.kind == "lxc" else "vm"
            ha_id = f"ha:{kind}:{task.id}:{task.node}:{handle.move.target}:{task.starttime}"
            return self._poll_ha(ha_id, handle.id)
        if exitstatus == "OK" or exitstatus.startswith("WARNINGS"):
            return DONE
        return failed(
            f"{task.type} task on {task.node} failed: {self._task_error(path, exitstatus)}"
        )

    def _task_error(self, path: str, exitstatus: str) -> str:
        """The task's exit status, with the first error line of its log when it says more."""
        try:
            lines = as_list(self._client.get(f"{path}/log", start=0, limit=100000), "task log")
        except BackendError:
            return clip(exitstatus)
        texts = [str(line.get("t", "")).strip() for line in lines]
        errors = [t for t in texts if "error" in t.lower() and not t.startswith("TASK ERROR:")]
        if not errors:
            return clip(exitstatus)
        detail = re.sub(r"^(\S+ \S+ )?ERROR:\s*", "", errors[0])
        return clip(detail if exitstatus in detail else f"{exitstatus} ({detail})")

    def _poll_ha(self, handle_id: str, key: str) -> Progress:
        """A migration asked of the HA stack: the task it started, else the HA manager's view.

        ``key`` is the handle's id, under which the task found is remembered.
        """
        upid = self._resolved.get(key)
        if upid is not None:
            return self._poll_task(upid, None)
        parts = handle_id.split(":")
        if len(parts) != 6 or not parts[2].isdigit():
            raise BackendError(f"not an opendrs HA handle: {handle_id!r}", transient=False)
        _, kind, vmid, source, target, since_text = parts
        sid = f"{kind}:{vmid}"
        since = as_int(since_text)
        task = self._migration_task(source, vmid, "qemu" if kind == "vm" else "lxc", since)
        if task is not None:
            upid = task[0]
            self._remember(key, upid)
            self._ha_waits.forget(key)
            log.info("%s: the HA manager's migration task is %s", sid, upid)
            return self._poll_task(upid, None)
        progress = self._ha_progress(sid, target, key)
        if progress.finished:
            self._ha_waits.forget(key)
        return progress

    def _ha_progress(self, sid: str, target: str, key: str) -> Progress:
        """A request to the HA stack with no task yet (handle id ``key``), as the HA manager's
        status tells it. The HA manager is given :data:`_HA_START_GRACE` on the monotonic clock
        to act on it: the request's wall-clock time in the handle's id only finds its task (it
        survives a restart, but a step of the wall clock moves it), so after a restart the grace
        counts from when this process first asks."""
        status = as_dict(
            self._client.get("cluster/ha/status/manager_status"),
            "/cluster/ha/status/manager_status",
        )
        manager = status.get("manager_status")
        services = manager.get("service_status") if isinstance(manager, dict) else None
        service = services.get(sid) if isinstance(services, dict) else None
        if not isinstance(service, dict):
            return failed(f"{sid} is not HA-managed any more")
        state = service.get("state")
        if state in ("migrate", "relocate"):
            return RUNNING
        if state == "error":
            return failed(f"the HA manager put {sid} in the error state")
        if target and service.get("node") == target:
            return DONE
        if self._ha_waits.age(key) > _HA_START_GRACE:
            return failed(
                f"the HA manager did not start moving {sid} to {target or 'its target'} "
                f"within {_HA_START_GRACE:g}s (see 'ha-manager status')"
            )
        return RUNNING

    def _migration_task(
        self, source: str, vmid: str, kind: Literal["qemu", "lxc"], since: float
    ) -> tuple[str, int] | None:
        """The first migration task of ``vmid`` on ``source`` started at ``since`` or later (with
        some clock slack) that nothing follows yet: its UPID and start time."""
        task_type = "qmigrate" if kind == "qemu" else "vzmigrate"
        tasks = as_list(
            self._client.get(
                f"nodes/{source}/tasks",
                vmid=vmid,
                typefilter=task_type,
                source="all",
                since=max(0, int(since) - _CLOCK_SLACK),
                limit=50,
            ),
            f"/nodes/{source}/tasks",
        )
        found = sorted(
            (
                (t["upid"], as_int(t.get("starttime")))
                for t in tasks
                if t.get("type") == task_type
                and str(t.get("id")) == vmid
                and isinstance(t.get("upid"), str)
                and as_int(t.get("starttime")) >= int(since) - _CLOCK_SLACK
                and t["upid"] not in self._followed
            ),
            key=lambda found: found[1],
        )
        return found[0] if found else None

    def _remember(self, key: str, upid: str | None = None) -> None:
        """Note a task as followed (and, with ``key``, as the task of that handle)."""
        self._followed[upid or key] = None
        if upid is not None:
            self._resolved[key] = upid
        for table in (self._followed, self._resolved):
            while len(table) > _REMEMBERED:
                del table[next(iter(table))]

    # -- find, stop ----------------------------------------------------------------------------

    def find(self, move: Move, since: float) -> Handle | None:
        """The migration task of ``move`` on its source node started at ``since`` or later (a
        request whose answer was lost; for an HA-managed guest, the HA manager's task)."""
        with self._client.only_backend_errors(f"cannot look for the migration of {move.guest}"):
            if not move.guest.isdigit():
                return None
            known = self._locate(move.guest)
            task = self._migration_task(move.source, move.guest, known.kind, since)
            if task is None:
                return None
            upid, started = task
            self._remember(upid)
            log.info("the migration of guest %s to %s is task %s", move.guest, move.target, upid)
            return Handle(upid, move, float(started))

    def cancel(self, handle: Handle) -> bool:
        """Stop the migration's task (``DELETE /nodes/{node}/tasks/{upid}``).

        False when there is no task to stop: a request to the HA stack whose task the HA manager
        has not started yet (the HA stack has no way to take a request back), or a task the node
        does not know. The owner of a task may stop it; the HA manager's tasks belong to
        ``root@pam``, and stopping them takes ``Sys.Modify`` on the node.
        """
        with self._client.only_backend_errors(f"cannot stop {handle.id}"):
            return self._cancel(handle)

    def _cancel(self, handle: Handle) -> bool:
        upid = self._resolved.get(handle.id)
        if upid is None:
            own = None if handle.id.startswith("ha:") else _parse_upid(handle.id)
            if own is not None and own.type != "hamigrate":
                upid = handle.id
            else:
                # A request to the HA stack: its migration task, if the HA manager started it.
                self.poll(handle)
                upid = self._resolved.get(handle.id)
                if upid is None:
                    log.info("%s: no task to stop yet (the HA stack cannot cancel)", handle.id)
                    return False
        task = _parse_upid(upid)
        if task is None:
            raise BackendError(f"not a Proxmox task id: {upid!r}", transient=False)
        try:
            self._client.delete(f"nodes/{task.node}/tasks/{upid}")
        except HttpError as exc:
            lowered = exc.message.lower()
            if "no such task" in lowered or "unable to parse worker upid" in lowered:
                log.info("task %s on %s is unknown there: nothing to stop", task.type, task.node)
                return False
            raise
        move = handle.move
        log.info(
            "asked %s to stop the %s task of guest %s (%s to %s): %s",
            task.node,
            task.type,
            move.guest,
            move.source,
            move.target,
            upid,
        )
        return True

    def set_maintenance(self, node: str, enabled: bool) -> None:
        # Proxmox VE (up to 9.0) has no API call for HA node maintenance: only the CLI does it.
        action = "enable" if enabled else "disable"
        raise BackendError(
            "not supported: the Proxmox VE API has no call for HA node maintenance; run "
            f"'ha-manager crm-command node-maintenance {action} {node}' on a cluster node",
            transient=False,
        )


def _refuse_not_allowed(label: str, target: str, refused: object) -> None:
    """Raise when a migration precondition's ``not_allowed_nodes`` (VMs) or ``not-allowed-nodes``
    (containers) names ``target``, saying why."""
    if not isinstance(refused, dict) or not isinstance(refused.get(target), dict):
        return
    why = refused[target]
    parts = []
    storages = why.get("unavailable_storages")
    if storages:
        parts.append(f"storage {', '.join(map(str, storages))} is not available there")
    resources = why.get("unavailable-resources")
    if resources:
        parts.append(f"{', '.join(map(str, resources))} has no mapping there")
    blocking = why.get("blocking-ha-resources")
    if blocking:
        names = [
            f"{b.get('sid', b)} ({b['cause']})"
            if isinstance(b, dict) and b.get("cause")
            else str(b.get("sid", b))
            if isinstance(b, dict)
            else str(b)
            for b in blocking
        ]
        parts.append(f"HA resources {', '.join(names)} block it")
    reason = "; ".join(parts) or "Proxmox does not allow it"
    raise BackendError(f"{label} cannot move to {target}: {reason}", transient=False)


def _migrate_params(
    kind: Literal["qemu", "lxc"], target: str, running: bool, local_disks: bool
) -> dict[str, Any]:
    """The parameters of ``POST …/migrate``: live for a running VM, with its local disks; a
    restart migration for a running container."""
    params: dict[str, Any] = {"target": target}
    if kind == "qemu":
        if running:
            params["online"] = 1
        if local_disks:
            params["with-local-disks"] = 1
    elif running:
        params["restart"] = 1
    return params
