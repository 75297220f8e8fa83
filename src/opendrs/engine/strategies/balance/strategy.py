"""``balance`` as a strategy (:class:`Balance`, :func:`propose_balance`): one search runs the
phases in order — repair, shedding plan and rounds, pruning, the polish below the grain,
compaction and consolidation, the cheaper twins — and its history becomes the proposal; see the
package's documentation for what each phase does."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from opendrs.engine.bounds import migration_lower_bound
from opendrs.engine.constraints import Constraints
from opendrs.engine.imbalance import Imbalance
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster

from ..base import (
    Proposal,
    ProposedMove,
    Request,
    Strategy,
    cluster_imbalance,
    constraints_for,
    migration_cost,
)
from .compact import compact
from .consolidate import consolidate
from .exact import exact_note
from .options import BalanceOptions
from .polish import polish_below_grain
from .prune import prune
from .repair import ExactRepairMemo, RepairOutcome, repair
from .rounds import (
    balance_rounds,
    balanced_reason,
    balanced_stop,
    grain_and_goal,
    looser_commit_goal,
)
from .state import BalanceState
from .steps import History, StepKind
from .twins import cheaper_twins

#: The plain second search runs only on clusters of at most this many guests.
PLAIN_GUESTS = 5_000
#: The plan that leaves the vCPU commitments no wider than they started is searched for only
#: on clusters of at most this many guests: it repeats the whole search (at L 0.1–0.45 s of
#: CPU more; at XXL it would double 6–18 s).
COMMIT_GUESTS = 5_000
#: The objective in the proposal's moves: in squared percentage points.
OBJECTIVE_SCALE = 1e4


def propose_balance(
    cluster: Cluster,
    options: BalanceOptions | None = None,
    *,
    forbidden: Iterable[tuple[str, str]] = (),
    constraints: Constraints | None = None,
    loads: LoadModel | None = None,
) -> Proposal:
    """Balance the cluster to ``options.target_spread`` with the fewest and smallest migrations.

    ``options.margin`` is the least fall of the balance σ, in percentage points, a move must
    bring per percent of the cluster's total migration cost it spends; ``options.max_moves``
    caps the migrations (None: no cap); ``options.wide`` bounds the sources and targets looked
    at per round on big clusters. ``constraints`` and ``loads`` are the models a cycle view
    built already (capacity checked on its usage, ``forbidden`` not yet refused:
    :func:`constraints_for`; ``cluster``'s balance loads); without them they are built from
    ``cluster``. ``options``: the defaults when None. ValueError naming the first bad option.
    """
    options = options if options is not None else BalanceOptions()
    options.check()
    cons = constraints_for(cluster, forbidden, constraints)
    loads = loads if loads is not None else LoadModel.build(cluster)
    memo = ExactRepairMemo()
    reached = _best_search(cluster, cons, loads, options, memo)
    kept = _commit_kept(options, reached)
    if kept is None or len(cluster.guests) > COMMIT_GUESTS:
        return reached.proposal
    if not _may_save(cluster, loads, options, reached):
        return reached.proposal
    # The vCPU commitments started outside their goal: a plan that leaves them no wider than
    # they started, kept where bringing them within it costs too many more migrations.
    other = _best_search(cluster, cons, loads, kept, memo)
    moves, fewer = len(reached.proposal.moves), len(other.proposal.moves)
    if not _no_farther(other, reached) or moves <= options.cpu_commit_moves * fewer:
        return reached.proposal
    return _commit_given_up(other.proposal, options, moves, reached.balanced)


@dataclass(frozen=True)
class _Searched:
    """A search's proposal; whether it ended balanced, how far from its goals it ended (the
    largest weighted spread over its goal), and each resource's spread when the rounds began."""

    proposal: Proposal
    balanced: bool
    short: float
    start: np.ndarray
    #: (R,) each resource's goal, and whether it has a weight in the balance.
    goal: np.ndarray
    weighted: np.ndarray
    #: (R,) each resource's spread when the search ended.
    end: np.ndarray
    #: The vCPU commitments' looser goal the search applied (:func:`looser_commit_goal`).
    commit: float | None


def _best_search(
    cluster: Cluster,
    cons: Constraints,
    loads: LoadModel,
    options: BalanceOptions,
    memo: ExactRepairMemo,
) -> _Searched:
    """The shaped search; on a small cluster that it leaves unbalanced, the plain one where it
    does better."""
    shaped = _search(cluster, cons, loads, options, shaped=True, memo=memo)
    if not shaped.balanced and len(cluster.guests) <= PLAIN_GUESTS:
        # With few, big guests per node the shaped search can end where no move or exchange
        # pays for itself; the plain one (no plan, moves chosen by objective gain) takes
        # another path, and is kept if it reaches the target, or ends nearer it. It repeats
        # the whole search: on a big cluster that doubles the time, for a path that did not
        # reach the target there either (#15), so it runs on small clusters only.
        plain = _search(cluster, cons, loads, options, shaped=False, memo=memo)
        if plain.balanced or plain.short < shaped.short:
            return plain
    return shaped


