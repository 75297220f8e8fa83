"""The HA stack's view of the cluster: which guests it manages, in what state, moving where, and
which nodes are in HA maintenance — from ``/cluster/ha/resources`` and the HA manager's status
(``/cluster/ha/status/manager_status``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from opendrs.backends.proxmox.values import as_bool


@dataclass(frozen=True, slots=True)
class HaService:
    sid: str
    #: The requested state (``started``, ``stopped``, ``disabled``, ``ignored``).
    request: str | None
    #: The manager's state (``started``, ``migrate``, ``error``…), if the manager reports it.
    state: str | None
    node: str | None
    target: str | None
    group: str | None
    #: ``failback`` (default on): the HA manager moves the guest back to its highest-priority
    #: node-affinity nodes every round (pve-ha-manager ``Manager.pm`` ``select_service_node``).
    failback: bool = True
    #: ``auto-rebalance`` (pve-manager 9.1.13, default on): off, the operator does not want the
    #: guest moved to balance the cluster.
    auto_rebalance: bool = True


@dataclass(frozen=True, slots=True)
class HaView:
    #: HA services by guest id.
    services: Mapping[str, HaService]
    maintenance: frozenset[str]


def sid_guest(sid: str) -> str | None:
    """``vm:100`` → ``100``."""
    kind, _, vmid = sid.partition(":")
    if not vmid:
        kind, vmid = "vm", kind
    return vmid if kind in ("vm", "ct") and vmid.isdigit() else None


def service_id(kind: Literal["qemu", "lxc"], vmid: str) -> str:
    """The HA stack's id of a guest: ``vm:100`` or ``ct:100``."""
    return f"{'vm' if kind == 'qemu' else 'ct'}:{vmid}"


def listed_service(
    kind: Literal["qemu", "lxc"], vmid: str, hastate: object, node: str | None
) -> HaService:
    """The HA service of a guest that ``/cluster/resources`` lists as HA-managed (``hastate``)."""
    return HaService(
        sid=service_id(kind, vmid),
        request=None,
        state=str(hastate),
        node=node,
        target=None,
        group=None,
    )


def _flag(value: object) -> bool:
    """An HA resource's boolean flag that is on by default: off only when it says 0 (or false)."""
    return value is None or as_bool(value)


def parse_ha_view(resources: list[dict[str, Any]], status: Mapping[str, Any]) -> HaView:
    """The HA view of ``/cluster/ha/resources`` and ``/cluster/ha/status/manager_status``."""
    manager = status.get("manager_status")
    manager = manager if isinstance(manager, dict) else {}
    service_status = manager.get("service_status")
    service_status = service_status if isinstance(service_status, dict) else {}
    services: dict[str, HaService] = {}
    sids = {str(r["sid"]) for r in resources if r.get("sid")} | {str(s) for s in service_status}
    requested = {str(r["sid"]): r for r in resources if r.get("sid")}
    for sid in sids:
        vmid = sid_guest(sid)
        if vmid is None:
            continue
        config = requested.get(sid, {})
        current = service_status.get(sid)
        current = current if isinstance(current, dict) else {}
        services[vmid] = HaService(
            sid=sid,
            request=config.get("state") if isinstance(config.get("state"), str) else None,
            state=current.get("state") if isinstance(current.get("state"), str) else None,
            node=current.get("node") if isinstance(current.get("node"), str) else None,
            target=current.get("target") if isinstance(current.get("target"), str) else None,
            group=config.get("group") if isinstance(config.get("group"), str) else None,
            failback=_flag(config.get("failback")),
            auto_rebalance=_flag(config.get("auto-rebalance")),
        )
    maintenance: set[str] = set()
    node_status = manager.get("node_status")
    if isinstance(node_status, dict):
        maintenance |= {str(n) for n, s in node_status.items() if s == "maintenance"}
    lrm_status = status.get("lrm_status")
    if isinstance(lrm_status, dict):
        maintenance |= {
            str(n)
            for n, s in lrm_status.items()
            if isinstance(s, dict) and s.get("mode") == "maintenance"
        }
    return HaView(services, frozenset(maintenance))
