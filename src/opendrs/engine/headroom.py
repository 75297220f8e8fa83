"""Failover headroom (HA admission control): if nodes fail, can every HA guest on them be
restarted on the nodes left, within capacity and the rules?

For each case of ``k`` failed nodes (every online node alone for ``k = 1``), the failed nodes go
offline and their HA-managed guests that run (or are paused) are restarted elsewhere by the
placement engine's own routine (:func:`~opendrs.engine.placement.place_biggest_first` with
``purpose="recover"``): biggest first — configured memory, then vCPUs —, each on the node that
balances the cluster best among those every hard filter lets it on (capacity as the cluster's
settings count it: configured vCPUs against cores × overcommit, memory, measured use in dynamic
mode; anti-affinity, strict node affinity, pins, the platform's limits, architecture), each
restart seen by the next. That is first-fit decreasing by memory, the usual HA admission check,
with the engine's best node for "first". A guest no node can take, or that may not restart
elsewhere at all (an ignore rule, local disks, passed-through devices: *held*, which no
placement changes), *cannot restart*. Guests that are not HA-managed stay down with their
node.

How the restarts are placed (``recovery``, :data:`RECOVERIES`): ``best-fit`` is the above;
``pve-basic`` and ``pve-static`` are Proxmox VE's HA manager in that scheduler mode
(:func:`opendrs.compat.pve.recovery.recover_nodes`: service-id order, its own pick of node, a
start with no room failed, one relocation), which can leave a guest down where ``best-fit``
finds room. Either way an HA guest restarts whatever opendrs's ignore rules say (they hold
opendrs's moves, not the platform's recovery: :func:`~.constraints.movability`).

Which guests are HA guests: those the platform manages (:attr:`Guest.ha`, read by the Proxmox
backend from ``/cluster/ha/resources``). A cluster with none marked (Incus, a snapshot without
``ha``) has every running guest counted — :attr:`Headroom.assumed` says so.

Cases: every ``k``-subset of the online nodes while there are at most :data:`MAX_CASES`; beyond
that the first :data:`MAX_CASES` in the order of the nodes' HA memory, heaviest first (the worst
cases come first), and :attr:`Headroom.exhaustive` is false. Pure and deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, get_args

from opendrs.model.cluster import Cluster, Guest, Move

from .constraints import movability
from .placement import PlacementState, place_biggest_first
from .usage import loaded_nodes

__all__ = [
    "MAX_CASES",
    "RECOVERIES",
    "FailoverRecovery",
    "FailureCase",
    "Headroom",
    "failover_headroom",
    "guests_phrase",
    "ha_guests",
    "nodes_phrase",
]

#: The most failure cases checked: every ``k``-subset of the online nodes up to this many.
MAX_CASES: Final = 64

#: How the HA guests of the failed nodes are restarted (the module docstring).
FailoverRecovery = Literal["best-fit", "pve-basic", "pve-static"]
RECOVERIES: Final[tuple[FailoverRecovery, ...]] = get_args(FailoverRecovery)


@dataclass(frozen=True, slots=True)
class FailureCase:
    """What happens when ``failed`` fail: the restarts made and the guests that cannot restart."""

    failed: tuple[str, ...]
    #: HA guests that ran on the failed nodes.
    ha_guests: int
    restarts: tuple[Move, ...]
    #: (guest id, why) of each HA guest that cannot restart.
    stranded: tuple[tuple[str, str], ...]
    #: The surviving node with the highest memory load after the restarts, and that load (0–1+).
    worst_node: str | None
    worst_memory: float
    #: Of ``stranded``, the guests that may not restart elsewhere at all, whatever the placement
    #: (an ignore rule, local disks, local devices): no move gives them a node.
    held: frozenset[str] = frozenset()

    @property
    def covered(self) -> bool:
        return not self.stranded

    def as_dict(self) -> dict[str, Any]:
        return {
            "failed": list(self.failed),
            "ha_guests": self.ha_guests,
            "covered": self.covered,
            "restarts": [
                {"guest": m.guest, "from": m.source, "to": m.target} for m in self.restarts
            ],
            "stranded": [
                {"guest": g, "reason": r, "held": g in self.held} for g, r in self.stranded
            ],
            "worst_node": self.worst_node,
            "worst_memory": self.worst_memory,
        }


@dataclass(frozen=True, slots=True)
class Headroom:
    """The failover headroom of a cluster for ``failures`` nodes failing at once."""

    failures: int
    cases: tuple[FailureCase, ...]
    #: Every ``failures``-subset of the online nodes was checked (not cut at :data:`MAX_CASES`).
    exhaustive: bool
    #: No guest is marked HA-managed: every running guest was counted as one.
    assumed: bool
    #: The HA guests of the cluster (that run).
    ha_total: int

    @property
    def ok(self) -> bool:
        """Every case restarts every HA guest."""
        return all(case.covered for case in self.cases)

    @property
    def unrestartable(self) -> int:
        """The HA guests that cannot restart in the worst case."""
        return max((len(case.stranded) for case in self.cases), default=0)

    @property
    def shortfall(self) -> tuple[int, int]:
        """How far the placement is from the headroom: the worst case's stranded guests, then
        the stranded guests of every case together, leaving out those no placement gives a node
        (:attr:`FailureCase.held`); lower is better, (0, 0) when no move could do more."""
        counts = [len(case.stranded) - len(case.held) for case in self.cases]
        return max(counts, default=0), sum(counts)

    def summary(self) -> str:
        """``failover headroom: yes, for any 1 node failing (41 HA guests)``, or ``failover
        headroom: no, 3 HA guests cannot restart when pve2 fails`` (the worst case)."""
        nodes = f"{self.failures} node{'' if self.failures == 1 else 's'} failing"
        if self.ok:
            return f"failover headroom: yes, for any {nodes} ({guests_phrase(self.ha_total)})"
        worst = max(self.cases, key=lambda c: len(c.stranded))
        verb = "fails" if len(worst.failed) == 1 else "fail"
        return (
            f"failover headroom: no, {guests_phrase(self.unrestartable)} cannot restart when "
            f"{nodes_phrase(worst.failed)} {verb}"
        )

    def brief(self) -> dict[str, Any]:
        """What status shows: the verdict, and the guests each failure leaves down."""
        return {
            "summary": self.summary(),
            "failures": self.failures,
            "ok": self.ok,
            "unrestartable": self.unrestartable,
            "ha_guests": self.ha_total,
            "assumed_ha": self.assumed,
            "exhaustive": self.exhaustive,
            "stranded": [
                {"failed": list(case.failed), "guests": [g for g, _why in case.stranded]}
                for case in self.cases
                if case.stranded
            ],
        }

    def as_dict(self) -> dict[str, Any]:
        """``opendrs headroom --format json``: :meth:`brief` and every case in full."""
        return {**self.brief(), "cases": [case.as_dict() for case in self.cases]}


def nodes_phrase(failed: Sequence[str]) -> str:
    """``pve1``, ``pve1 and pve2``, ``pve1, pve2 and pve3``."""
    return failed[0] if len(failed) == 1 else " and ".join((", ".join(failed[:-1]), failed[-1]))


def guests_phrase(count: int) -> str:
    """``1 HA guest``, ``3 HA guests``."""
    return f"{count} HA guest{'' if count == 1 else 's'}"


def ha_guests(cluster: Cluster) -> tuple[tuple[Guest, ...], bool]:
    """The running HA guests of ``cluster``, and whether they are assumed (none is marked HA:
    every running guest is counted)."""
    running = tuple(g for g in cluster.guests if loaded_nodes(g))
    marked = tuple(g for g in running if g.ha)
    if any(g.ha for g in cluster.guests):
        return marked, False
    return running, True


def failover_headroom(
    cluster: Cluster, failures: int = 1, recovery: FailoverRecovery = "best-fit"
) -> Headroom:
    """Whether every HA guest restarts when any ``failures`` online nodes fail, restarted as
    ``recovery`` places them (see the module docstring). Raises ValueError when ``failures`` is
    not between 1 and the online nodes less one."""
    online = [n.name for n in cluster.nodes if n.online]
    if not 1 <= failures < len(online):
        raise ValueError(
            f"failures: {failures} of {len(online)} online nodes: at least 1 and fewer than the "
            "online nodes"
        )
    guests, assumed = ha_guests(cluster)
    counted = frozenset(g.id for g in guests)
    memory = {name: 0 for name in online}
    for guest in guests:
        if guest.node in memory:
            memory[guest.node] += guest.memory
    heaviest = sorted(online, key=lambda name: (-memory[name], name))
    exhaustive = math.comb(len(online), failures) <= MAX_CASES
    subsets = itertools.islice(itertools.combinations(heaviest, failures), MAX_CASES)
    fail = _fail if recovery == "best-fit" else _platform_fail
    cases = tuple(
        fail(cluster, tuple(sorted(failed, key=cluster.node_index.__getitem__)), counted, recovery)
        for failed in subsets
    )
    return Headroom(failures, cases, exhaustive, assumed, len(guests))


def _fail(
    cluster: Cluster, failed: Sequence[str], counted: frozenset[str], _recovery: str
) -> FailureCase:
    """The restarts of the ``counted`` guests of the ``failed`` nodes elsewhere (best-fit)."""
    down = frozenset(failed)
    nodes = tuple(replace(n, online=False) if n.name in down else n for n in cluster.nodes)
    broken = replace(cluster, nodes=nodes)
    state = PlacementState.build(broken)
    index = broken.node_index
    failed_index = [index[name] for name in failed]
    on_failed = [
        j
        for j, g in enumerate(broken.guests)
        if g.id in counted and int(state.assign[j]) in failed_index
    ]
    restarts, stranded = place_biggest_first(state, on_failed, "recover")
    worst_node, worst_memory = _worst(broken, state, down)
    # Only the guests of the failed nodes: a guest's bundle may hold a partner elsewhere.
    restarting = frozenset(broken.guests[j].id for j in on_failed)
    stranded = tuple((g, why) for g, why in stranded if g in restarting)
    index = broken.guest_index
    held = frozenset(
        g for g, _why in stranded if movability(broken.guests[index[g]], broken, "recover")
    )
    return FailureCase(
        tuple(failed), len(on_failed), restarts, stranded, worst_node, worst_memory, held
    )


def _platform_fail(
    cluster: Cluster, failed: Sequence[str], counted: frozenset[str], recovery: str
) -> FailureCase:
    """The restarts of the HA guests of the ``failed`` nodes as Proxmox VE's HA manager makes
    them in the scheduler mode of ``recovery`` (``pve-basic``, ``pve-static``)."""
    from opendrs.compat.pve.recovery import recover_nodes  # compat builds on this module

    mode = "static" if recovery == "pve-static" else "basic"
    done = recover_nodes(cluster, failed, mode)
    down = frozenset(failed)
    broken = replace(
        cluster.with_placement({m.guest: m.target for m in done.restarts}),
        nodes=tuple(replace(n, online=False) if n.name in down else n for n in cluster.nodes),
    )
    worst_node, worst_memory = _worst(broken, PlacementState.build(broken), down)
    index = cluster.guest_index
    held = tuple(
        (g, str(movability(cluster.guests[index[g]], broken, "recover"))) for g in done.held
    )
    return FailureCase(
        tuple(failed),
        done.ha_guests,
        done.restarts,
        (*done.stranded, *held),
        worst_node,
        worst_memory,
        frozenset(done.held),
    )


def _worst(
    broken: Cluster, state: PlacementState, down: frozenset[str]
) -> tuple[str | None, float]:
    """The surviving node with the highest memory load in ``state``, and that load."""
    worst_node, worst_memory = None, 0.0
    capacity = state.loads.capacity
    index = broken.node_index
    for node in broken.nodes:
        n = index[node.name]
        if node.name in down or not node.usable or capacity[n, 1] <= 0:
            continue
        load = float(state.node_load[n, 1] / capacity[n, 1])
        if worst_node is None or load > worst_memory:
            worst_node, worst_memory = node.name, load
    return worst_node, worst_memory
