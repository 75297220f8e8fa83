"""``policy.keep_failover: K``: balancing keeps the failover headroom — every HA guest restarts
if any ``K`` nodes fail (:mod:`opendrs.engine.headroom`) — and a cluster without it is repaired
toward it.

* A balancing plan that would leave the cluster further from the headroom than it is (more HA
  guests stranded in the worst failure, or as many there and more in all failures together) is
  refused (:func:`failover_after`).
* A cluster short of it is repaired where moves give it back (:func:`failover_repair`): greedily,
  at most :data:`REPAIR_MOVES` migrations a decision, each the one move that brings the cluster
  closest to the headroom among those of the :data:`CANDIDATES` biggest HA guests of the worst
  failure's nodes (spreading what must restart) and of the biggest running guest of each of the
  :data:`CANDIDATES` other nodes with the most free memory (making room where it can restart)
  — guests that may move —, each to its :data:`TARGETS` best nodes (the guards and hard rules
  allowing); it stops when no such move helps. When none helps, :func:`failover_blocked` says
  which HA guests cannot restart when which nodes fail, and what keeps the moves off: the hot
  level (the moves that would help fill a node above it) or every move being ruled out.

The headroom is judged by ``recovery`` (``policy.failover_recovery``, resolved for the cluster
by :func:`recovery_for`): the placement engine's best fit, or Proxmox VE's HA manager in its
``basic`` or ``static`` scheduler mode (:data:`~opendrs.engine.headroom.RECOVERIES`).

The check costs a placement per HA guest per failure case, so it is kept
(:class:`~opendrs.engine.policy.state.FailoverCheck` in the policy's state) and made again only
when the placement or a node's state changes, or after :data:`RECHECK` seconds (usage moves
capacity in dynamic mode); after a repair that found nothing, none is tried for
:data:`REPAIR_RETRY` seconds, whatever changes. Pure and deterministic.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

import numpy as np

from opendrs.engine.constraints import movability
from opendrs.engine.headroom import FailoverRecovery, Headroom, failover_headroom, ha_guests
from opendrs.engine.placement import PlacementState
from opendrs.engine.planner import Plan, final_placement
from opendrs.engine.policy.state import FailoverCheck
from opendrs.engine.strategies.base import Stop
from opendrs.engine.usage import loaded_nodes
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster

__all__ = [
    "CANDIDATES",
    "RECHECK",
    "REPAIR_MOVES",
    "REPAIR_RETRY",
    "TARGETS",
    "check_failover",
    "failover_after",
    "failover_blocked",
    "failover_repair",
    "placement_key",
    "recovery_for",
]

#: Most migrations one failover repair makes.
REPAIR_MOVES: Final = 4
#: Guests tried per repair move: the biggest HA guests of the worst failure's nodes, and the
#: biggest guest of as many other nodes (those with the most free memory).
CANDIDATES: Final = 3
#: Best nodes (by the placement engine's score) tried for each of them.
TARGETS: Final = 3
#: Seconds after which a kept check is made again although the placement is the same.
RECHECK: Final = 3600
#: Seconds after a repair that found no move before the next is searched for, whatever changes.
REPAIR_RETRY: Final = 6 * 3600


def placement_key(cluster: Cluster) -> tuple[object, ...]:
    """What the headroom depends on besides usage: where each guest is and runs, and each
    node's state."""
    return (
        tuple((g.id, g.node, g.state, g.ha_state) for g in cluster.guests),
        tuple((n.name, n.online, n.maintenance) for n in cluster.nodes),
    )


def recovery_for(setting: str, cluster: Cluster) -> FailoverRecovery:
    """The recovery ``policy.failover_recovery`` names for ``cluster``: ``auto`` is Proxmox VE's
    HA manager in the scheduler mode the backend read or the snapshot kept
    (:attr:`Cluster.ha_scheduler`), else ``best-fit``; any other value is itself."""
    if setting == "pve-basic" or (setting == "auto" and cluster.ha_scheduler == "basic"):
        return "pve-basic"
    if setting == "pve-static" or (setting == "auto" and cluster.ha_scheduler == "static"):
        return "pve-static"
    return "best-fit"


def _key(cluster: Cluster, recovery: FailoverRecovery) -> tuple[object, ...]:
    return (*placement_key(cluster), recovery)


def _possible(cluster: Cluster, failures: int) -> bool:
    return 1 <= failures < sum(1 for n in cluster.nodes if n.online)


def _record(
    cluster: Cluster, headroom: Headroom, now: float, recovery: FailoverRecovery
) -> FailoverCheck:
    return FailoverCheck(
        _key(cluster, recovery),
        now,
        headroom.failures,
        headroom.shortfall,
        headroom.summary(),
        headroom.unrestartable,
        headroom.ha_total,
    )


def check_failover(
    cluster: Cluster,
    failures: int,
    now: float,
    kept: FailoverCheck | None = None,
    recovery: FailoverRecovery = "best-fit",
) -> FailoverCheck | None:
    """The headroom of ``cluster`` for ``failures`` nodes failing, by ``recovery``: ``kept``
    when it checked the same placement for as many failures by the same recovery less than
    :data:`RECHECK` seconds before ``now``, else checked now (keeping when and why a repair
    last found nothing). None when the cluster has too few online nodes to lose that many."""
    if not _possible(cluster, failures):
        return None
    if (
        kept is not None
        and kept.failures == failures
        and now - kept.at < RECHECK
        and kept.key == _key(cluster, recovery)
    ):
        return kept
    check = _record(cluster, failover_headroom(cluster, failures, recovery), now, recovery)
    if kept is None:
        return check
    return replace(check, repair_tried=kept.repair_tried, repair_blocked=kept.repair_blocked)