def _commit_kept(options: BalanceOptions, reached: _Searched) -> BalanceOptions | None:
    """Where the search applied a looser vCPU commitments' goal (static mode) and they started
    outside it: ``options`` with that goal widened to their spread at the start (never wider
    than they were); else None."""
    cpu = RESOURCES.index("cpu")
    if reached.commit is None or not reached.weighted[cpu]:
        return None
    start = float(reached.start[cpu])
    if start <= options.cpu_commit_spread:
        return None
    return replace(options, cpu_commit_spread=start)


def _may_save(
    cluster: Cluster, loads: LoadModel, options: BalanceOptions, reached: _Searched
) -> bool:
    """Whether a plan that balances memory could take fewer than ``1 / cpu_commit_moves`` of
    ``reached``'s migrations: not where the fewest any placement needs to bring memory within
    its goal (:func:`~opendrs.engine.bounds.migration_lower_bound`; short of it, to the spread
    ``reached`` left) are that many already, nor where ``reached`` ends short of the goals with
    the vCPUs within theirs and no placement brings memory within its goal. Where memory has no
    weight there is no such bound."""
    memory, cpu = RESOURCES.index("memory"), RESOURCES.index("cpu")
    if not reached.weighted[memory]:
        return True
    # Short of its goal, the spread the plan reached (no other plan need go further).
    spread = reached.goal[memory] if reached.balanced else reached.end[memory]
    goal = {"memory": float(max(reached.goal[memory], spread))}
    bounds = migration_lower_bound(cluster, goal, loads, ("memory",))
    if not reached.balanced and reached.end[cpu] <= reached.goal[cpu]:
        # Only a plan that ends balanced could be proposed instead: none where no placement
        # brings memory within its goal.
        return bounds.spread["memory"] <= reached.goal[memory]
    return len(reached.proposal.moves) > options.cpu_commit_moves * bounds.migrations


def _no_farther(other: _Searched, reached: _Searched) -> bool:
    """Whether ``other`` (the vCPU commitments held) may be proposed instead of ``reached``:
    it ends balanced, or neither does, ``reached`` leaves the vCPU commitments outside their
    goal too, and ``other`` leaves every other weighted resource's spread no wider (vCPU moves
    that do not reach their goal are no reason to leave the rest less even)."""
    if other.balanced or reached.balanced:
        return other.balanced
    cpu = RESOURCES.index("cpu")
    if reached.end[cpu] <= reached.goal[cpu]:
        return False
    rest = reached.weighted.copy()
    rest[cpu] = False
    return bool(rest.any() and np.all(other.end[rest] <= reached.end[rest] + 1e-12))


def _commit_given_up(
    proposal: Proposal, options: BalanceOptions, moves: int, reached: bool
) -> Proposal:
    """``proposal`` (the vCPU commitments no wider than they started), saying why it was
    proposed rather than the plan of ``moves`` migrations that brought them within
    ``options.cpu_commit_spread`` (``reached``) or towards it, leaving the other resources no
    more even: its stop gives that goal (``cpu_commit_asked``) and those migrations
    (``cpu_commit_moves``), its options the goal asked."""
    goal = f"{options.cpu_commit_spread * 100:.2f} pp"
    took = f"within {goal} they took" if reached else f"narrowing them towards {goal} took"
    why = (
        f"vCPU commitments left no wider than they started: {took} {moves} migrations, more "
        f"than {options.cpu_commit_moves:g}× these {len(proposal.moves)}"
    )
    stop = proposal.stop
    if stop is not None:
        asked = {"cpu_commit_asked": options.cpu_commit_spread, "cpu_commit_moves": moves}
        stop = replace(stop, details={**stop.details, **asked})
    asked_options = {**proposal.options, "cpu_commit_spread": options.cpu_commit_spread}
    return replace(proposal, stopped=f"{proposal.stopped}; {why}", stop=stop, options=asked_options)


