"""``balance``'s rounds (:func:`balance_rounds`): greedy moves over a vectorised (unit × node)
matrix until every weighted resource is within its goal; when no single move pays, exchanges of
two units, then of a unit against a set (:mod:`.set_exchange`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

import numpy as np

from opendrs.engine.strategies.base import Stop
from opendrs.engine.usage import RESOURCES

from .hold import keeps_held_after
from .options import BalanceOptions
from .picks import IdleWindows, round_window
from .set_exchange import SetExchange, set_round
from .shed_plan import shed_plan
from .state import BalanceState
from .steps import History, StepKind

log = logging.getLogger(__name__)

#: Most (unit, target) pairs a round looks at when it widens its window on a big cluster.
PAIR_BUDGET = 4_000_000

#: With resources held, an exchange of two units is made before the round's single moves when
#: its gain per migration is at least this many times the best single move's per guest.
EXCHANGE_FIRST = 3.0

#: A round without single moves looks for exchanges from this many of the most deviating nodes
#: per this many nodes (at least 4).
SWAP_NODES_PER = 64


def looser_commit_goal(state: BalanceState, options: BalanceOptions) -> float | None:
    """The vCPU commitments' goal where it is looser than ``target_spread`` and applies (static
    mode, :func:`grain_and_goal`), else None."""
    static = state.loads.mode == "static" and state.loads.source == "usage"
    commit = options.cpu_commit_spread
    return commit if static and commit > options.target_spread else None


def balanced_reason(
    options: BalanceOptions,
    commit: float | None,
    spreads: np.ndarray,
    more: Iterable[str] = (),
) -> str:
    """The stop reason of a search that ended balanced (``commit``: the vCPU commitments'
    looser goal, :func:`looser_commit_goal`), with ``more`` clauses."""
    looser = "" if commit is None else f", vCPU commitments {commit * 100:.2f} pp"
    text = (
        "balanced: every spread within its goal "
        f"({options.target_spread * 100:.2f} pp{looser}, or one guest's step where coarser): ("
        + ", ".join(f"{r} {s * 100:.2f} pp" for r, s in zip(RESOURCES, spreads, strict=True))
        + ")"
    )
    return "; ".join([text, *more])


def balanced_stop(options: BalanceOptions, commit: float | None, spreads: np.ndarray) -> Stop:
    """The stop of a search that ended balanced: the goals and each resource's spread."""
    figures = {f"{r}_spread": float(s) for r, s in zip(RESOURCES, spreads, strict=True)}
    goals = {"target_spread": options.target_spread}
    if commit is not None:
        goals["cpu_commit_spread"] = commit
    return Stop("balanced", {**goals, **figures})


@dataclass(frozen=True)
class Price:
    """What a move must bring to pay for itself: the balance σ (the square root of the
    objective) must fall by at least ``margin`` percentage points per percent of the cluster's
    total migration cost (``total_cost``) it spends; a unit that has moved already moves for
    free."""

    margin: float
    total_cost: float

    @classmethod
    def of(cls, state: BalanceState, margin: float) -> Price:
        """The price on ``state``'s cluster."""
        return cls(margin, max(float(state.units.cost.sum()), 1.0))

    def move_pays(self, state: BalanceState, u: int, gain: float, objective: float) -> bool:
        """Whether moving ``u`` for ``gain`` from ``objective`` pays for itself."""
        if state.is_moved(u):
            return gain > 1e-9 * objective
        drop = np.sqrt(max(objective, 0.0)) - np.sqrt(max(objective - gain, 0.0))
        return bool(drop * 100 >= self.margin * 100 * state.units.cost[u] / self.total_cost)

    def exchange_pays(self, state: BalanceState, moving: Iterable[int], gain: float) -> bool:
        """Whether an exchange moving the units ``moving`` for ``gain`` pays for itself: a gain
        within rounding of nothing is none (no exchange back)."""
        objective = state.steered_objective()
        fresh = [v for v in moving if not state.is_moved(v)]
        drop = np.sqrt(max(objective, 0.0)) - np.sqrt(max(objective - gain, 0.0))
        spent = float(state.units.cost[fresh].sum()) if fresh else 0.0
        if gain <= 1e-9 * objective:
            return False
        return bool(drop * 100 >= self.margin * 100 * spent / self.total_cost)


