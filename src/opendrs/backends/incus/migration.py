"""Migrations: start one, follow its operation, find one whose answer was lost, stop one;
evacuate and restore members.

* A running VM moves live: ``POST /1.0/instances/NAME?target=MEMBER&project=P`` with
  ``{"name": NAME, "migration": true, "live": true}``, when Incus would move it live
  (:func:`~.movement.live_refusal`: ``cluster.evacuate``, ``migration.stateful``, its boot
  state); opendrs never asks for a live move Incus would refuse. A server without the API
  extension ``migration_vm_live`` (LXD 5.0) makes that move by a stateful stop, copy and start:
  the guest does not run meanwhile, and the move's outcome says for how long (its operation's
  time, as the server gives it).
* A stopped instance moves cold (``"live": false``).
* A running container, and a running VM that cannot move live, move only by a restart: with
  ``settings.allow_restart_migration`` it is stopped, moved and started again (three operations,
  followed one after the other by :meth:`poll`); without it, it does not move. A move that fails
  after the stop starts it again where it is. Its outcome says for how long the guest did not
  run (from its stop operation's start to its start operation's end).

The instance is read first (where it is, whether it runs, its config); the start's
:class:`~opendrs.backends.base.StartGate` is asked right before the request that moves it (the
move, or a restart move's stop); once the gate closes (a reload), the read is given up on as on a
stop request.

The handle's id is the operation's id (``restart:OP`` for a restart move, whose current
operation changes as it goes). Incus forgets an operation a few seconds after it ended: a poll
that finds it gone settles the migration by where the instance is. A move still running after
``migration_timeout`` is cancelled and fails; that time is measured on the monotonic clock, from
the start or, for a move started before a restart, from this process's first poll of it. After a
move, the instance's ``volatile.rebalance.last_move`` is set to the time (Unix seconds), as
Incus's own balancer does, so that either balancer respects the other's cooldown; a server that
refuses that key (LXD, or an Incus without it) gets ``user.opendrs.last_move`` instead, and both
are read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

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
from opendrs.backends.incus.assemble import split_id
from opendrs.backends.incus.client import Client, HttpError
from opendrs.backends.incus.config import IncusConfig
from opendrs.backends.incus.movement import live_refusal
from opendrs.backends.incus.observe import LAST_MOVE_KEYS, Observer
from opendrs.backends.incus.values import clip, object_of, objects_of, timestamp
from opendrs.model.cluster import Move, Settings

log = logging.getLogger(__name__)

#: Seconds the server waits for a restart move's clean stop (``force: false``): an instance that
#: has not shut down by then is not forced (``doInstanceStatePut`` in Incus's
#: ``cmd/incusd/instance_state.go``); its stop operation fails, and the move with it.
_STOP_TIMEOUT: Final = 60
_RESTART: Final = "restart:"
#: The API extension of a server that moves a running VM live (QEMU to QEMU); without it, a
#: "live" move is a stateful stop and start.
_VM_LIVE: Final = "migration_vm_live"
_STATEFUL: Final = "by a stateful stop and start"


@dataclass(slots=True)
class _Restart:
    """A container's restart move under way: the stage and its operation."""

    move: Move
    project: str
    name: str
    stage: str
    operation: str
    #: When the container was asked to stop (Unix seconds), by opendrs's clock and, once its
    #: stop ended, by the server's (the stop operation's ``created_at``).
    stopped: float
    stopped_server: float | None = None