def _search(
    cluster: Cluster,
    cons: Constraints,
    loads: LoadModel,
    options: BalanceOptions,
    *,
    shaped: bool,
    memo: ExactRepairMemo,
) -> _Searched:
    """One search; ``shaped``: with the shedding plan and band-ordered moves.

    ``memo`` keeps the exact repair for the second search, which starts from the same state.
    """
    state = BalanceState(cluster, cons, loads)
    before = cluster_imbalance(cluster, loads=state.loads)
    history = History(state)
    limit = options.max_moves if options.max_moves is not None else 10**9
    repaired = repair(history, limit, options.max_moves, memo)
    grain, state.goal = grain_and_goal(state, options.target_spread, options.cpu_commit_spread)
    # Balancing never leaves the objective above what it is now (repairs may raise it).
    ceiling = state.objective()
    start = state.spreads()
    stopped, stop = balance_rounds(history, options, limit, shaped=shaped)
    reached_goal = stop.code == "balanced"
    prune(history)
    if reached_goal:
        # A resource whose goal was one step on the smallest node, brought within
        # target_spread in whole steps where they can add up.
        target_spread = options.target_spread
        polished = polish_below_grain(history, grain, target_spread, ceiling, limit, options.swaps)
        # Then fewer moves within the goals reached (a polished resource's is target_spread).
        compact(history, ceiling, target_spread)
        # Then pairs of moves at one node undone, with at most one move in their place.
        if consolidate(history, ceiling, target_spread):
            compact(history, ceiling, target_spread)
        if polished:
            commit = looser_commit_goal(state, options)
            stopped = balanced_reason(options, commit, state.spreads(), polished)
            stop = balanced_stop(options, commit, state.spreads())
    # The same loads for less: a moved guest's cheaper twin left at home goes in its place.
    cheaper_twins(history)
    proposal = Proposal(
        "balance",
        _proposed_moves(history),
        before,
        _imbalance_after(state),
        stopped,
        _notes(state, repaired),
        _proposal_options(options, repaired),
        stop,
    )
    weighted = state.weights > 0
    short = float(np.max(state.spreads()[weighted] / state.goal[weighted], initial=0.0))
    commit = looser_commit_goal(state, options)
    return _Searched(
        proposal, reached_goal, short, start, state.goal.copy(), weighted, state.spreads(), commit
    )


def _proposed_moves(history: History) -> tuple[ProposedMove, ...]:
    """Each guest the search moved, from where it started to where it ends, in the order its
    unit first moved, with the objective before that first move and after its last, and the
    first move's reason (a pruned unit is back home: it does not move)."""
    state = history.state
    cluster, units = state.cluster, state.units
    first_seen: dict[int, int] = {}
    j_before: dict[int, float] = {}
    j_after: dict[int, float] = {}
    why: dict[int, str] = {}
    for i, step in enumerate(history.steps):
        if step.kind is StepKind.PRUNED:
            continue
        u = step.unit
        first_seen.setdefault(u, i)
        j_before.setdefault(u, step.before)
        j_after[u] = step.after
        why.setdefault(u, step.kind.reason)
    final, guests = units.assign, cluster.guests
    moves: list[ProposedMove] = []
    for u in sorted(np.nonzero(state.moved())[0].tolist(), key=lambda u: first_seen[u]):
        tgt = cluster.nodes[int(final[u])].name
        for j in units.members[u].tolist():
            origin = int(state.loads.assign[j])
            if origin == int(final[u]):
                continue  # a bundle member that was already there
            partner = f" (with {units.label[u]})" if guests[j].id != units.label[u] else ""
            moves.append(
                ProposedMove(
                    guest=guests[j].id,
                    source=cluster.nodes[origin].name,
                    target=tgt,
                    metric="weighted variance (pp²)",
                    before=j_before[u] * OBJECTIVE_SCALE,
                    after=j_after[u] * OBJECTIVE_SCALE,
                    cost=migration_cost(guests[j], cluster.settings),
                    reason=why[u] + partner,
                )
            )
    return tuple(moves)


def _imbalance_after(state: BalanceState) -> Imbalance:
    """The cluster's imbalance with every moved unit where the search left it."""
    assign = np.array(state.loads.assign, copy=True)
    moved = state.moved()
    for u, idx in enumerate(state.units.members):
        if moved[u]:
            assign[idx] = state.units.assign[u]
    return cluster_imbalance(state.cluster, assign, state.loads)


def _notes(state: BalanceState, repaired: RepairOutcome) -> tuple[str, ...]:
    """The proposal's notes: the constraints' problems, the exact repair, what was not
    repaired."""
    notes = [str(p) for p in state.cons.problems]
    if repaired.exact is not None:
        notes.append(exact_note(repaired.exact))
    if repaired.stuck:
        names = sorted({state.units.label[u] for u in repaired.stuck})
        more = f" (and {len(names) - 10} more)" if len(names) > 10 else ""
        notes.append("could not repair: " + ", ".join(names[:10]) + more)
    return tuple(notes)


def _proposal_options(options: BalanceOptions, repaired: RepairOutcome) -> dict[str, Any]:
    """The proposal's options: the options searched with, and what an exact repair found."""
    values: dict[str, Any] = options.values()
    if repaired.exact is not None:
        values["repair"] = repaired.exact
    return values


class Balance:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = "balance"
    summary = "opendrs: fewest, smallest migrations to a target spread; all rules hard"
    Options = BalanceOptions

    def propose(self, view: CycleView, request: Request, options: BalanceOptions) -> Proposal:
        """:func:`propose_balance` of the observed cluster with the view's models; the request's
        target spread and move cap unless the options set them."""
        asked = replace(
            options,
            target_spread=options.pick("target_spread", request.target_spread),
            max_moves=options.pick("max_moves", request.max_moves),
        )
        return propose_balance(
            view.observed,
            asked,
            forbidden=request.forbidden,
            constraints=view.constraints,
            loads=view.loads,
        )


STRATEGIES: tuple[Strategy, ...] = (Balance(),)
