"""What the HA manager knows of the cluster: its scheduler mode, nodes and services.

:class:`ManagerStatus` is the manager's view for one round — the CRS scheduler mode (datacenter
``crs: ha=…``), the node status (online or not) with each node's static stats, and the service
status (``$ss``: state, node, target, running) merged with the service configuration and usage
stats. The defaults are the HA simulator's (``Sim/Hardware.pm``), so that a query may leave out
what the Proxmox regression tests leave out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_NODE_MAXCPU",
    "DEFAULT_NODE_MAXMEM",
    "DEFAULT_SERVICE_CPU",
    "DEFAULT_SERVICE_MAXCPU",
    "DEFAULT_SERVICE_MAXMEM",
    "DEFAULT_SERVICE_MEM",
    "MODES",
    "SERVICE_STATES",
    "SID_RE",
    "ManagerStatus",
    "Mode",
    "NodeInfo",
    "Service",
]

MIB = 1024**2
GIB = 1024**3

#: Simulator defaults for a service without static/dynamic stats (``Sim/Hardware.pm``).
DEFAULT_SERVICE_MAXCPU = 4.0
DEFAULT_SERVICE_MAXMEM = 4096 * MIB
DEFAULT_SERVICE_CPU = 2.0
DEFAULT_SERVICE_MEM = 2048 * MIB
#: Simulator defaults for a node without ``maxcpu``/``maxmem``.
DEFAULT_NODE_MAXCPU = 24
DEFAULT_NODE_MAXMEM = 128 * GIB

#: Manager service states (``Manager.pm $valid_service_states``).
SERVICE_STATES = frozenset(
    {
        "stopped",
        "request_stop",
        "request_start",
        "request_start_balance",
        "started",
        "fence",
        "recovery",
        "migrate",
        "relocate",
        "freeze",
        "error",
    }
)
MODES = ("basic", "static", "dynamic")

Mode = Literal["basic", "static", "dynamic"]

#: A service id: ``<type>:<name>``, e.g. ``vm:100`` or ``ct:100``.
SID_RE = re.compile(r"^[a-z]+:\S+$")


@dataclass(frozen=True)
class NodeInfo:
    """A node as the manager sees it: online or not (``get_node_info``) and its static stats
    (``get_static_node_stats``: cores and memory), which the usage plugins read."""

    name: str
    maxcpu: int = DEFAULT_NODE_MAXCPU
    maxmem: int = DEFAULT_NODE_MAXMEM
    online: bool = True


@dataclass(frozen=True)
class Service:
    """One HA service (``$ss->{$sid}`` merged with its config and usage stats).

    ``maxcpu``/``maxmem`` are the static (configured) stats, ``cpu``/``mem`` the
    measured (dynamic) ones. ``running`` is the LRM's report (``$sd->{running}``).
    ``ha`` is False for a non-HA guest, which only contributes load.
    """

    sid: str
    node: str
    state: str = "started"
    target: str | None = None
    running: bool = False
    maxcpu: float = DEFAULT_SERVICE_MAXCPU
    maxmem: int = DEFAULT_SERVICE_MAXMEM
    cpu: float = DEFAULT_SERVICE_CPU
    mem: int = DEFAULT_SERVICE_MEM
    failback: bool = True
    group: str | None = None
    ha: bool = True
    #: A CRM command queued for the service and not yet carried out (``$ss->{$sid}->{cmd}``):
    #: ``(task, target)``, e.g. ``("migrate", "node2")``.
    cmd: tuple[str, str] | None = None

    @property
    def motion(self) -> bool:
        """Moving, or a migrate/relocate queued (``any_resource_motion_queued_or_running``)."""
        queued = self.cmd is not None and self.cmd[0] in ("migrate", "relocate")
        return self.state in ("migrate", "relocate") or queued


@dataclass(frozen=True)
class ManagerStatus:
    """The manager's view for one round: scheduler mode, nodes and services (sid → service)."""

    mode: Mode
    nodes: Mapping[str, NodeInfo]
    services: Mapping[str, Service]

    @property
    def online_nodes(self) -> list[str]:
        """Names of the online nodes, sorted."""
        return sorted(name for name, node in self.nodes.items() if node.online)

    def ha_sids(self) -> list[str]:
        """HA service ids in sid order."""
        return sorted(sid for sid, svc in self.services.items() if svc.ha)

    def usage_order(self) -> list[str]:
        """``recompute_online_node_usage`` order: HA services by sid, then non-HA guests."""
        ha = self.ha_sids()
        return ha + sorted(sid for sid, svc in self.services.items() if not svc.ha)