def grain_and_goal(
    state: BalanceState, target_spread: float, cpu_commit_spread: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(R,) each resource's grain — the smallest movable step on the smallest usable node: a
    spread finer than it cannot be asked for — and its goal, the coarser of the two; the vCPU
    commitments' (static mode) at least ``cpu_commit_spread``."""
    units = state.units
    movable_demand = units.demand[units.movable]
    usable_cap = state.cap[state.usable]
    if movable_demand.size and usable_cap.size:
        positive = np.where(movable_demand > 0, movable_demand, np.inf)
        grain = np.nan_to_num(positive.min(axis=0) / usable_cap.min(axis=0), posinf=0.0)
    else:
        grain = np.zeros(len(RESOURCES))
    least = np.full(len(RESOURCES), target_spread)
    if state.loads.mode == "static" and state.loads.source == "usage":
        least[RESOURCES.index("cpu")] = max(target_spread, cpu_commit_spread)
    return grain, np.maximum(least, grain) + 1e-12


def holds(state: BalanceState, options: BalanceOptions) -> bool:
    """Whether the rounds hold the resources within their goal (:mod:`.hold`): with ``hold``, and
    wherever the vCPU commitments' goal is looser than ``target_spread`` (static mode) — without
    the hold a looser goal saves few moves, as the vCPUs would still steer every choice."""
    return options.hold or looser_commit_goal(state, options) is not None


def balance_rounds(
    history: History, options: BalanceOptions, limit: int, *, shaped: bool
) -> tuple[str, Stop]:
    """Rounds of moves (and exchanges) on ``history``'s state until every weighted resource is
    within its goal (``state.goal``), at most ``limit`` steps of history; ``shaped``: the
    shedding plan's units first, moves chosen by band distance. Each round, the resources
    within their goal are held there when ``options.hold`` (:mod:`.hold`); none is once the
    rounds end. The stop reason, as a sentence and as a :class:`Stop` (``balanced`` when the
    goal was reached)."""
    state = history.state
    if not holds(state, options):
        return _rounds(history, options, limit, shaped=shaped)
    try:
        return _rounds(history, options, limit, shaped=shaped)
    finally:
        state.steer(np.zeros(len(RESOURCES), dtype=bool))


def _rounds(
    history: History, options: BalanceOptions, limit: int, *, shaped: bool
) -> tuple[str, Stop]:
    """:func:`balance_rounds`, with the held resources steered."""
    state = history.state
    weighted = state.weights > 0
    price = Price.of(state, options.margin)
    held_rounds = holds(state, options)
    hold = weighted if held_rounds else np.zeros_like(weighted)
    state.steer(hold & (state.spreads() <= state.goal))
    # The shedding plan of the nodes above the band: its units move first.
    plan = np.zeros(len(state.units.assign), dtype=bool)
    if shaped and not np.all(state.spreads()[weighted] <= state.goal[weighted]):
        plan = shed_plan(state)
    idle = IdleWindows(state)
    while len(history) < limit:
        spreads = state.spreads()
        if np.all(spreads[weighted] <= state.goal[weighted]):
            goal = looser_commit_goal(state, options)
            return balanced_reason(options, goal, spreads), balanced_stop(options, goal, spreads)
        held = state.held
        state.steer(hold & (spreads <= state.goal))
        if state.held is not held:
            # The windows found idle were judged with other weights.
            idle = IdleWindows(state)
        f = state.fractions()
        objective = state.steered_objective()
        picks, shedding = _round_picks(state, plan, idle, f, options.wide, shaped, len(history))
        if (
            held_rounds
            and options.swaps
            and picks
            and _exchanges_first(history, f, price, picks, limit)
        ):
            continue
        made = _take_moves(history, picks, price, objective, limit)
        if made == 0 and options.swaps:
            made = _exchange_pairs(history, f, price, limit)
        if made == 0 and shedding:
            # What is left of the plan does not help any more: back to every unit.
            plan[:] = False
            continue
        if made == 0 and options.swaps:
            made = _exchange_sets(history, price, limit)
        if made == 0:
            return (
                "no allowed move pays for itself (margin "
                f"{options.margin:g} pp of σ per % of the cluster's migration cost)"
            ), Stop("no_move_pays", {"margin": options.margin})
    return "move limit reached", Stop("move_limit", {"max_moves": limit})


def _round_picks(
    state: BalanceState,
    plan: np.ndarray,
    idle: IdleWindows,
    f: np.ndarray,
    wide: int,
    shaped: bool,
    made_so_far: int,
) -> tuple[list[tuple[float, int, int]], bool]:
    """A round's candidate moves (gain, unit, target), best first, from the ``wide`` window,
    widened while it has none within a budget of (unit, target) pairs; and whether they are the
    shedding plan's units (``plan``, those not moved yet) only."""
    n_nodes = len(state.cluster.nodes)
    usable_idx = np.nonzero(state.usable)[0]
    window = wide
    while True:
        sources, targets = round_window(state, f, usable_idx, window)
        cand = state.units_on(sources)
        fresh = ~state.moved()
        shedding = bool((plan & fresh).any())
        if shedding:
            cand = cand[plan[cand] & fresh[cand]]
        picks = idle.pick(cand, sources, targets, window, max(4, n_nodes // 8), shaped)
        if not picks and not shedding:
            idle.record(sources, targets, window)
        # Widen when the window has nothing, within a budget of (unit, target) pairs.
        wider = 2 * window
        per_node = len(state.units.assign) / max(n_nodes, 1)
        if picks or window >= n_nodes or per_node * wider * wider > PAIR_BUDGET:
            break
        window = wider
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "round: %d moves so far, spreads %s, window %d, %d picks",
            made_so_far,
            " ".join(f"{x * 100:.2f}" for x in state.spreads()),
            window,
            len(picks),
        )
    return picks, shedding


def _exchanges_first(
    history: History,
    f: np.ndarray,
    price: Price,
    picks: list[tuple[float, int, int]],
    limit: int,
) -> bool:
    """With resources held: the exchanges of two units that gain :data:`EXCHANGE_FIRST` times as
    much per migration as the round's best single move per guest, made before any single move
    (one big unit out and one back in, where single moves would take many small ones that keep
    the held resources within their goal); whether any was made."""
    state = history.state
    single = max(gain / state.unit_guests[u] for gain, u, _ in picks)
    return _exchange_pairs(history, f, price, limit, EXCHANGE_FIRST * single) > 0


def _take_moves(
    history: History,
    picks: list[tuple[float, int, int]],
    price: Price,
    objective: float,
    limit: int,
) -> int:
    """Make the round's ``picks`` that pay for themselves (against the round's ``objective``);
    how many. Moves chosen in one round see each other only through their disjoint nodes: the
    round is kept short enough that later picks are not based on a stale picture."""
    state = history.state
    chosen: list[tuple[int, int]] = []
    for gain, u, t in picks[: max(4, len(state.cluster.nodes) // 8)]:
        if len(history) + len(chosen) >= limit:
            break
        # Each move was allowed on the round's loads: together they must keep the held too.
        if price.move_pays(state, u, gain, objective) and keeps_held_after(
            state, [*chosen, (u, t)]
        ):
            chosen.append((u, t))
    history.record_all(chosen, StepKind.BALANCE)
    return len(chosen)


def _exchange_pairs(
    history: History, f: np.ndarray, price: Price, limit: int, above: float = -np.inf
) -> int:
    """A local optimum for single moves: exchanges of two units, from the nodes that deviate
    most, when both migrations pay for themselves (and score above ``above``); how many moves
    they made. The best exchange from each of those nodes, best first; a node already in an
    exchange this round is left out (so every gain stays exact), and an exchange that would
    touch one is looked for again without it (and made whatever it scores)."""
    state = history.state
    units, n_nodes = state.units, len(state.cluster.nodes)
    mean_f = f[state.usable].mean(axis=0)
    dev = np.abs(f - mean_f) @ state.steer_weights
    dev = np.where(state.usable, dev, -1.0)
    signed = (f - mean_f) * state.steer_weights[None, :]
    busy = np.zeros(n_nodes, dtype=bool)
    ranked: dict[bytes, list[int]] = {}

    def exchange(a: int, floor: float = -np.inf) -> tuple[float, float, int, int] | None:
        return _best_exchange(state, price, a, signed, busy, ranked, floor)

    heads = np.argsort(-dev, kind="stable")[: max(4, n_nodes // SWAP_NODES_PER)].tolist()
    # Only the exchanges scoring above ``above`` are looked for (their constraints checked).
    offers = [(o, a) for a in heads if (o := exchange(a, above)) is not None]
    offers.sort(key=lambda o: (-o[0][0], o[1]))
    made = 0
    for found, a in offers:
        if len(history) + 2 > limit or busy[a]:
            continue
        if busy[units.assign[found[3]]]:
            again = exchange(a)
            if again is None:
                continue
            found = again
        _, _, x, y = found
        b = int(units.assign[y])
        if not keeps_held_after(state, [(x, b), (y, a)]):
            continue
        busy[[a, b]] = True
        history.record_all([(x, b), (y, a)], StepKind.SWAP)
        made += 2
    return made


def _best_exchange(
    state: BalanceState,
    price: Price,
    a: int,
    signed: np.ndarray,
    busy: np.ndarray,
    ranked: dict[bytes, list[int]],
    above: float = -np.inf,
) -> tuple[float, float, int, int] | None:
    """The best exchange (score, gain, unit on ``a``, unit elsewhere) of node ``a`` with the
    nodes that deviate most the other way (``signed``: each node's weighted deviation), usable
    and not ``busy``, scoring above ``above``, if it pays. ``ranked`` keeps the ranking of the
    partners by the sign of the deviation (the same for every node that deviates the same
    way)."""
    sign = np.sign(signed[a])
    if (order := ranked.get(sign.tobytes())) is None:
        opposite = -(signed @ sign)
        order = np.argsort(-opposite, kind="stable").tolist()
        ranked[sign.tobytes()] = order
    free = (state.usable & ~busy).tolist()
    # The first few in the ranking: stop there rather than filter every node.
    n_partners = min(8, len(state.cluster.nodes) - 1)
    partners = np.array(
        list(islice((n for n in order if free[n] and n != a), n_partners)), dtype=np.intp
    )
    found = state.best_swap(a, partners, above)
    if found is None or not price.exchange_pays(state, found[2:], found[1]):
        return None
    return found


def _exchange_sets(history: History, price: Price, limit: int) -> int:
    """No move and no pair pays: exchanges of a unit against a set of units, evaluated
    together; how many moves they made."""
    state = history.state

    def pays(e: SetExchange) -> bool:
        return price.exchange_pays(state, (e.unit, *e.others), e.gain)

    made = 0
    heads = max(4, len(state.cluster.nodes) // SWAP_NODES_PER)
    for e in set_round(state, heads, pays, limit - len(history)):
        if not keeps_held_after(state, [(e.unit, e.b), *((y, e.a) for y in e.others)]):
            continue
        history.record_all([(e.unit, e.b), *((y, e.a) for y in e.others)], StepKind.SET_EXCHANGE)
        made += 1 + len(e.others)
    return made
