"""HA recovery after a node failure, as Proxmox VE's HA manager makes it, on an opendrs
:class:`~opendrs.model.cluster.Cluster`: which HA guests of the failed node restart, where, and
which are left down.

Upstream (pve-ha-manager, ``src/PVE/HA/Manager.pm``): once the failed node is fenced, ``manage``
moves each of its services to state ``recovery`` and ``next_state_recovery`` recovers them one by
one in service-id order (``sort keys %$ss``), each on the node ``select_service_node`` picks with
the preference ``best-score`` (node affinity over the online nodes, resource affinity, then the
lowest score of the usage plugin: in ``basic`` mode the count of guests on the node — HA
services and, as pve-ha-manager 5.2 adds them, the other guests —, in ``static`` mode TOPSIS over
configured cores and memory — ``Usage/Basic.pm``, ``Usage/Static.pm``). Each recovery goes
through ``change_service_state``, which adds the service's usage on its new node, so the next
pick sees it. No node (affinity leaves none online): ``recovering service … failed, no recovery
node found``, and the service waits.

The manager never asks whether the node has room: the start on that node fails or overcommits
it. This model counts a start the node has no capacity for as failed (:func:`recover_node`
counts capacity as the engine does — the guest's configured memory and vCPUs, and measured use
in dynamic mode, against the node's, net of reserves, in the cluster's settings).
``next_state_started`` then relocates the service with the preference ``try-next`` while
``failed_nodes`` holds no more than ``max_relocate`` (1 by default, ``Config.pm``) nodes, and
puts it in state ``error`` after that. So a service has two tries: the
best-score node, then (after the first picks of every service) the next node of that order
other than the one it failed on.

Guests that may not start elsewhere at all (local disks, passed-through devices) or that the
HA manager leaves alone (HA state ``ignored``) are *held*: they wait for their node
(:func:`~opendrs.engine.constraints.movability` with ``purpose="recover"``). opendrs's own
ignore rules are not the HA manager's: it recovers such a guest like any other. Which guests
are HA guests: :func:`opendrs.engine.headroom.ha_guests`. Several nodes failing at once
(:func:`recover_nodes`): their HA guests recover together, in service-id order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from opendrs.engine.constraints import movability
from opendrs.engine.headroom import ha_guests
from opendrs.engine.placement import PlacementState
from opendrs.engine.usage import tolerance
from opendrs.model.cluster import Cluster, Guest, Move
from opendrs.model.rules import Rules

from .manager import make_usage, select_service_node
from .rules import Rule, compile_rules, transform_rules
from .rules.base import CompiledRules
from .status import ManagerStatus, Mode, NodeInfo, Service
from .usage import BasicUsage, Usage
from .usage.base import TopsisUsage

__all__ = ["MAX_RELOCATE", "Recovery", "recover_node", "recover_nodes", "service_id"]

#: ``max_relocate`` of a service that does not set it (``Config.pm``): relocations after a
#: failed start before the service enters state ``error``.
MAX_RELOCATE: Final = 1


@dataclass(frozen=True, slots=True)
class Recovery:
    """What the HA manager does when ``failed`` fails (``failed`` names the failed nodes,
    joined by ", ", when several fail at once)."""

    failed: str
    #: HA guests that ran on the failed node.
    ha_guests: int
    restarts: tuple[Move, ...]
    #: (guest id, why) of the HA guests left down: no node allowed, or no room where the
    #: manager started them.
    stranded: tuple[tuple[str, str], ...]
    #: HA guests that may not start elsewhere at all: they wait for their node.
    held: tuple[str, ...]


def service_id(guest: Guest) -> str:
    """The guest's HA service id: ``ct:ID`` for a container, ``vm:ID`` otherwise."""
    return f"{'ct' if guest.kind == 'ct' else 'vm'}:{guest.id}"


def recover_node(cluster: Cluster, failed: str, mode: Mode = "basic") -> Recovery:
    """The HA manager's recovery of the HA guests of ``failed`` (see the module docstring), with
    the scheduler mode ``mode`` (datacenter ``crs: ha=…``; Proxmox's default is ``basic``)."""
    return recover_nodes(cluster, (failed,), mode)


def recover_nodes(cluster: Cluster, failed: Sequence[str], mode: Mode = "basic") -> Recovery:
    """:func:`recover_node` for the nodes ``failed`` failing at once: their HA guests recover
    together, in service-id order."""
    down = frozenset(failed)
    broken = _without_nodes(cluster, down)
    counted = {g.id for g in ha_guests(cluster)[0]}
    lost = [g for g in broken.guests if g.id in counted and g.node in down]
    held = tuple(sorted(g.id for g in lost if movability(g, broken, "recover") is not None))
    recovering = {service_id(g): g for g in lost if g.id not in held}
    status = _status(broken, recovering, mode)
    usage = make_usage(status)[0]
    compiled = _compiled(broken, set(status.services))
    room = _room(broken)
    restarts: list[Move] = []
    retry: list[str] = []
    stranded: list[tuple[str, str]] = []
    for sid in sorted(recovering):
        guest = recovering[sid]
        node = _restart(compiled, usage, status, sid, "best-score", ())
        if node is None:
            stranded.append((guest.id, "no node allowed (the HA rules)"))
        elif room.take(broken, guest, node):
            restarts.append(Move(guest.id, guest.node, node))
        else:
            retry.append(sid)
    for sid in retry:
        first = status.services[sid].node
        node = _restart(compiled, usage, status, sid, "try-next", (first,))
        guest = recovering[sid]
        if node is not None and node != first and room.take(broken, guest, node):
            restarts.append(Move(guest.id, guest.node, node))
        else:
            tried = first if node in (None, first) else f"{first} and {node}"
            stranded.append((guest.id, f"no room to start on {tried}"))
    return Recovery(", ".join(failed), len(lost), tuple(restarts), tuple(stranded), held)


