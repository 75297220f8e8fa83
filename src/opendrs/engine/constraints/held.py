"""Whether a guest may move at all (:func:`movability`), and why not (:class:`Held`): ignored,
HA states the HA manager or an operator handles (:data:`HA_HELD`), Proxmox VE balancing HA guests
itself, locked, local devices, local disks, containers without restart migration, stopped guests,
minimum uptime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opendrs.model.cluster import Cluster, Guest
from opendrs.model.units import format_bytes, format_duration

from ..usage import loaded_nodes

#: What a guest is to move for: balancing, evacuating a node, recovering from a failed node, or
#: placing a new guest.
Purpose = Literal["balance", "evacuate", "recover", "new"]

#: HA states in which a plan never migrates an HA-managed guest: the HA manager is handling it
#: (fencing, recovery, a node shutting down), an operator must (error), or it is not to run.
HA_HELD: frozenset[str] = frozenset({"error", "freeze", "fence", "recovery", "ignored", "stopped"})


#: Why an HA guest is not balanced while Proxmox VE's own balancer is on.
PLATFORM_BALANCES = "Proxmox VE balances HA guests itself (ha-auto-rebalance)"


def platform_balancer(cluster: Cluster) -> str | None:
    """One sentence when Proxmox VE balances the cluster's HA guests itself, with what opendrs
    does about it and what to change; ``None`` when it does not."""
    if not cluster.ha_auto_rebalance:
        return None
    count = sum(1 for g in cluster.guests if g.ha)
    return (
        f"Proxmox VE balances its HA guests itself (ha-auto-rebalance is on in the datacenter's "
        f"crs options): opendrs leaves its {count} HA guest{'s' if count != 1 else ''} to it "
        "and balances the others; turn ha-auto-rebalance off (Datacenter → Options → Cluster "
        "Resource Scheduling) to let opendrs balance them"
    )


HeldCode = Literal[
    "ignored",
    "platform-balancer",
    "ha-state",
    "local-disks",
    "local-device",
    "migrating",
    "locked",
    "node-offline",
    "container",
    "not-running",
    "uptime",
]


@dataclass(frozen=True, slots=True)
class Held:
    """Why a guest may not move: a :data:`HeldCode` for code, and the detail an operator reads
    (``str()``: ``HA state fence``, ``local disks (32 GiB)``, …)."""

    code: HeldCode
    text: str

    def __str__(self) -> str:
        return self.text


def movability(guest: Guest, cluster: Cluster, purpose: Purpose = "balance") -> Held | None:
    """Why ``guest`` may not move for ``purpose``, or ``None`` when it may.

    A plan (``balance``, ``evacuate``) never moves an HA-managed guest in a state of
    :data:`HA_HELD`; recovery is what the HA manager does for a guest fenced on a failed node.
    While Proxmox VE balances HA guests itself (``Cluster.ha_auto_rebalance``), balancing leaves
    them to it: two balancers would undo each other's moves.
    The cluster's ``min_uptime`` holds a guest for ``balance`` unless its node is in maintenance:
    a guest must leave such a node however recently it started.

    ``recover`` is the platform's restart of a guest whose node failed, not a move of opendrs's:
    opendrs's ignore rules do not hold it (Proxmox's HA manager restarts such a guest like any
    other); an HA guest in HA state ``ignored`` (which the HA manager leaves alone) and a guest
    tied to its node by local disks or devices are held.
    """
    settings = cluster.settings
    if purpose == "recover":
        if guest.ha and guest.ha_state == "ignored":
            return Held("ha-state", "HA state ignored: the HA manager leaves it alone")
        return _local_only(guest, settings.allow_local_disks, devices_first=False)
    if guest.id in cluster.rules.ignored:
        reason = cluster.rules.ignore_reason(guest.id)
        return Held("ignored", f"ignored: {reason}" if reason else "ignored by a rule")
    if purpose == "balance" and guest.ha and cluster.ha_auto_rebalance:
        return Held("platform-balancer", PLATFORM_BALANCES)
    if purpose in ("balance", "evacuate") and guest.ha and guest.ha_state in HA_HELD:
        return Held("ha-state", f"HA state {guest.ha_state}")
    if guest.migrating_to is not None:
        return Held("migrating", f"already migrating to {guest.migrating_to}")
    if guest.lock:
        return Held("locked", f"locked ({guest.lock})")
    local = _local_only(guest, settings.allow_local_disks, devices_first=True)
    if local is not None:
        return local
    node_index = cluster.node_index.get(guest.node)
    node = cluster.nodes[node_index] if node_index is not None else None
    if node is not None and not node.online:
        return Held("node-offline", "its node is offline")
    running = bool(loaded_nodes(guest))
    if guest.kind == "ct" and running and not settings.allow_restart_migration:
        return Held("container", "container: restart migration not allowed")
    if purpose == "balance":
        if not running:
            return Held("not-running", "not running")
        if guest.uptime < settings.min_uptime and not (node is not None and node.maintenance):
            return Held(
                "uptime",
                f"up for {format_duration(guest.uptime)}, "
                f"less than {format_duration(settings.min_uptime)}",
            )
    return None


def _local_only(guest: Guest, allow_local_disks: bool, *, devices_first: bool) -> Held | None:
    """A guest tied to its node by local disks (unless allowed) or a local device."""
    disks = (
        Held("local-disks", f"local disks ({format_bytes(guest.local_disk_bytes)})")
        if guest.local_disk_bytes and not allow_local_disks
        else None
    )
    device = Held("local-device", f"local device {guest.devices[0]}") if guest.devices else None
    return (device or disks) if devices_first else (disks or device)


__all__ = [
    "HA_HELD",
    "PLATFORM_BALANCES",
    "Held",
    "HeldCode",
    "Purpose",
    "movability",
    "platform_balancer",
]
