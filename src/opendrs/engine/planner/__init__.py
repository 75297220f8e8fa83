"""Planner: from the current placement to a target placement, an ordered plan of safe steps.

A strategy says *where* guests should end up; the planner says *in which order* to move them so
that the cluster stays valid the whole way there, and which of the requested placements no safe
order reaches.

The safety model
----------------
A plan is a sequence of **steps**; a step is a set of migrations that run at the same time, and a
step starts only when the previous one has finished.

* **Transit counts twice.** While a guest migrates it loads *both* its source and its target in
  every hard capacity dimension of :class:`~opendrs.engine.usage.CapacityModel` — configured vCPUs
  against cores × overcommit, configured memory, measured use in dynamic mode, and local storage
  pools (local disks occupy both nodes while they are copied). After the step it loads only the
  target. A stopped guest commits only its storage
  (:meth:`~opendrs.engine.constraints.Constraints.guest_demand`).
* **Capacity.** A step is safe when, for every node, what is committed at the start of the step
  plus the demand of the step's migrations into the node stays within every limit (with the
  capacity model's rounding tolerance). A node over a limit therefore receives nothing while it is
  over — it never gets worse — but guests may always leave it.
* **Hard anti-affinity in transit.** A migrating guest occupies both nodes, so no guest moves onto
  a node that a hard negative partner occupies at any moment of the step: a partner that stays
  there, leaves it in the same step, or moves there in the same step. (Guests already migrating
  when the plan starts occupy their migration target as well, throughout.)
* **Static constraints.** Every target — parking spares included — is usable (online, not in
  maintenance), has the guest's CPU architecture and passes its strict node affinity.
* **Limits.** At most ``max_parallel`` migrations per step, at most ``max_node_inflow`` into any
  node per step. The members of a hard-positive bundle that go to the same node move together in
  one step and count as several migrations; a bundle larger than a limit runs alone in its step
  (and the plan says so).

The algorithm
-------------
Each requested placement becomes a **unit** (one guest, or the bundle members sharing a target),
ranked once (:mod:`.scheduler`). The placements that the target state itself cannot hold — hard
negative partners on one node, a node beyond a limit — are given up first (:mod:`.target`). Steps
are then filled in rank order with the units that fit now (:mod:`.scheduler`). When a step can take
nothing, hopeless units are given up and cycles of units waiting for each other are broken by
parking one member on a spare node (:mod:`.parking`). A parked guest whose final move then proves
unreachable is moved back where it came from, if that is safe (else the plan says where it stays).

Same input, same plan: the target mapping is read in sorted order and every choice breaks ties by
rank, node name or guest id.

The modules: :mod:`.plan` (the answer), :mod:`.state` (units, occupancy, queues),
:mod:`.scheduler`, :mod:`.target`, :mod:`.parking`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from opendrs.model.cluster import Cluster

from ..constraints import Constraints
from .plan import Moving, Plan, PlannedMove, final_placement
from .scheduler import Planner

if TYPE_CHECKING:
    from ..strategies.base import Proposal


def plan_moves(
    cluster: Cluster,
    target: Mapping[str, str],
    *,
    max_parallel: int | None = None,
    max_node_inflow: int | None = None,
    constraints: Constraints | None = None,
) -> Plan:
    """Order the migrations from the current placement of ``cluster`` to ``target``.

    ``target`` maps guest ids to the node each should end on; guests not in it, or already on
    their target, do not move. ``max_parallel`` and ``max_node_inflow`` default to the cluster's
    settings. ``constraints`` may pass :class:`Constraints` already built for this cluster (their
    forbidden placements are ignored here), which saves building them again — that takes seconds
    at 100,000 guests.

    Raises ValueError for a guest or node the cluster does not have, or a limit below 1.
    """
    settings = cluster.settings
    parallel = settings.max_parallel if max_parallel is None else max_parallel
    inflow = settings.max_node_inflow if max_node_inflow is None else max_node_inflow
    if parallel < 1:
        raise ValueError(f"max_parallel must be at least 1, not {parallel}")
    if inflow < 1:
        raise ValueError(f"max_node_inflow must be at least 1, not {inflow}")
    requests = _requests(cluster, target)
    cons = constraints if constraints is not None else Constraints.build(cluster)
    return Planner(cluster, cons, parallel, inflow).run(requests)


def plan_with_retries(
    cluster: Cluster,
    propose: Callable[[frozenset[tuple[str, str]]], Proposal],
    *,
    max_retries: int = 5,
    max_parallel: int | None = None,
    max_node_inflow: int | None = None,
    constraints: Constraints | None = None,
) -> tuple[Proposal, Plan]:
    """Ask a strategy for a proposal until its moves can be ordered safely.

    ``propose(forbidden)`` must return a proposal that avoids the (guest, node) placements in
    ``forbidden`` (strategies refuse them in their constraints:
    :func:`~opendrs.engine.strategies.base.constraints_for`). While
    the plan of the proposal's net moves is not feasible, its unreachable placements are added to
    ``forbidden`` and the strategy is asked again, at most ``max_retries`` times. If it never gets
    there, the last proposal is returned with the plan of its reachable part (``feasible`` False,
    ``problems`` naming the dropped placements). Every move of the returned plan is safe.

    Each proposal's forbidden placements come from the ones before it, so the returned one is
    repeatable only if they all were: an option's ``deterministic`` (a search's, such as
    ``options.repair``) that any of them gave False is False in the returned one.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be at least 0, not {max_retries}")
    cons = constraints if constraints is not None else Constraints.build(cluster)
    # Imported here: the strategies' registry is listed without importing a strategy's module.
    from ..strategies.exact_repair import repair_deadline

    limits = (max_retries, max_parallel, max_node_inflow)
    with repair_deadline():  # its proposals' exact repairs share one deadline (or the caller's)
        return _retrying(cluster, propose, limits, cons)