def _restart(
    compiled: CompiledRules,
    usage: Usage,
    status: ManagerStatus,
    sid: str,
    preference: str,
    failed_nodes: tuple[str, ...],
) -> str | None:
    """``select_service_node`` for ``sid``, and on a pick ``change_service_state``: the service
    is started there and its usage added on that node."""
    node, _scores = select_service_node(
        compiled,
        usage,
        status,
        sid,
        "try-next" if preference == "try-next" else "best-score",
        failed_nodes=failed_nodes,
    )
    if node is None:
        return None
    services = status.services
    assert isinstance(services, dict)
    services[sid] = replace(services[sid], node=node, state="started")
    _add_usage(usage, services[sid], node)
    return node


def _add_usage(usage: Usage, service: Service, node: str) -> None:
    """``add_service_usage`` of a service started on ``node`` (``Usage/Basic.pm``: one more
    service; ``Usage/Static.pm``: its configured cores and memory)."""
    if isinstance(usage, BasicUsage):
        usage.counts[node] += 1
    elif isinstance(usage, TopsisUsage):
        usage.scoring[node].add_started(service.maxcpu, service.maxmem)


def _without_nodes(cluster: Cluster, failed: frozenset[str]) -> Cluster:
    nodes = tuple(replace(n, online=False) if n.name in failed else n for n in cluster.nodes)
    return replace(cluster, nodes=nodes)


def _status(broken: Cluster, recovering: dict[str, Guest], mode: Mode) -> ManagerStatus:
    """The manager's view once the node is fenced: the usable nodes online (a node in
    maintenance is not), the running guests started where they are (non-HA ones only load
    their node), the failed node's HA guests in state ``recovery``."""
    nodes = {
        n.name: NodeInfo(n.name, int(n.cpu), int(n.memory), online=n.usable) for n in broken.nodes
    }
    services: dict[str, Service] = {}
    for guest in broken.guests:
        sid = service_id(guest)
        if sid in recovering:
            state = "recovery"
        elif guest.state in ("running", "paused"):
            state = "started"
        else:
            continue
        services[sid] = Service(
            sid,
            guest.node,
            state=state,
            running=state == "started",
            maxcpu=float(guest.cpu),
            maxmem=int(guest.memory),
            failback=guest.failback,
            ha=guest.ha or sid in recovering,
        )
    return ManagerStatus(mode, nodes, services)


def _compiled(broken: Cluster, sids: set[str]) -> CompiledRules:
    """The cluster's rules as HA rules over the services of ``sids`` (hard guest affinity as
    resource affinity; soft guest affinity has no HA counterpart), transformed and compiled
    as ``PVE::HA::Rules`` does (infeasible rules dropped)."""
    rules = _ha_rules(broken.rules, {g.id: service_id(g) for g in broken.guests}, sids)
    kept, _dropped = transform_rules(rules, [n.name for n in broken.nodes])
    return compile_rules(kept)


def _ha_rules(rules: Rules, sid_of: dict[str, str], sids: set[str]) -> list[Rule]:
    out: list[Rule] = []
    for rule in rules.node_affinity:
        members = {sid_of[g] for g in rule.guests if sid_of.get(g) in sids}
        if members:
            out.append(
                Rule(
                    rule.name,
                    "node-affinity",
                    members,
                    len(out),
                    nodes=dict(rule.nodes),
                    strict=rule.strict,
                )
            )
    for affinity in rules.guest_affinity:
        members = {sid_of[g] for g in affinity.guests if sid_of.get(g) in sids}
        if affinity.hard and len(members) >= 2:
            kind = "positive" if affinity.positive else "negative"
            out.append(Rule(affinity.name, "resource-affinity", members, len(out), affinity=kind))
    return out


class _Room:
    """Capacity left on each node, as the engine counts it (:class:`PlacementState`)."""

    def __init__(self, state: PlacementState) -> None:
        self.state = state
        limit = state.constraints.capacity.limit
        self.free = limit - state.committed
        self.slack = tolerance(limit)

    def take(self, broken: Cluster, guest: Guest, node: str) -> bool:
        """Whether ``guest`` fits on ``node``; if it does, it is placed there."""
        j = broken.guest_index[guest.id]
        n = broken.node_index[node]
        demand = self.state.constraints.guest_demand(j)
        if not np.all(demand <= self.free[n] + self.slack[n]):
            return False
        self.free[n] = self.free[n] - demand
        return True


def _room(broken: Cluster) -> _Room:
    return _Room(PlacementState.build(broken))
