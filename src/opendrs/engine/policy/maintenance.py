"""Guests evacuated for maintenance: who left which node, and the migrations that take them back
when it leaves maintenance (``maintenance_return``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from opendrs.engine.constraints import current_assign, movability
from opendrs.engine.planner import Plan, final_placement, plan_moves
from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.policy.metrics import measure
from opendrs.engine.policy.state import PastMigrations
from opendrs.engine.strategies.base import (
    Proposal,
    ProposedMove,
    Stop,
    cluster_imbalance,
    migration_cost,
)
from opendrs.engine.usage import LoadModel
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster


def track_evacuations(cluster: Cluster, evacuated: Mapping[str, str]) -> dict[str, str]:
    """``evacuated`` (guest id → the node it was on in maintenance) brought up to date.

    A guest on an online node in maintenance is added with that node, unless it has an entry
    already (evacuated twice, it still belongs to the first node); an entry goes when its guest or
    node is gone, or when the guest is on its node again and the node is out of maintenance.
    """
    nodes, node_index, guest_index = cluster.nodes, cluster.node_index, cluster.guest_index
    out: dict[str, str] = {}
    for guest_id, name in evacuated.items():
        j, n = guest_index.get(guest_id), node_index.get(name)
        if j is None or n is None:
            continue
        if cluster.guests[j].node == name and not nodes[n].maintenance:
            continue
        out[guest_id] = name
    held = {n.name for n in nodes if n.maintenance and n.online}
    if held:
        for guest in cluster.guests:
            if guest.node in held and guest.id not in out:
                out[guest.id] = guest.node
    return out


def returns_from_maintenance(
    view: CycleView,
    evacuated: Mapping[str, str],
    now: float,
    config: PolicyConfig,
    past: PastMigrations,
    metric: float,
) -> tuple[Proposal, Plan, float] | None:
    """The migrations that take the evacuated guests of ``view``'s cluster back to their nodes
    out of maintenance, with the ``config.metric`` predicted after them (``metric``: its value
    now), planned on the view's constraints and measured on its usage.

    A guest goes back when its node is usable, it is elsewhere and not migrating, it may move, its
    architecture and strict rules allow the node, and no failed migration keeps it off the node
    (``past.avoid``); cooldown and no-return do not hold it back (going back is the point).
    At most ``batch`` of them, in guest order; the planner orders them and leaves out any that
    would overload a node or break a hard rule. None when nobody goes back.
    """
    cluster, cons = view.observed, view.constraints
    nodes, node_index, guest_index = cluster.nodes, cluster.node_index, cluster.guest_index
    targets: dict[str, str] = {}
    for guest_id, name in sorted(evacuated.items()):
        j, n = guest_index[guest_id], node_index[name]
        guest = cluster.guests[j]
        if (
            not nodes[n].usable
            or guest.node == name
            or guest.migrating_to is not None
            or movability(guest, cluster, "balance") is not None
            or not (cons.arch_ok[j, n] and cons.strict_ok[j, n])
            or past.avoid.get((guest_id, name), -math.inf) > now
        ):
            continue
        targets[guest_id] = name
        if 0 < config.batch <= len(targets):
            break
    if not targets:
        return None
    plan = plan_moves(
        cluster,
        targets,
        max_parallel=config.max_parallel,
        max_node_inflow=config.max_node_inflow,
        constraints=cons,
    )
    if not plan.moves:
        return None
    proposal, metric_after = planned_proposal(
        view,
        plan,
        config.metric,
        metric,
        ("maintenance-return", "back from maintenance", "evacuated guests back on their nodes"),
        Stop("returned", {"migrations": len(plan.moves)}),
    )
    return proposal, plan, metric_after


def planned_proposal(
    view: CycleView,
    plan: Plan,
    metric_name: str,
    metric: float,
    said: tuple[str, str, str],
    stop: Stop,
) -> tuple[Proposal, float]:
    """The proposal of a plan the policy made itself (not a strategy's), with the metric
    ``metric_name`` predicted after it (``metric``: its value now) on the view's usage; ``said``
    is the proposal's strategy name, each move's reason and where it stopped, ``stop`` the
    stop as a code."""
    cluster = view.observed
    node_index, guest_index = cluster.node_index, cluster.guest_index
    strategy, reason, stopped = said
    assign = current_assign(cluster)
    before = cluster_imbalance(cluster, None, view.loads)
    for move in plan.moves:
        assign[guest_index[move.guest]] = node_index[move.target]
    moved = cluster.with_placement(final_placement(plan.moves))
    moved_loads = LoadModel.build(moved, usage=view.average)
    metric_after = measure(moved, metric_name, moved_loads)
    moves = tuple(
        ProposedMove(
            guest=move.guest,
            source=move.source,
            target=move.target,
            metric=metric_name,
            before=metric,
            after=metric_after,
            cost=migration_cost(cluster.guests[guest_index[move.guest]], cluster.settings),
            reason=reason,
        )
        for move in plan.moves
    )
    proposal = Proposal(
        strategy=strategy,
        moves=moves,
        before=before,
        after=cluster_imbalance(cluster, assign, view.loads),
        stopped=stopped,
        stop=stop,
    )
    return proposal, metric_after
