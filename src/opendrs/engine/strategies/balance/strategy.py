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
#: Where the move limit cut the search, the search runs again with this many times its steps:
#: where that one stops on its own with no more migrations than the limit, it is proposed.
STEP_SLACK = 3
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
    ground = _Ground(cluster, cons, loads, memo)
    proposal, reached = _propose(ground, options, None)
    most = options.max_moves
    if most is None or not _cut(reached) or not _may_fit(cluster, loads, reached, most):
        return proposal
    # The limit counts the search's steps, moves it undoes later among them: where it cut the
    # search, the plan the search makes without it may fit it all the same. With more steps,
    # a search that stops on its own makes that plan; it is proposed where it fits the limit.
    wider, reached = _propose(ground, options, STEP_SLACK * most)
    if not _cut(reached) and len(wider.moves) <= most:
        return wider
    return proposal


def _may_fit(cluster: Cluster, loads: LoadModel, reached: _Searched, most: int) -> bool:
    """Whether the plan the search makes without a move limit could take at most ``most``
    migrations: not where bringing memory within its goal (``reached``'s) takes more
    (:func:`~opendrs.engine.bounds.migration_lower_bound`), unless no placement brings it
    there (the search then stops short of it, maybe sooner). Where memory has no weight there
    is no such bound."""
    memory = RESOURCES.index("memory")
    if not reached.weighted[memory]:
        return True
    goal = float(reached.goal[memory])
    bounds = migration_lower_bound(cluster, {"memory": goal}, loads, ("memory",))
    return bounds.migrations <= most or bounds.spread["memory"] > goal


@dataclass(frozen=True)
class _Ground:
    """What every search of one proposal starts from: the cluster, its constraints and loads,
    and the exact repair found (the same for every search)."""

    cluster: Cluster
    cons: Constraints
    loads: LoadModel
    memo: ExactRepairMemo


def _propose(
    ground: _Ground, options: BalanceOptions, steps: int | None
) -> tuple[Proposal, _Searched]:
    """The proposal of :func:`propose_balance`, its searches of at most ``steps`` steps (None:
    the plan capped at ``options.max_moves`` migrations, see :func:`_search`), and the first
    search (the one towards the vCPU goal)."""
    cluster, cons, loads, memo = ground.cluster, ground.cons, ground.loads, ground.memo
    reached = _best_search(cluster, cons, loads, options, memo, steps)
    kept = _commit_kept(options, reached)
    if kept is None or len(cluster.guests) > COMMIT_GUESTS:
        return reached.proposal, reached
    if not _may_save(cluster, loads, options, reached):
        return reached.proposal, reached
    # The vCPU commitments started outside their goal: a plan that leaves them no wider than
    # they started, kept where bringing them within it costs too many more migrations.
    other = _best_search(cluster, cons, loads, kept, memo, steps)
    if not _no_farther(other, reached) or not _too_dear(options, reached, other):
        return reached.proposal, reached
    moves = len(reached.proposal.moves)
    given_up = _commit_given_up(other.proposal, options, moves, reached.balanced, _cut(reached))
    return given_up, reached


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
    steps: int | None,
) -> _Searched:
    """The shaped search; on a small cluster that it leaves unbalanced, the plain one where it
    does better (each of at most ``steps`` steps, see :func:`_search`)."""
    shaped = _search(cluster, cons, loads, options, shaped=True, memo=memo, steps=steps)
    if not shaped.balanced and len(cluster.guests) <= PLAIN_GUESTS:
        # With few, big guests per node the shaped search can end where no move or exchange
        # pays for itself; the plain one (no plan, moves chosen by objective gain) takes
        # another path, and is kept if it reaches the target, or ends nearer it. It repeats
        # the whole search: on a big cluster that doubles the time, for a path that did not
        # reach the target there either (#15), so it runs on small clusters only.
        plain = _search(cluster, cons, loads, options, shaped=False, memo=memo, steps=steps)
        if plain.balanced or plain.short < shaped.short:
            return plain
    return shaped


def _commit_kept(options: BalanceOptions, reached: _Searched) -> BalanceOptions | None:
    """Where the search applied a looser vCPU commitments' goal (static mode) and they started
    outside the goal it applied: ``options`` with that goal widened to their spread at the
    start (never wider than they were); else None."""
    cpu = RESOURCES.index("cpu")
    if reached.commit is None or not reached.weighted[cpu]:
        return None
    start = float(reached.start[cpu])
    if start <= reached.goal[cpu]:
        # Within the goal applied (one guest's step where that is coarser than the option).
        return None
    return replace(options, cpu_commit_spread=start)


def _may_save(
    cluster: Cluster, loads: LoadModel, options: BalanceOptions, reached: _Searched
) -> bool:
    """Whether a plan that balances memory could take fewer than ``1 / cpu_commit_moves`` of
    ``reached``'s migrations (or, where the move limit cut ``reached``, no more): not where the
    fewest any placement needs to bring memory within its goal
    (:func:`~opendrs.engine.bounds.migration_lower_bound`; short of it, to the spread
    ``reached`` left) are that many already, nor where ``reached`` ends short of the goals
    with the vCPUs within theirs and no placement brings memory within its goal. Where memory
    has no weight there is no such bound."""
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
    moves = len(reached.proposal.moves)
    # Where the move limit cut ``reached``, a balanced plan of no more migrations wins too.
    cut = _cut(reached) and bounds.migrations <= moves
    return cut or moves > options.cpu_commit_moves * bounds.migrations


