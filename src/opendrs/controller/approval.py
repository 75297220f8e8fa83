"""Manual mode's checks: whether a proposal still holds on a fresh observation.

A proposal waits for an operator while the cluster goes on changing. Before an approved
proposal starts, :func:`recheck` tests it against the observation of the cycle that takes it:
each approved move's guest still on its source and not migrating, its target still a usable node
the guards allow (cooldown, minimum uptime, no-return, failed targets), the placement after the
moves breaking no hard rule and overloading no node that the placement before did not, a safe
order of the moves (the planner's: capacity on the way, transit counted twice), and — for a
balancing proposal — the imbalance:

* all its moves approved: the imbalance metric still lower after them than now (it was when the
  proposal was made);
* some of them chosen by the operator: neither the metric nor the load's capacity-weighted σ
  (:func:`~opendrs.engine.policy.metrics.load_sigma`) higher after them than now, beyond
  :data:`ROUNDING`. A part often leaves the busiest and the idlest node alone, so a spread does
  not change; the σ does, and says whether the part evens the load or makes it worse.

With ``policy.keep_failover``, moves that bring the cluster closer to the failover headroom pass
the imbalance check either way (the repair toward the headroom is balancing-kind: it may well
raise the imbalance). What fails is the reason the proposal expires, each as true of the fresh
observation. :func:`still_placed` is the cheap part, run on every open proposal each cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np

from opendrs.controller.proposals import ProposalRecord, ProposedMove
from opendrs.engine.constraints.constraint_set import Constraints, current_assign
from opendrs.engine.headroom import failover_headroom
from opendrs.engine.planner import Plan, plan_moves
from opendrs.engine.policy.failover import recovery_for
from opendrs.engine.policy.metrics import format_metric, load_sigma, measure
from opendrs.model.cluster import Cluster

__all__ = ["ROUNDING", "Recheck", "recheck", "still_placed"]

#: How much a figure may differ from another and still count as equal: a float's rounding, no
#: more (both are measured on the same observation, so nothing else moves them).
ROUNDING: Final = 1e-9


@dataclass(frozen=True)
class Recheck:
    """What :func:`recheck` found: the plan to hand to the executor, or why the proposal expired."""

    plan: Plan | None
    problem: str | None = None


def still_placed(
    moves: Iterable[ProposedMove], cluster: Cluster, forbidden: frozenset[tuple[str, str]]
) -> str | None:
    """Why one of ``moves`` can no longer be made on ``cluster`` as proposed, or ``None``."""
    guests, nodes = cluster.guest_index, cluster.node_index
    for move in moves:
        label = move.label()
        if move.guest not in guests:
            return f"{label}: the guest is gone"
        guest = cluster.guests[guests[move.guest]]
        if guest.node != move.source:
            return f"{label}: the guest is on {guest.node} now"
        if guest.migrating_to is not None:
            return f"{label}: the guest is migrating to {guest.migrating_to}"
        if move.target not in nodes or not cluster.nodes[nodes[move.target]].usable:
            return f"{label}: node {move.target} cannot take guests now"
        if (move.guest, move.target) in forbidden:
            return f"{label}: the guards keep the guest off {move.target} now"
    return None


def recheck(
    proposal: ProposalRecord,
    cluster: Cluster,
    metric: str,
    forbidden: frozenset[tuple[str, str]],
    keep_failover: int = 0,
    failover_recovery: str = "auto",
) -> Recheck:
    """The approved moves of ``proposal`` ordered for the executor on ``cluster``, or why they
    may not start (see the module's description). ``metric`` is the policy's imbalance metric;
    ``forbidden`` the placements the policy's guards rule out now; ``keep_failover`` the nodes
    whose failure the policy keeps every HA guest restartable for (0: none), judged by
    ``failover_recovery`` (the policy's setting)."""
    moves = proposal.chosen_moves()
    if not moves:
        return Recheck(None, "no move approved")
    problem = still_placed(moves, cluster, forbidden)
    if problem is not None:
        return Recheck(None, problem)
    constraints = Constraints.build(cluster)
    before = current_assign(cluster)
    after = before.copy()
    for move in moves:
        after[cluster.guest_index[move.guest]] = cluster.node_index[move.target]
    broken = sorted(set(constraints.violations(after)) - set(constraints.violations(before)))
    if broken:
        return Recheck(None, f"the moves would break: {broken[0]}")
    targets = {move.guest: move.target for move in moves}
    plan = plan_moves(cluster, targets, constraints=constraints)
    if plan.unreachable:
        return Recheck(None, plan.problems[0] if plan.problems else "no safe order of the moves")
    if proposal.kind == "balance" and metric != "none":
        partial = len(moves) < len(proposal.moves)
        worse = _imbalance_problem(cluster, metric, after, partial=partial)
        if worse is not None and not _closer_to_failover(
            cluster, targets, keep_failover, failover_recovery
        ):
            nor = "; they would not bring" if partial else " nor bring"
            closer = f"{nor} the failover headroom closer" if keep_failover > 0 else ""
            return Recheck(None, worse + closer)
    return Recheck(plan)


def _imbalance_problem(
    cluster: Cluster, metric: str, after: np.ndarray, *, partial: bool
) -> str | None:
    """Why the placement ``after`` may not start as a balancing proposal's (see the module's
    description), or ``None``: all its moves must lower ``metric``; a part of them, chosen by the
    operator, must raise neither ``metric`` nor the load's σ (beyond :data:`ROUNDING`)."""
    now, then = measure(cluster, metric), measure(cluster, metric, assign=after)
    shown_now, shown_then = format_metric(metric, now), format_metric(metric, then)
    if not partial:
        if then < now - ROUNDING:
            return None
        return f"the moves no longer lower the imbalance ({shown_now} now, {shown_then} after)"
    if then > now + ROUNDING:
        return f"these moves would now raise the imbalance from {shown_now} to {shown_then}"
    sigma_now, sigma_then = load_sigma(cluster), load_sigma(cluster, assign=after)
    if sigma_then > sigma_now + ROUNDING:
        return (
            f"these moves would now spread the load more unevenly: its σ from "
            f"{sigma_now * 100:.1f} pp to {sigma_then * 100:.1f} pp (the imbalance stays "
            f"{shown_then})"
        )
    return None


def _closer_to_failover(
    cluster: Cluster, targets: dict[str, str], failures: int, setting: str
) -> bool:
    """Whether moving guests to ``targets`` brings ``cluster`` closer to the failover headroom
    for ``failures`` nodes failing, judged by the ``failover_recovery`` ``setting`` (fewer HA
    guests stranded in the worst failure, or as many there and fewer in all); False when it is
    not kept (``failures`` 0) or cannot be."""
    if not 1 <= failures < sum(1 for n in cluster.nodes if n.online):
        return False
    recovery = recovery_for(setting, cluster)
    before = failover_headroom(cluster, failures, recovery).shortfall
    after = failover_headroom(cluster.with_placement(targets), failures, recovery)
    return after.shortfall < before