def _retrying(
    cluster: Cluster,
    propose: Callable[[frozenset[tuple[str, str]]], Proposal],
    limits: tuple[int, int | None, int | None],
    cons: Constraints,
) -> tuple[Proposal, Plan]:
    """:func:`plan_with_retries`' proposals and plans (``limits``: its ``max_retries``,
    ``max_parallel`` and ``max_node_inflow``)."""
    max_retries, max_parallel, max_node_inflow = limits
    forbidden: set[tuple[str, str]] = set()
    attempts = 0
    unsure: set[str] = set()
    while True:
        proposal = propose(frozenset(forbidden))
        unsure |= unrepeatable(proposal)
        proposal = not_repeatable(proposal, unsure)
        attempts += 1
        target = final_placement(proposal.net_moves())
        plan = plan_moves(
            cluster,
            target,
            max_parallel=max_parallel,
            max_node_inflow=max_node_inflow,
            constraints=cons,
        )
        if plan.feasible:
            return proposal, plan
        fresh = set(plan.unreachable) - forbidden
        if not fresh or attempts > max_retries:
            break
        forbidden |= fresh
    dropped = ", ".join(f"{g} → {n}" for g, n in plan.unreachable)
    if fresh:
        why = f"still unreachable after {attempts} proposal{'' if attempts == 1 else 's'}"
    else:
        why = "proposed again although forbidden"
    note = f"Dropped placements {dropped} ({why}); the plan moves only the reachable rest."
    return proposal, replace(plan, problems=(*plan.problems, note))


def unrepeatable(proposal: Proposal) -> set[str]:
    """The options of ``proposal`` that hold a search which says it is not repeatable
    (``deterministic`` False)."""
    return {
        key
        for key, value in proposal.options.items()
        if isinstance(value, Mapping) and value.get("deterministic") is False
    }


def not_repeatable(proposal: Proposal, keys: set[str]) -> Proposal:
    """``proposal`` with ``deterministic`` False in each of its options named in ``keys`` that
    holds a search."""
    marked = {
        key: {**value, "deterministic": False}
        for key, value in proposal.options.items()
        if key in keys and isinstance(value, Mapping) and value.get("deterministic") is True
    }
    return replace(proposal, options={**proposal.options, **marked}) if marked else proposal


def _requests(cluster: Cluster, target: Mapping[str, str]) -> list[tuple[int, int]]:
    """(guest index, node index) of every requested placement, in guest id order."""
    gidx, nidx = cluster.guest_index, cluster.node_index
    out: list[tuple[int, int]] = []
    for guest, node in sorted(target.items(), key=lambda kv: (str(kv[0]), str(kv[1]))):
        if guest not in gidx:
            raise ValueError(f"target placement: unknown guest {guest!r}")
        if node not in nidx:
            raise ValueError(f"target placement of guest {guest!r}: unknown node {node!r}")
        out.append((gidx[guest], nidx[node]))
    return out


__all__ = [
    "Moving",
    "Plan",
    "PlannedMove",
    "final_placement",
    "not_repeatable",
    "plan_moves",
    "plan_with_retries",
    "unrepeatable",
]