def _too_dear(options: BalanceOptions, reached: _Searched, other: _Searched) -> bool:
    """Whether ``reached`` (towards the vCPU goal) costs too many migrations beside ``other``:
    more than ``cpu_commit_moves`` times its migrations, or, where the move limit stopped
    ``reached`` short of its goals and ``other`` ends balanced, no fewer than ``other``'s — the
    limit cut that plan, so its migrations are not what reaching the goal takes, and a tighter
    limit must not turn a plan that fits it into a longer one."""
    moves, fewer = len(reached.proposal.moves), len(other.proposal.moves)
    cut = _cut(reached) and other.balanced and fewer <= moves
    return cut or moves > options.cpu_commit_moves * fewer


def _cut(reached: _Searched) -> bool:
    """Whether the move limit stopped ``reached`` short of its goals."""
    stop = reached.proposal.stop
    return stop is not None and stop.code == "move_limit"


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
    proposal: Proposal, options: BalanceOptions, moves: int, reached: bool, cut: bool
) -> Proposal:
    """``proposal`` (the vCPU commitments no wider than they started), saying why it was
    proposed rather than the plan of ``moves`` migrations that brought them within
    ``options.cpu_commit_spread`` (``reached``) or towards it, leaving the other resources no
    more even, or that the move limit stopped (``cut``): its stop gives that goal
    (``cpu_commit_asked``), those migrations (``cpu_commit_moves``) and the limit that stopped
    them (``cpu_commit_limit``), its options the goal asked."""
    goal = f"{options.cpu_commit_spread * 100:.2f} pp"
    took = f"within {goal} they took" if reached else f"narrowing them towards {goal} took"
    why = (
        f"vCPU commitments left no wider than they started: {took} {moves} migrations, more "
        f"than {options.cpu_commit_moves:g}× these {len(proposal.moves)}"
    )
    if cut:
        why = (
            "vCPU commitments left no wider than they started: the move limit "
            f"({options.max_moves}) stopped the plan towards {goal} at {moves} migrations, "
            f"short of its goals and no fewer than these {len(proposal.moves)}"
        )
    stop = proposal.stop
    if stop is not None:
        asked = {"cpu_commit_asked": options.cpu_commit_spread, "cpu_commit_moves": moves}
        if cut:
            asked["cpu_commit_limit"] = options.max_moves
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
    steps: int | None = None,
) -> _Searched:
    """One search; ``shaped``: with the shedding plan and band-ordered moves.

    ``memo`` keeps the exact repair for the second search, which starts from the same state.
    ``steps`` (where given) caps the search's steps; else ``options.max_moves`` caps the
    migrations proposed: the search counts its steps, and a step of a bundle moves each of its
    guests, so where the plan has more migrations than the cap the search runs again with
    fewer steps (:func:`_fewer_steps`) until it fits.
    """
    if steps is not None or options.max_moves is None:
        limit = steps if steps is not None else 10**9
        return _search_steps(cluster, cons, loads, options, limit, shaped=shaped, memo=memo)
    most = steps = options.max_moves
    while True:
        found = _search_steps(cluster, cons, loads, options, steps, shaped=shaped, memo=memo)
        moves = len(found.proposal.moves)
        if moves <= most or steps == 0:
            return found
        steps = _fewer_steps(steps, moves, most)


def _fewer_steps(steps: int, moves: int, most: int) -> int:
    """The steps of the next search where ``steps`` steps made ``moves`` migrations, more than
    ``most``: as many steps fewer as migrations over, or as many as fit at the migrations per
    step seen where that keeps more (a step of a bundle moves each of its guests: steps of
    pairs all over, half as many), always fewer than ``steps``, and one before none (its one
    step may fit where the average does not)."""
    if steps <= 1:
        return 0
    return max(steps - (moves - most), steps * most // moves, 1)


def _search_steps(
    cluster: Cluster,
    cons: Constraints,
    loads: LoadModel,
    options: BalanceOptions,
    limit: int,
    *,
    shaped: bool,
    memo: ExactRepairMemo,
) -> _Searched:
    """One search of at most ``limit`` steps (see :func:`_search`)."""
    state = BalanceState(cluster, cons, loads)
    before = cluster_imbalance(cluster, loads=state.loads)
    history = History(state)
    repaired = repair(history, limit, options.max_moves, memo)
    grain, state.goal = grain_and_goal(state, options.target_spread, options.cpu_commit_spread)
    # Balancing never leaves the objective above what it is now (repairs may raise it).
    ceiling = state.objective()
    start = state.spreads()
    stopped, stop = balance_rounds(history, options, limit, shaped=shaped)
    if stop.code == "move_limit":
        stop = replace(stop, details={"max_moves": options.max_moves})
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