class Migrator:
    """Starts, follows and stops migrations through ``client``; where an instance is comes from
    ``observer``'s last observation (or the API). A move is given up after
    ``config.migration_timeout`` on ``monotonic`` (see
    :class:`~opendrs.backends.base.InFlightAges`)."""

    def __init__(
        self,
        client: Client,
        config: IncusConfig,
        settings: Settings,
        observer: Observer,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._config = config
        self._settings = settings
        self._observer = observer
        self._restarts: dict[str, _Restart] = {}
        #: Whether the server takes ``volatile.rebalance.last_move`` (unknown until tried).
        self._volatile_key = True
        #: Whether the server moves running VMs live (``None``: not asked yet).
        self._vm_live: bool | None = None
        #: The operations of VM moves made by a stateful stop and start.
        self._stateful: set[str] = set()
        #: How long each move in flight has taken, on the monotonic clock.
        self._ages = InFlightAges(monotonic)

    # -- start ---------------------------------------------------------------------------------

    def start(self, move: Move, gate: StartGate) -> Handle:
        """Start ``move`` once the instance is read and ``gate`` still lets it."""
        project, name = split_id(move.guest)
        label = f"instance {move.guest}"
        if move.source == move.target:
            raise BackendError(f"{label} is already on {move.target}", transient=False)
        row = self._instance(project, name, label)
        if row.get("location") != move.source:
            raise BackendError(
                f"{label} is not on {move.source} (any more): it is on {row.get('location')}",
                transient=False,
            )
        running = row.get("status") == "Running"
        vm = row.get("type") == "virtual-machine"
        config = row.get("expanded_config") if isinstance(row.get("expanded_config"), dict) else {}
        refusal = (
            live_refusal(config, boot_state_checked=self._observer.boot_state_checked)
            if running and vm
            else None
        )
        if running and (not vm or refusal):
            return self._start_restart(move, project, name, label, refusal, gate)
        gate.enter(f"POST /1.0/instances/{name}")
        operation = self._move(move, project, name, live=running)
        how = "live" if running else "cold"
        if running and not self._moves_vms_live():
            self._stateful.add(operation)
            how = f"{_STATEFUL}: the server has no {_VM_LIVE}"
        log.info(
            "moving %s from %s to %s (%s): operation %s",
            label,
            move.source,
            move.target,
            how,
            operation,
        )
        self._observer.targets[move.guest] = move.target
        self._ages.start(operation)
        return Handle(operation, move, time.time())

    def _moves_vms_live(self) -> bool:
        """Whether the server moves a running VM live (its API extension ``migration_vm_live``),
        asked once."""
        if self._vm_live is None:
            server = object_of(self._client.get("/1.0"), "/1.0")
            self._vm_live = _VM_LIVE in (server.get("api_extensions") or ())
        return self._vm_live

    def _instance(self, project: str, name: str, label: str) -> dict[str, Any]:
        try:
            return object_of(
                self._client.get(f"/1.0/instances/{name}", project=project), "/1.0/instances/…"
            )
        except HttpError as exc:
            if exc.status == 404:
                raise BackendError(f"{label} does not exist", transient=False) from None
            raise

    def _move(self, move: Move, project: str, name: str, *, live: bool) -> str:
        body = {"name": name, "migration": True, "live": live}
        reply = self._client.send(
            "POST", f"/1.0/instances/{name}", body, target=move.target, project=project
        )
        if reply.operation is None:
            raise BackendError(
                f"instance {move.guest}: the API answered the move with no operation"
            )
        return reply.operation

    def _power(self, project: str, name: str, action: str) -> str:
        body: dict[str, Any] = {"action": action, "timeout": _STOP_TIMEOUT}
        if action == "stop":
            body["force"] = False
        reply = self._client.send("PUT", f"/1.0/instances/{name}/state", body, project=project)
        if reply.operation is None:
            raise BackendError(f"instance {name}: the API answered the {action} with no operation")
        return reply.operation

    def _start_restart(
        self,
        move: Move,
        project: str,
        name: str,
        label: str,
        refusal: str | None,
        gate: StartGate,
    ) -> Handle:
        if not self._settings.allow_restart_migration:
            what = f"a running VM that cannot move live ({refusal})" if refusal else None
            raise BackendError(
                f"{label} is {what or 'a running container'}: it can only move by a restart "
                "migration, which settings.allow_restart_migration does not allow",
                transient=False,
            )
        gate.enter(f"PUT /1.0/instances/{name}/state")
        operation = self._power(project, name, "stop")
        handle_id = f"{_RESTART}{operation}"
        self._restarts[handle_id] = _Restart(move, project, name, "stop", operation, time.time())
        log.info(
            "moving %s from %s to %s by a restart: stopping it (operation %s)",
            label,
            move.source,
            move.target,
            operation,
        )
        self._observer.targets[move.guest] = move.target
        self._ages.start(handle_id)
        return Handle(handle_id, move, time.time())

    # -- follow --------------------------------------------------------------------------------

    def poll(self, handle: Handle) -> Progress:
        if handle.id.startswith(_RESTART):
            job = self._restarts.get(handle.id)
            if job is None:
                return self._settle(handle.move, "the restart move's state was lost", restart=True)
            progress = self._poll_restart(handle.id, job)
        else:
            progress = self._poll_operation(handle)
        if (
            progress.state == "running"
            and self._ages.age(handle.id) > self._config.migration_timeout
        ):
            self.cancel(handle)
            self._ages.forget(handle.id)
            return failed(
                f"the move of {handle.move.guest} did not end within "
                f"{self._config.migration_timeout:g}s"
            )
        if progress.state == "done":
            self._record_move(handle.move)
        if progress.finished:
            self._observer.targets.pop(handle.move.guest, None)
            self._ages.forget(handle.id)
        return progress

    def _operation(self, operation: str) -> dict[str, Any] | None:
        """The operation now, or ``None`` when the server has forgotten it."""
        try:
            return self._client.wait(operation, 0)
        except HttpError as exc:
            if exc.status == 404:
                return None
            raise

    def _poll_operation(self, handle: Handle) -> Progress:
        operation, move = handle.id, handle.move
        state = self._operation(operation)
        if state is None:
            progress = self._settle(move, "its operation ended")
            if progress.state == "done" and operation in self._stateful:
                # The operation's own times are gone: at most the time since the request.
                self._stateful.discard(operation)
                return Progress("done", _STATEFUL, max(0.0, time.time() - handle.started))
            return progress
        status = state.get("status")
        if status == "Success":
            if operation in self._stateful:
                self._stateful.discard(operation)
                return Progress("done", _STATEFUL, _took(state, handle.started))
            return DONE
        if status in ("Failure", "Cancelled"):
            self._stateful.discard(operation)
            reason = clip(str(state.get("err") or status), 300)
            return failed(f"the move of {move.guest} to {move.target} failed: {reason}")
        return RUNNING

    def _settle(self, move: Move, why: str, *, restart: bool = False) -> Progress:
        """A migration whose operation is gone: done when the instance is on its target.

        A restart move (``restart``) was of a running container: one left stopped, on either
        member, is started again.
        """
        project, name = split_id(move.guest)
        row = self._instance(project, name, f"instance {move.guest}")
        location = row.get("location")
        if restart and row.get("status") == "Stopped" and location in (move.source, move.target):
            log.info("starting %s again on %s after its restart move", move.guest, location)
            self._power(project, name, "start")
        if location == move.target:
            return DONE
        return failed(f"{why}, and instance {move.guest} is on {location}, not {move.target}")

    def _poll_restart(self, handle_id: str, job: _Restart) -> Progress:
        state = self._operation(job.operation)
        status = "Success" if state is None else state.get("status")
        if status == "Running":
            return RUNNING
        if status != "Success":
            reason = clip(str((state or {}).get("err") or status), 300)
            del self._restarts[handle_id]
            if job.stage == "move":
                self._restart_where_it_is(job)
            return failed(
                f"the restart move of {job.move.guest} failed at its {job.stage}: {reason}"
            )
        if job.stage == "stop":
            job.stopped_server = timestamp((state or {}).get("created_at"))
            job.stage, job.operation = (
                "move",
                self._move(job.move, job.project, job.name, live=False),
            )
        elif job.stage == "move":
            job.stage, job.operation = "start", self._power(job.project, job.name, "start")
        else:
            del self._restarts[handle_id]
            # By the server's clock where it gives both ends, else by opendrs's.
            ended = timestamp((state or {}).get("updated_at"))
            if ended is not None and job.stopped_server is not None:
                return Progress("done", "by a restart", max(0.0, ended - job.stopped_server))
            return Progress("done", "by a restart", max(0.0, time.time() - job.stopped))
        log.info("restart move of %s: %s (operation %s)", job.move.guest, job.stage, job.operation)
        return RUNNING

    def _restart_where_it_is(self, job: _Restart) -> None:
        try:
            self._power(job.project, job.name, "start")
        except BackendError as exc:
            log.warning("instance %s stays stopped after its failed move: %s", job.move.guest, exc)

    def _record_move(self, move: Move) -> None:
        """Write the time of the move into the instance (see the module docstring)."""
        project, name = split_id(move.guest)
        now = str(int(time.time()))
        keys = LAST_MOVE_KEYS if self._volatile_key else LAST_MOVE_KEYS[1:]
        for key in keys:
            try:
                self._client.send(
                    "PATCH", f"/1.0/instances/{name}", {"config": {key: now}}, project=project
                )
                return
            except HttpError as exc:
                if not _refused_key(exc) or key != LAST_MOVE_KEYS[0]:
                    log.warning("cannot record the move of %s in %s: %s", move.guest, key, exc)
                    return
                self._volatile_key = False
                log.info(
                    "the server refuses %s (%s): recording moves in %s",
                    key,
                    exc.message,
                    LAST_MOVE_KEYS[1],
                )
            except BackendError as exc:
                log.warning("cannot record the move of %s in %s: %s", move.guest, key, exc)
                return

    # -- find, stop ----------------------------------------------------------------------------

    def find(self, move: Move, since: float) -> Handle | None:
        """A running migration operation of ``move.guest`` (a request whose answer was lost)."""
        project, name = split_id(move.guest)
        operations = object_of(
            self._client.get("/1.0/operations", recursion=1, project=project), "/1.0/operations"
        )
        for operation in objects_of(operations.get("running") or [], "running operations"):
            resources = operation.get("resources")
            urls = resources.get("instances") if isinstance(resources, dict) else None
            names = {str(u).split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] for u in urls or ()}
            if name in names and "migrat" in str(operation.get("description", "")).lower():
                log.info(
                    "the move of %s to %s is operation %s", move.guest, move.target, operation["id"]
                )
                self._observer.targets[move.guest] = move.target
                return Handle(str(operation["id"]), move, since)
        return None

    def cancel(self, handle: Handle) -> bool:
        """Ask the server to cancel the migration's operation; False when it has none to cancel."""
        operation = handle.id.removeprefix(_RESTART)
        job = self._restarts.get(handle.id)
        if job is not None:
            operation = job.operation
        try:
            self._client.send("DELETE", f"/1.0/operations/{operation}")
        except HttpError as exc:
            if exc.status in (400, 403, 404):
                log.info("operation %s cannot be cancelled: %s", operation, exc.message)
                return False
            raise
        log.info("asked the server to cancel operation %s (%s)", operation, handle.move.guest)
        return True

    # -- maintenance ---------------------------------------------------------------------------

    def set_maintenance(self, node: str, enabled: bool) -> None:
        """Evacuate a member (``enabled``) or restore it, and wait for Incus to finish."""
        action = "evacuate" if enabled else "restore"
        reply = self._client.send("POST", f"/1.0/cluster/members/{node}/state", {"action": action})
        if reply.operation is None:
            return
        deadline = time.monotonic() + self._config.migration_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackendError(
                    f"the {action} of member {node} did not end within "
                    f"{self._config.migration_timeout:g}s"
                )
            # In slices, so that a stop request is seen between them.
            state = self._client.wait(reply.operation, min(left, 5))
            status = state.get("status")
            if status == "Success":
                log.info("member %s: %s done", node, action)
                return
            if status in ("Failure", "Cancelled"):
                reason = clip(str(state.get("err") or status))
                raise BackendError(f"the {action} of member {node} failed: {reason}")


def _took(operation: dict[str, Any], started: float) -> float:
    """Seconds an ended operation ran, by its own times (``created_at`` to ``updated_at``); from
    ``started`` to now where the server gives none."""
    created, updated = (
        timestamp(operation.get("created_at")),
        timestamp(operation.get("updated_at")),
    )
    if created is None or updated is None:
        return max(0.0, time.time() - started)
    return max(0.0, updated - created)


def _refused_key(exc: HttpError) -> bool:
    """Whether the server refused a config key it does not know: HTTP 400, or — as LXD 5.0
    answers it — 500 with ``Unknown configuration key``."""
    return exc.status == 400 or "unknown configuration key" in exc.message.lower()
