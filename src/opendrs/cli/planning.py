"""A plan for a snapshot as ``opendrs plan`` makes it: the proposal, its ordered steps, what a
repair leaves stuck, the imbalance per CPU architecture and the lower bounds.

``opendrs plan`` prints it (text, or :meth:`PlanResult.as_dict` as JSON) and ``opendrs report``
draws it: both read one :class:`PlanResult`, computed once by :func:`make_plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from opendrs.engine import blas
from opendrs.engine.bounds import LowerBounds, migration_lower_bound
from opendrs.engine.constraints import Constraints
from opendrs.engine.imbalance import Imbalance
from opendrs.engine.planner import Plan, plan_with_retries
from opendrs.engine.policy import Repair, may_need_repair, repair, stuck_after, warn_stuck
from opendrs.engine.strategies.base import (
    Proposal,
    Request,
    Stop,
    StrategyInfo,
    StrategyOptions,
    imbalance_by_arch,
    worst_spreads,
)
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster
from opendrs.model.rules import Rules

__all__ = ["PlanResult", "make_plan", "rules_document"]


@dataclass(frozen=True)
class PlanResult:
    """What ``opendrs plan`` computes for one snapshot and one strategy."""

    cluster: Cluster
    #: The cluster once every proposed move is made.
    placed: Cluster
    constraints: Constraints
    proposal: Proposal
    plan: Plan
    #: Guests the plan leaves breaking a hard rule, with why (the daemon's repair check).
    stuck: tuple[tuple[str, str], ...]
    #: Imbalance per CPU architecture before and after (empty with a single architecture).
    by_arch: tuple[Mapping[str, Imbalance], Mapping[str, Imbalance]]
    #: The spread reached per resource (of the worst architecture where there are several).
    achieved: Mapping[str, float]
    bounds: LowerBounds

    @property
    def infeasible(self) -> bool:
        """The strategy's solver found no feasible placement."""
        return self.proposal.options.get("solver", {}).get("status") == "INFEASIBLE"

    @property
    def ok(self) -> bool:
        """Everything reached safely: no infeasible solver, nothing stuck, a feasible plan."""
        return not self.infeasible and not self.stuck and self.plan.feasible

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of ``opendrs plan --format json``."""
        data = self.proposal.as_dict()
        data["moves"] = [m.as_dict() for m in self.plan.moves]
        data["proposed"] = [m.as_dict() for m in self.proposal.moves]
        data["plan"] = {
            "feasible": self.plan.feasible,
            "steps": self.plan.steps,
            "unreachable": [list(u) for u in self.plan.unreachable],
            "problems": list(self.plan.problems),
        }
        data["bounds"] = self.bounds.as_dict()
        before, after = self.by_arch
        if before:
            data["metrics"]["by_arch"] = {
                arch: {"before": imbalance.as_dict(), "after": after[arch].as_dict()}
                for arch, imbalance in before.items()
            }
        data["stuck"] = [{"guest": g, "reason": r} for g, r in self.stuck]
        data["rules"] = rules_document(self.cluster.rules)
        return data


def make_plan(
    cluster: Cluster,
    strategy: StrategyInfo,
    options: StrategyOptions,
    *,
    max_parallel: int | None,
    max_node_inflow: int | None,
) -> PlanResult:
    """Propose with ``strategy`` (its typed ``options``), order the moves into safe steps
    (asking the strategy again without what cannot be ordered), check what a repair leaves
    stuck (warned in the log) and measure the result against the lower bounds. The rules are
    checked, and the constraints and balance loads built, once for all of it."""

    def propose(forbidden: frozenset[tuple[str, str]]) -> Proposal:
        view = CycleView.holding(cluster, constraints=cons, loads=loads)
        return strategy.propose(view, Request(forbidden=forbidden), options)

    with blas.one_thread():  # the engine's products, the bounds' included (engine/blas.py)
        first = CycleView(cluster)
        cons, loads = first.constraints, first.loads
        return _planned(
            cluster, (cons, loads), strategy.name, propose, max_parallel, max_node_inflow
        )


def _planned(
    cluster: Cluster,
    models: tuple[Constraints, LoadModel],
    name: str,
    propose: Callable[[frozenset[tuple[str, str]]], Proposal],
    max_parallel: int | None,
    max_node_inflow: int | None,
) -> PlanResult:
    """:func:`make_plan`'s work, on one BLAS thread, on the constraints and balance loads
    (``models``) of ``cluster``."""
    cons, loads = models
    screen = may_need_repair(cluster)
    fixed = (
        repair(
            cluster, constraints=cons, max_parallel=max_parallel, max_node_inflow=max_node_inflow
        )
        if screen
        else Repair(())
    )
    if fixed.proposal is not None and fixed.plan is not None and fixed.plan.moves:
        # As the daemon decides, whatever its strategy: a repair that moves something first.
        stopped = (
            f"{fixed.proposal.stopped}, as the daemon makes them first with any strategy: "
            f"{name} is asked once nothing that may move breaks a hard constraint"
        )
        stop = Stop("repairs_only", {"strategy": name})
        proposal = replace(fixed.proposal, strategy="repair", stopped=stopped, stop=stop)
        plan, stuck = fixed.plan, fixed.stuck
    else:
        proposal, plan = plan_with_retries(
            cluster,
            propose,
            max_parallel=max_parallel,
            max_node_inflow=max_node_inflow,
            constraints=cons,
        )
        stuck = stuck_after(cluster, cons, proposal, plan) if screen else ()
    warn_stuck(stuck)
    placed = cluster.with_placement(proposal.placement)
    by_arch = (imbalance_by_arch(cluster), imbalance_by_arch(placed))
    worst = worst_spreads(proposal.after, by_arch[1])
    achieved = {r: worst[r] for r in RESOURCES}
    return PlanResult(
        cluster=cluster,
        placed=placed,
        constraints=cons,
        proposal=proposal,
        plan=plan,
        stuck=stuck,
        by_arch=by_arch,
        achieved=achieved,
        bounds=migration_lower_bound(cluster, achieved, loads, kept=cons.rules),
    )


def rules_document(rules: Rules) -> dict[str, Any]:
    """The rules of a plan's cluster, each with its origin (a plan's JSON and report)."""
    return {
        "node_affinity": [
            {
                "name": r.name,
                "guests": list(r.guests),
                "nodes": _nodes_of(r.nodes),
                "strict": r.strict,
                "origin": r.origin,
            }
            for r in rules.node_affinity
        ],
        "guest_affinity": [
            {
                "name": r.name,
                "guests": list(r.guests),
                "together": r.positive,
                "hard": r.hard,
                "origin": r.origin,
            }
            for r in rules.guest_affinity
        ],
        "ignored": sorted(rules.ignored),
    }


def _nodes_of(priorities: Mapping[str, int]) -> list[str]:
    """A node affinity's nodes, each with its priority where they are not all the same."""
    if len(set(priorities.values())) <= 1:
        return list(priorities)
    return [f"{node} (priority {priority})" for node, priority in priorities.items()]
