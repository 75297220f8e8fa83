"""What the HA manager's status (``/cluster/ha/status/manager_status``) says beyond the services'
states: the moves the HA manager has queued or is carrying out, and which node's HA manager is
the current master.

* **Motions.** pve-ha-manager's own balancer starts nothing while any service is in the state
  ``migrate`` or ``relocate``, or has a ``migrate``/``relocate`` command queued (``cmd``) —
  whoever asked for it: an operator, failback, the balancer itself
  (``Manager.pm`` ``any_resource_motion_queued_or_running``, 5.2.0 lines 626-639). opendrs waits
  the same way before it starts a migration, and counts a queued move on both nodes as it counts
  one under way.
* **Master.** ``master_node`` is the node whose CRM holds the manager lock; the status counts as
  current while its ``timestamp`` is at most 30 s old, as ``ha-manager status`` reads it
  (``API2/HA/Status.pm`` lines 20-31). The CRM goes idle when no HA resource is configured
  (``CRM.pm`` lines 24-29, 326-336): then no node is the current master.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from opendrs.backends.proxmox.ha import sid_guest

#: Seconds after which the manager's status is old: its master is not current (Status.pm).
MASTER_STALE: Final = 30.0
#: The HA commands and service states that move a service.
_MOVES: Final = frozenset({"migrate", "relocate"})


@dataclass(frozen=True, slots=True)
class Motion:
    """A move of an HA service that the HA manager has queued (``queued``) or is carrying out."""

    sid: str
    #: The guest's id (``100`` of ``vm:100``).
    guest: str
    action: str
    node: str | None
    target: str | None
    queued: bool

    def __str__(self) -> str:
        where = f" from {self.node}" if self.node else ""
        to = f" to {self.target}" if self.target else ""
        when = "queued" if self.queued else "under way"
        return f"{self.sid} ({self.action}{where}{to}, {when})"


@dataclass(frozen=True, slots=True)
class Master:
    """The HA manager's master as its status shows it."""

    node: str | None
    #: Seconds since the master last wrote its status (``None``: no timestamp).
    age: float | None

    @property
    def current(self) -> bool:
        return self.node is not None and self.age is not None and self.age <= MASTER_STALE


def _manager(status: Mapping[str, Any]) -> Mapping[str, Any]:
    manager = status.get("manager_status")
    return manager if isinstance(manager, dict) else {}


def ha_motions(status: Mapping[str, Any]) -> tuple[Motion, ...]:
    """The HA motions queued or under way in a ``manager_status`` answer, by service id."""
    services = _manager(status).get("service_status")
    if not isinstance(services, dict):
        return ()
    out: list[Motion] = []
    for sid in sorted(services, key=str):
        entry = services[sid]
        guest = sid_guest(str(sid))
        if guest is None or not isinstance(entry, dict):
            continue
        node = entry.get("node") if isinstance(entry.get("node"), str) else None
        state, cmd = entry.get("state"), entry.get("cmd")
        if state in _MOVES:
            target = entry.get("target") if isinstance(entry.get("target"), str) else None
            out.append(Motion(str(sid), guest, str(state), node, target, queued=False))
        elif isinstance(cmd, list) and cmd and cmd[0] in _MOVES:
            target = str(cmd[1]) if len(cmd) > 1 and isinstance(cmd[1], str) else None
            out.append(Motion(str(sid), guest, str(cmd[0]), node, target, queued=True))
    return tuple(out)


def ha_master(status: Mapping[str, Any], now: float) -> Master:
    """The HA manager's master in a ``manager_status`` answer read at ``now`` (Unix seconds)."""
    manager = _manager(status)
    node = manager.get("master_node")
    stamp = manager.get("timestamp")
    age = None
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        age = max(0.0, now - float(stamp))
    return Master(node if isinstance(node, str) and node else None, age)
