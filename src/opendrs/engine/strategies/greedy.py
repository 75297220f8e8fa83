"""``static-greedy``: a balancer sketched for Proxmox's HA manager, on opendrs's scores.

F. Ebner's static-scheduler series (pve-devel, November 2022) closes with an idea for a balancer:

1. sort all services by *badness*;
2. score the nodes for each service in turn, adding its usage to the chosen node before the next;
   the current node is kept if its score does not differ too much from the best node's;
3. migrate the services whose chosen node differs.

opendrs makes each step precise:

* **Badness** of a movable guest (or of a bundle of guests kept together by a hard positive
  affinity) is its share of its node's *excess*: for each resource, the load fraction the guest
  puts on its node, capped at how far that node's fraction lies above the cluster's mean fraction
  (``ΣL / ΣC`` over the usable nodes), weighted by the cluster's resource weights:
  ``Σ_r w_r · min(d_r / C_r, max(f_r − f̄_r, 0))``. Guests on nodes at or below the mean have
  badness 0; a guest on a node that may not hold guests (maintenance) counts its whole share. The
  guests that can relieve an overloaded node the most come first; ties go by guest id.
* **Scores** are :meth:`~opendrs.engine.placement.PlacementState.evaluate`'s: with the guest taken
  off its node, each node that passes every hard constraint is scored by the cluster's balance if
  the guest went there — the capacity-weighted standard deviation σ of the usable nodes' load
  fractions, resources combined with the cluster's weights — plus
  :data:`~opendrs.engine.constraints.SOFT_PENALTY` per soft rule broken.
* **Keep**: the guest stays where it is when its current node is allowed and scores less than
  ``keep`` above the best node. ``keep`` is in the score's own unit, σ of load fractions: the
  default 0.005 is half a percentage point of spread, so a move must make the cluster measurably
  more even to be worth a migration. A current node that is not allowed any more (a broken rule,
  maintenance, over capacity) is always left.
* The chosen node's usage is updated before the next guest (:meth:`PlacementState.commit`).

One pass over the guests by default (``passes``); further passes re-sort by the new badness and
stop early when a pass moves nothing. The order is fixed at the start of each pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opendrs.engine.imbalance import balance_objective
from opendrs.engine.placement import PlacementState
from opendrs.engine.pve_selection import fraction_shift, fractions_of
from opendrs.engine.view import CycleView

from .base import (
    Proposal,
    ProposedMove,
    Request,
    Start,
    Stop,
    Strategy,
    StrategyOptions,
    bundle_moves,
    start,
    usable_nodes,
)
from .pve import Bundle, movable_bundles

NAME = "static-greedy"
DEFAULT_KEEP = 0.005
DEFAULT_PASSES = 1


def balance_sigma(state: PlacementState) -> float:
    """The cluster's balance now: capacity-weighted σ of the usable nodes' fractions, combined.

    The same figure :meth:`PlacementState.evaluate` reports for a node, with nothing moved.
    """
    usable = usable_nodes(state)
    cap = state.loads.capacity
    if not usable.any():
        return 0.0
    group = np.where(usable, 0, -1)
    objective = float(balance_objective(state.node_load, cap, state.weights, group))
    return float(np.sqrt(max(objective, 0.0)))


def badness(state: PlacementState, bundles: list[Bundle]) -> np.ndarray:
    """Each bundle's share of its node's load above the cluster's mean fraction (see module)."""
    cap = state.loads.capacity
    usable = usable_nodes(state)
    frac = fractions_of(state.node_load, cap)
    total_c = cap[usable].sum(axis=0)
    total_l = state.node_load[usable].sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(total_c > 0, total_l / np.where(total_c > 0, total_c, 1.0), 0.0)
    excess = np.where(usable[:, None], np.maximum(frac - mean[None, :], 0.0), frac)
    out = np.zeros(len(bundles))
    for i, bundle in enumerate(bundles):
        members = bundle.members
        demand = state.loads.demand[members[state.running[members]]].sum(axis=0)
        share = fraction_shift(demand, cap)[bundle.src]
        out[i] = float(np.minimum(share, excess[bundle.src]) @ state.weights)
    return out