def failover_after(
    cluster: Cluster,
    plan: Plan,
    failures: int,
    now: float,
    recovery: FailoverRecovery = "best-fit",
) -> FailoverCheck:
    """The headroom once ``plan`` has run: a balancing plan whose shortfall is more than the
    cluster's now is refused, a repair whose shortfall is not less is not made."""
    moved = cluster.with_placement(final_placement(plan.moves))
    return _record(moved, failover_headroom(moved, failures, recovery), now, recovery)


def failover_repair(
    view: CycleView,
    failures: int,
    now: float,
    most: int,
    recovery: FailoverRecovery = "best-fit",
) -> tuple[dict[str, str], FailoverCheck] | None:
    """Target nodes (guest id → node) that bring the view's cluster closer to the headroom, and
    the headroom they reach; None when no move (of those tried, see the module docstring) does.
    At most ``min(most, REPAIR_MOVES)`` migrations (``most`` 0: :data:`REPAIR_MOVES`)."""
    cluster = view.observed
    limit = REPAIR_MOVES if most <= 0 else min(most, REPAIR_MOVES)
    state = PlacementState.build(
        cluster, constraints=view.constraints.forbidding(view.forbidden), loads=view.loads
    )
    current = failover_headroom(cluster, failures, recovery)
    targets: dict[str, str] = {}
    while len(targets) < limit and current.shortfall > (0, 0):
        found = _best_move(cluster, state, current, targets, limit - len(targets), recovery)
        if found is None:
            break
        members, target, current = found
        state.commit(members, target)
        for m in members.tolist():
            targets[cluster.guests[m].id] = cluster.nodes[target].name
    if not targets:
        return None
    moved = cluster.with_placement(targets)
    return targets, _record(moved, current, now, recovery)


def failover_blocked(
    view: CycleView,
    failures: int,
    now: float,
    recovery: FailoverRecovery = "best-fit",
    *,
    lifted: bool = True,
) -> Stop:
    """Why :func:`failover_repair` found no move: a ``failover_short`` stop naming the HA
    ``guests`` (ids, space-separated) that cannot restart when the ``failed`` nodes fail (the
    worst case), its part what keeps the moves off — ``hot_level`` (the ``nodes`` the moves that
    would give it back fill above the ``hot`` level, a share) when the repair, the hot level
    lifted, finds one (tried only with ``lifted``); else ``no_helping_move`` — judged by
    ``recovery``."""
    cases = failover_headroom(view.observed, failures, recovery).cases
    worst = max(cases, key=lambda c: len(c.stranded))
    details = {
        "guests": " ".join(g for g, _why in worst.stranded),
        "failed": " ".join(worst.failed),
    }
    found = (
        None
        if view.hot is None or not lifted
        else failover_repair(view.without_hot(), failures, now, 0, recovery)
    )
    if view.hot is None or found is None:
        return Stop("failover_short", details, (Stop("no_helping_move"),))
    nodes = " ".join(sorted(set(found[0].values())))
    return Stop("failover_short", details, (Stop("hot_level", {"nodes": nodes, "hot": view.hot}),))


def _best_move(
    cluster: Cluster,
    state: PlacementState,
    current: Headroom,
    targets: dict[str, str],
    room: int,
    recovery: FailoverRecovery,
) -> tuple[np.ndarray, int, Headroom] | None:
    """The move of one of the biggest HA guests of the worst failure's nodes that brings the
    cluster closest to the headroom (bundles whole, at most ``room`` guests), and the headroom
    after it; None when none brings it closer."""
    worst = max(current.cases, key=lambda c: len(c.stranded))
    counted = {g.id for g in ha_guests(cluster)[0]}
    failed = {cluster.node_index[name] for name in worst.failed}
    biggest = sorted(
        (
            j
            for j, g in enumerate(cluster.guests)
            if g.id not in targets and loaded_nodes(g) and movability(g, cluster) is None
        ),
        key=lambda j: (-cluster.guests[j].memory, cluster.guests[j].id),
    )
    leaving = [j for j in biggest if cluster.guests[j].id in counted and state.assign[j] in failed]
    # Room is made on the surviving nodes with the most free memory: the biggest guest of each.
    free = state.constraints.capacity.limit[:, 1] - state.committed[:, 1]
    survivors = [n for n in np.argsort(-free, kind="stable").tolist() if n not in failed]
    making_room = [
        next((j for j in biggest if state.assign[j] == n), None) for n in survivors[:CANDIDATES]
    ]
    candidates = leaving[:CANDIDATES] + [j for j in making_room if j is not None]
    best: tuple[np.ndarray, int, Headroom] | None = None
    for j in candidates:
        placement = state.place(j, "balance")
        members = state.bundle(j)
        if placement.blocked is not None or len(members) > room:
            continue
        here = int(state.assign[j])
        nodes = [s.node for s in placement.ranking if s.node != cluster.nodes[here].name]
        for name in nodes[:TARGETS]:
            trial = dict(targets)
            trial.update((cluster.guests[m].id, name) for m in members.tolist())
            after = failover_headroom(cluster.with_placement(trial), current.failures, recovery)
            if after.shortfall < (best[2] if best else current).shortfall:
                best = (members, cluster.node_index[name], after)
                if after.shortfall == (0, 0):
                    return best
    return best
