"""A proposal made into a plan the guards allow: cut to the batch (bundles whole) and ordered by
the planner, no planned move (parking included) on a forbidden placement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from opendrs.engine.constraints import Constraints, current_assign
from opendrs.engine.planner import Plan, plan_moves, plan_with_retries
from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.strategies.base import (
    Proposal,
    Stop,
    cluster_imbalance,
)
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import Cluster


def truncate(
    cluster: Cluster,
    proposal: Proposal,
    batch: int,
    constraints: Constraints | None = None,
    loads: LoadModel | None = None,
    limit: str = "batch",
) -> Proposal:
    """``proposal`` cut to at most ``batch`` migrations (``batch`` 0: unchanged); ``limit`` names
    what sets that number in the stop sentence (the policy's ``batch``, or its ``budget``).

    Migrations are taken in proposal order, one *unit* at a time — a guest, or the members of a
    hard-affinity bundle that go to the same node, which stay whole; a unit that does not fit in
    what is left of the batch is skipped. The cut proposal's predicted figures are recomputed
    (on ``loads``, the cluster's :class:`LoadModel`, when it is built already).
    """
    net = proposal.net_moves()
    if batch <= 0 or len(net) <= batch:
        return proposal
    cons = constraints if constraints is not None else Constraints.build(cluster)
    order = {m.guest: i for i, m in reversed(list(enumerate(proposal.moves)))}
    gidx = cluster.guest_index
    units: dict[tuple[int, str], list[str]] = {}
    for move in sorted(net, key=lambda m: order[m.guest]):
        j = gidx[move.guest]
        key = (cons.unit_of(j), move.target)
        units.setdefault(key, []).append(move.guest)
    kept: set[str] = set()
    for members in units.values():
        if len(kept) + len(members) <= batch:
            kept.update(members)
    moves = tuple(m for m in proposal.moves if m.guest in kept)
    assign = current_assign(cluster)
    for m in net:
        if m.guest in kept:
            assign[gidx[m.guest]] = cluster.node_index[m.target]
    stopped = f"{proposal.stopped}; cut to {len(kept)} of {len(net)} migrations ({limit} {batch})"
    after = cluster_imbalance(cluster, assign, loads)
    figures: dict[str, float | str] = {"kept": len(kept), "proposed": len(net)}
    # The strategy's own stop is kept as the part the cut followed.
    cause = () if proposal.stop is None else (proposal.stop,)
    stop = Stop("batch_cut", figures | {"limit": limit, "batch": batch}, cause)
    return replace(proposal, moves=moves, after=after, stopped=stopped, stop=stop)


class Limits(NamedTuple):
    """The executor limits a plan is made for (None: the cluster's settings)."""

    max_parallel: int | None
    max_node_inflow: int | None


def plan_within(
    cluster: Cluster,
    propose: Callable[[frozenset[tuple[str, str]]], Proposal],
    forbidden: frozenset[tuple[str, str]],
    config: PolicyConfig | Limits,
    cons: Constraints,
) -> tuple[Proposal, Plan]:
    """Propose and plan; then keep every planned move (parking included) off ``forbidden``."""

    def ask(more: frozenset[tuple[str, str]]) -> Proposal:
        return propose(forbidden | more)

    proposal, plan = plan_with_retries(
        cluster,
        ask,
        max_parallel=config.max_parallel,
        max_node_inflow=config.max_node_inflow,
        constraints=cons,
    )
    dropped: set[str] = set()
    while True:
        bad = sorted({m.guest for m in plan.moves if (m.guest, m.target) in forbidden})
        if not bad:
            break
        dropped.update(bad)
        target = {m.guest: m.target for m in proposal.net_moves() if m.guest not in dropped}
        plan = plan_moves(
            cluster,
            target,
            max_parallel=config.max_parallel,
            max_node_inflow=config.max_node_inflow,
            constraints=cons,
        )
    if dropped:
        note = (
            "Left out " + ", ".join(sorted(dropped)) + ": their only safe order parks them on a "
            "node the policy forbids."
        )
        plan = replace(plan, feasible=False, problems=(*plan.problems, note))
    return proposal, plan