def _current_score(state: PlacementState, bundle: Bundle) -> float:
    """Score of the bundle's current node when that node is not allowed any more."""
    cons = state.constraints
    assign = state.assign.copy()
    assign[bundle.members] = -1
    penalty = sum(float(cons.soft_penalty(j, assign)[bundle.src]) for j in bundle.members.tolist())
    return balance_sigma(state) + penalty


def propose_greedy(view: CycleView, request: Request, options: GreedyOptions) -> Proposal:
    """Place every movable guest, worst first, on its best node (see the module).

    Reads the view's constraints, with the request's forbidden placements refused, and its
    balance loads. ``options.keep``: a guest stays on its (allowed) node when that node's score
    is less than this much above the best node's, in units of σ of the load fractions (plus soft
    penalties); ``options.passes``: how many times to go over the guests (a pass that moves
    nothing ends the run).
    """
    begun = start(view, request.forbidden)
    keep, passes = options.keep, options.passes
    moves: list[ProposedMove] = []
    stopped = f"{passes} pass{'es' if passes != 1 else ''} done"
    stop = Stop("passes_done", {"passes": passes})
    if passes < 1:
        stopped = "no pass requested"
    for number in range(1, passes + 1):
        bundles = movable_bundles(begun.state, begun.cluster)
        if not bundles:
            stopped, stop = "no movable guest", Stop("no_movable_guest")
            break
        if _greedy_pass(begun, bundles, keep, moves) == 0:
            stopped = (
                f"pass {number} moved nothing: every guest is within {keep:g} of its best node"
            )
            stop = Stop("pass_moved_nothing", {"pass": number, "keep": keep})
            break
    return Proposal(
        NAME,
        tuple(moves),
        begun.before,
        begun.imbalance(),
        stopped,
        begun.notes,
        options.values(),
        stop,
    )


def _greedy_pass(
    begun: Start, bundles: list[Bundle], keep: float, moves: list[ProposedMove]
) -> int:
    """One pass over ``bundles``, worst first: each goes to its best node unless its own is
    allowed and within ``keep`` of it; the moves are appended to ``moves`` and committed to the
    state. How many bundles moved."""
    state, cluster = begun.state, begun.cluster
    bad = badness(state, bundles)
    order = sorted(range(len(bundles)), key=lambda i: (-round(float(bad[i]), 12), i))
    moved = 0
    for i in order:
        bundle = bundles[i]
        scored, _rejected = state.evaluate(bundle.members)
        if not scored:
            continue  # no node at all can take it, its own included: it stays
        best_n, best_score, best_balance, best_penalty = scored[0]
        src = bundle.src
        if best_n == src:
            continue
        current = next((s for s in scored if s[0] == src), None)
        if current is not None and current[1] - best_score < keep:
            continue
        here = current[1] if current is not None else _current_score(state, bundle)
        source, target = cluster.nodes[src].name, cluster.nodes[best_n].name
        reason = (
            f"badness {bad[i]:.4f}; score {here:.4f} on {source} -> {best_score:.4f} on "
            f"{target} (balance {best_balance:.4f}, penalty {best_penalty:g})"
            + ("" if current is not None else f"; {source} is not allowed any more")
        )
        moves += bundle_moves(
            cluster,
            bundle.members.tolist(),
            bundle.leader,
            source,
            target,
            metric="score",
            before=here,
            after=best_score,
            reason=reason,
        )
        state.commit(bundle.members, best_n)
        moved += 1
    return moved


@dataclass(frozen=True)
class GreedyOptions(StrategyOptions):
    """``static-greedy``'s options (see :func:`propose_greedy`)."""

    keep: float = DEFAULT_KEEP
    passes: int = DEFAULT_PASSES


class Greedy:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = NAME
    summary = "Proxmox's sketched balancer: worst guests first, to their best node unless close"
    Options = GreedyOptions

    def propose(self, view: CycleView, request: Request, options: GreedyOptions) -> Proposal:
        return propose_greedy(view, request, options)


STRATEGIES: tuple[Strategy, ...] = (Greedy(),)
