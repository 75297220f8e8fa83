"""Proxmox VE's auto-rebalancer (its RFC), on opendrs's model, applied repeatedly.

Proxmox picks one migration per trigger among every movable guest (guests kept together by a hard
positive affinity move as one bundle) and every allowed target. Two selection methods exist
(``proxmox-resource-scheduling`` ``scheduler.rs``; their arithmetic, batched, is
:mod:`opendrs.engine.pve_selection`'s, which ``opendrs pve decide`` shares):

* ``bruteforce`` — the move whose predicted imbalance is lowest. The imbalance is the coefficient
  of variation of the node loads, where a node's load is ``(cpu/maxcpu + mem/maxmem) / 2``; it is
  truncated to 1e-15 and ties go to the smallest ``(guest, source, target)``.
* ``topsis`` — each candidate's post-move cluster becomes one TOPSIS alternative
  ``[1 + RMS cpu, 1 + max cpu, 1 + RMS mem, 1 + max mem]`` over the nodes' load fractions, with
  weights −1, −2, −5, −10 (all minimised); the best closeness wins and ties keep the candidate
  order (leaders sorted, then targets sorted).

Either way the move is made only if it improves the imbalance by at least ``margin`` (relative),
and only while the imbalance is above ``threshold``.

**Resource weights.** Proxmox weighs cpu and memory equally. A cluster whose
``Settings.weight_cpu/weight_memory`` differ (a proxlb-solver scenario with ``method: memory``
weighs memory alone) gets the weighted mean ``w_cpu · cpu + w_mem · mem`` (weights summing to 1)
as a node's load, and TOPSIS criteria weights scaled by ``2 · w`` per resource: ``(−1, −2)·2w_cpu``
and ``(−5, −10)·2w_mem``. With equal weights both are Proxmox's, bit for bit.

``pve-bruteforce`` and ``pve-topsis`` apply that choice repeatedly, re-predicting after each move,
up to ``max_moves``. Unlike Proxmox, every hard constraint of opendrs holds — capacity included.
Only usable nodes (online, not in maintenance, with capacity) take part in the figures.

**What a Proxmox VE 9.1+ operator gets** (pve-ha-manager 5.2.0 ``Manager.pm``,
proxmox-resource-scheduling 2.1.0), which the defaults follow:

* ``scope: ha`` — only HA resources in the state ``started`` are moved (``Manager.pm``
  ``get_active_stationary_resource_bundles``, lines 145-178), as bundles of strict positive
  partners keyed by their alphabetically first started member; partners that are not started
  add no load to the bundle's figures and move along. ``scope: all`` moves every guest, as the
  original proposal did (a cluster without HA information, such as a proxlb-solver scenario).
* targets only on the top-priority tier of the bundle's node affinity, less the nodes of its
  negative partners and its own node (lines 197-205): no fallback to a lower tier.
* ``imbalance: normalised`` — the coefficient of variation divided by √(N−1), a value in 0..1,
  as ``calculate_node_imbalance`` computes it since proxmox-resource-scheduling 2.1.0, against
  the threshold pve-cluster 9.1.5 stores in percent (30 %). ``imbalance: raw`` is the plain
  coefficient of variation of crate 2.0, which pve-ha-manager's own test logs print (and
  ``opendrs pve decide`` answers on). The margin is relative, the same on both scales.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from opendrs.engine.constraints import movability
from opendrs.engine.mcdm import topsis_scores
from opendrs.engine.placement import PlacementState
from opendrs.engine.pve_selection import (
    combine,
    combined_loads,
    cv_after_move,
    cv_after_moves,
    fraction_shift,
    fractions_of,
    load_cv,
    pve_weights,
    scale_of,
    topsis_alternatives,
    topsis_weights,
    truncate_imbalance,
)
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster

from .base import (
    Proposal,
    ProposedMove,
    Request,
    Stop,
    Strategy,
    StrategyOptions,
    bundle_moves,
    start,
    usable_nodes,
)

#: Proxmox's defaults: 30 % and 10 % (pve-cluster 9.1.5 ``DataCenterConfig.pm``), as fractions.
DEFAULT_THRESHOLD = 0.3
DEFAULT_MARGIN = 0.1
DEFAULT_MAX_MOVES = 10

#: Which guests move: HA resources in the state ``started`` (Proxmox), or every guest.
SCOPES = ("ha", "all")
#: The imbalance's scale: ÷√(N−1) (proxmox-resource-scheduling 2.1.0), or the raw CV (2.0).
IMBALANCES = ("normalised", "raw")


@dataclass(frozen=True)
class PveOptions(StrategyOptions):
    """The options of ``pve-bruteforce`` and ``pve-topsis`` (Proxmox's own defaults)."""

    fractions: ClassVar[frozenset[str]] = frozenset({"threshold", "margin"})

    threshold: float = DEFAULT_THRESHOLD
    margin: float = DEFAULT_MARGIN
    max_moves: int = DEFAULT_MAX_MOVES
    #: ``ha``: HA resources in the state ``started`` (Proxmox); ``all``: every guest.
    scope: str = "ha"
    #: ``normalised``: CV ÷ √(N−1) (proxmox-resource-scheduling 2.1.0); ``raw``: the CV (2.0).
    imbalance: str = "normalised"

    def check(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope: expected ha or all, got {self.scope!r}")
        if self.imbalance not in IMBALANCES:
            raise ValueError(f"imbalance: expected normalised or raw, got {self.imbalance!r}")
        if self.threshold > 1 and self.imbalance == "normalised":
            raise ValueError(
                f"threshold: {self.threshold:g} is above 1, the most a normalised imbalance "
                f"reaches; write the fraction 0.3 for Proxmox's 30 %"
            )


# --------------------------------------------------------------------------------------------
# Candidates shared by both methods


@dataclass(frozen=True)
class Bundle:
    """A movable bundle: its alphabetically first member (the leader), members and source."""

    leader: str
    members: np.ndarray
    src: int


def started_members(cluster: Cluster, scope: str) -> np.ndarray:
    """(G,) the guests that lead and weigh a bundle: HA resources in the state ``started``
    (``scope`` ``ha``; an HA guest whose state is not known counts as started when it runs), or
    every guest (``all``)."""
    if scope == "all":
        return np.ones(len(cluster.guests), dtype=bool)
    return np.array(
        [
            g.ha and (g.ha_state or ("started" if g.state == "running" else "")) == "started"
            for g in cluster.guests
        ],
        dtype=bool,
    )


def movable_bundles(
    state: PlacementState, cluster: Cluster, started: np.ndarray | None = None
) -> list[Bundle]:
    """Movable bundles, leaders sorted (Proxmox keys a bundle by its first started member's sid).

    ``started`` (G,) marks the guests that make a bundle (all guests without it); a bundle with
    none is left alone, and its other members move along with it. A bundle is skipped when its
    members are split over several nodes or on no node (Proxmox skips it), or when a started
    member may not move for balancing, or another one not even for an evacuation.
    """
    guests = cluster.guests
    started = np.ones(len(guests), dtype=bool) if started is None else started
    out: list[Bundle] = []
    seen: set[int] = set()
    for j in range(len(guests)):
        if j in seen:
            continue
        members = state.bundle(j)
        seen.update(members.tolist())
        leaders = [guests[m].id for m in members.tolist() if started[m]]
        if not leaders:
            continue
        src = int(state.assign[members[0]])
        if src < 0 or np.any(state.assign[members] != src):
            continue
        # partners that are not started move along as an evacuation would move them
        if any(
            movability(guests[m], cluster, "balance" if started[m] else "evacuate")
            for m in members.tolist()
        ):
            continue
        out.append(Bundle(min(leaders), members, src))
    out.sort(key=lambda b: b.leader)
    return out


def _targets(state: PlacementState, bundle: Bundle) -> np.ndarray:
    """The bundle's targets, sorted by node name: the nodes of the top priority tier of its node
    affinity that allow it, less its own — no fallback to a lower tier (``Manager.pm``
    ``get_resource_migration_candidates``); negative partners' nodes are not allowed."""
    allowed = state.allowed(bundle.members)
    allowed[bundle.src] = False
    preferred = allowed & np.all(state.constraints.preferred[bundle.members], axis=0)
    targets = np.nonzero(preferred)[0]
    names = [state.cluster.nodes[t].name for t in targets.tolist()]
    return targets[np.argsort(np.array(names, dtype=object), kind="stable")]


def _bundle_demand(
    state: PlacementState, members: np.ndarray, started: np.ndarray | None = None
) -> np.ndarray:
    """Balance load (R,) the bundle's running (and, given ``started``, started) members carry."""
    counted = state.running[members]
    if started is not None:
        counted = counted & started[members]
    return state.loads.demand[members[counted]].sum(axis=0)


# --------------------------------------------------------------------------------------------
# pve-bruteforce


@dataclass(frozen=True)
class _Choice:
    """The move a Proxmox method picks in one round."""

    members: np.ndarray
    leader: str
    src: int
    target: int
    #: The imbalance after the move (on the strategy's scale).
    value: float
    #: For the messages: " by TOPSIS" and ", closeness 0.984", or empty.
    label: str = ""
    extra: str = ""
    #: Prefix of the move's reason.
    why: str = ""


@dataclass(frozen=True)
class _Round:
    """What one round's choice reads besides the placement: the guests that make bundles and
    the imbalance's scale (:func:`scale_of`)."""

    started: np.ndarray
    scale: float


Chooser = Callable[[PlacementState, np.ndarray, np.ndarray, np.ndarray, _Round], "_Choice | None"]


def _repeat(
    view: CycleView,
    request: Request,
    options: PveOptions,
    name: str,
    choose: Chooser,
) -> Proposal:
    """Proxmox's auto-rebalance round, repeated on ``view`` (:func:`_rounds`) up to the most
    moves (``options``'s, or ``request``'s unless the option is set). Basic mode never
    rebalances. The placements ``request`` forbids are refused on top of the view's constraints
    (:func:`~.base.start`)."""
    max_moves = options.pick("max_moves", request.max_moves)
    values = {**options.values(), "max_moves": max_moves}
    begun = start(view, request.forbidden)
    if begun.cluster.settings.mode == "basic":
        stopped = "basic mode counts guests only: Proxmox never rebalances in it"
        return Proposal(
            name, (), begun.before, begun.before, stopped, begun.notes, values, Stop("basic_mode")
        )
    moves, stopped, stop = _rounds(begun.state, options, max_moves, choose)
    return Proposal(
        name, tuple(moves), begun.before, begun.imbalance(), stopped, begun.notes, values, stop
    )


def _rounds(
    state: PlacementState, options: PveOptions, max_moves: int, choose: Chooser
) -> tuple[list[ProposedMove], str, Stop]:
    """The rounds on ``state`` (committed to as they go): while the imbalance is above the
    threshold, make the move ``choose(state, capacity, usable, combined loads, round)`` picks if
    it improves the imbalance by the margin (relative), up to ``max_moves``. The moves, and why
    the rounds stopped (a sentence and a :class:`~.base.Stop`)."""
    cluster = state.cluster
    threshold, margin, scope = options.threshold, options.margin, options.scope
    cap = state.loads.capacity
    usable = usable_nodes(state)
    moves: list[ProposedMove] = []
    weights = pve_weights(cluster)
    scale = scale_of(options.imbalance, int(usable.sum()))
    round_ = _Round(started_members(cluster, scope), scale)
    while True:
        combined = combined_loads(state.node_load, cap, weights)
        imbalance_now = load_cv(combined[usable]) * round_.scale
        figures: dict[str, float | str] = {
            "measure": "imbalance",
            "unit": "",
            "value": imbalance_now,
        }
        if imbalance_now <= threshold:
            return (
                moves,
                f"imbalance {imbalance_now:.3f} at or below threshold {threshold:g}",
                Stop("below_threshold", {**figures, "threshold": threshold}),
            )
        if len(moves) >= max_moves:
            stop = Stop("move_limit", {"max_moves": max_moves})
            return moves, f"move limit {max_moves} reached", stop
        choice = choose(state, cap, usable, combined, round_)
        if choice is None:
            who = "started HA resource" if scope == "ha" else "movable guest"
            stop = Stop("no_allowed_target", {"scope": scope})
            return moves, f"no {who} has an allowed target", stop
        source, target = cluster.nodes[choice.src].name, cluster.nodes[choice.target].name
        value = choice.value
        if imbalance_now <= 0 or (imbalance_now - value) / imbalance_now < margin:
            return (
                moves,
                f"best move{choice.label} ({choice.leader} to {target}{choice.extra}) would bring "
                f"{imbalance_now:.3f} to {value:.3f}, less than the margin {margin:g}",
                Stop(
                    "gain_below_margin",
                    {**figures, "after": value, "margin": margin}
                    | {"guest": choice.leader, "target": target},
                ),
            )
        moves += bundle_moves(
            cluster,
            choice.members.tolist(),
            choice.leader,
            source,
            target,
            metric="cv",
            before=imbalance_now,
            after=value,
            reason=f"{choice.why}imbalance {imbalance_now:.2f} -> {value:.2f}",
        )
        state.commit(choice.members, choice.target)


def _choose_bruteforce(
    state: PlacementState,
    cap: np.ndarray,
    usable: np.ndarray,
    combined: np.ndarray,
    round_: _Round,
) -> _Choice | None:
    """Lowest truncated imbalance after the move; ties to the smallest (leader, source, target).

    Every (bundle, node) pair is scored at once as if every node allowed every bundle; the pairs
    are then visited best first and the first one the constraints allow wins — the same answer
    as checking every bundle's allowed targets first, without the cost of doing so.
    """
    cluster = state.cluster
    bundles = movable_bundles(state, cluster, round_.started)
    if not bundles:
        return None
    n_nodes = len(cluster.nodes)
    demand = np.array([_bundle_demand(state, b.members, round_.started) for b in bundles]).reshape(
        len(bundles), -1
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        per = np.where(cap[None, :, :] > 0, demand[:, None, :] / np.where(cap > 0, cap, 1.0), 0.0)
    shift = combine(per, pve_weights(cluster))  # (B, N)
    src = np.array([b.src for b in bundles], dtype=np.intp)
    values = cv_after_moves(combined, usable, src, shift) * round_.scale  # (B, N)
    values[np.arange(len(bundles)), src] = np.inf  # a move stays off its own node
    truncated = truncate_imbalance(values)
    flat = truncated.ravel()
    order = np.argsort(flat, kind="stable")
    names = [n.name for n in cluster.nodes]
    allowed: dict[int, frozenset[int]] = {}
    i = 0
    while i < order.size and np.isfinite(flat[order[i]]):
        j = i
        while j < order.size and flat[order[j]] == flat[order[i]]:
            j += 1
        group = sorted(
            (bundles[k // n_nodes].leader, names[src[k // n_nodes]], names[k % n_nodes], k)
            for k in order[i:j].tolist()
        )
        for _leader, _source, _target, k in group:
            b, t = divmod(k, n_nodes)
            if b not in allowed:
                allowed[b] = frozenset(_targets(state, bundles[b]).tolist())
            if t in allowed[b]:
                bundle = bundles[b]
                return _Choice(bundle.members, bundle.leader, bundle.src, t, float(flat[k]))
        i = j
    return None


def propose_bruteforce(view: CycleView, request: Request, options: PveOptions) -> Proposal:
    """Proxmox's bruteforce rebalancing choice, applied up to the most moves, on ``view``'s
    models (its constraints, with the placements ``request`` forbids refused, and its loads)."""
    return _repeat(view, request, options, "pve-bruteforce", _choose_bruteforce)


# --------------------------------------------------------------------------------------------
# pve-topsis


def _choose_topsis(
    state: PlacementState,
    cap: np.ndarray,
    usable: np.ndarray,
    combined: np.ndarray,
    round_: _Round,
) -> _Choice | None:
    """Best TOPSIS closeness of the post-move clusters; the first candidate on a tie."""
    bundles: list[Bundle] = []
    cand_bundle: list[int] = []
    cand_target: list[int] = []
    shifts: list[np.ndarray] = []
    for bundle in movable_bundles(state, state.cluster, round_.started):
        targets = _targets(state, bundle)
        if not targets.size:
            continue
        shifts.append(fraction_shift(_bundle_demand(state, bundle.members, round_.started), cap))
        cand_bundle += [len(bundles)] * len(targets)
        cand_target += targets.tolist()
        bundles.append(bundle)
    if not bundles:
        return None
    which = np.array(cand_bundle, dtype=np.intp)
    tgt = np.array(cand_target, dtype=np.intp)
    src = np.array([bundles[b].src for b in cand_bundle], dtype=np.intp)
    shift = np.stack(shifts)  # (B, N, R)
    fractions = fractions_of(state.node_load, cap)
    matrix = topsis_alternatives(fractions, usable, src, tgt, shift[which, src], shift[which, tgt])
    weights = pve_weights(state.cluster)
    scores = topsis_scores(matrix, topsis_weights(weights))
    k = int(np.argmax(scores))  # the first of equal scores: candidate order breaks ties
    bundle = bundles[cand_bundle[k]]
    t = int(tgt[k])
    value = round_.scale * float(
        cv_after_move(
            combined, usable, bundle.src, np.array([t]), combine(shift[cand_bundle[k]], weights)
        )[0]
    )
    closeness = float(scores[k])
    return _Choice(
        bundle.members,
        bundle.leader,
        bundle.src,
        t,
        value,
        label=" by TOPSIS",
        extra=f", closeness {closeness:.3f}",
        why=f"TOPSIS closeness {closeness:.3f}, best of {len(scores)}; ",
    )


def propose_topsis(view: CycleView, request: Request, options: PveOptions) -> Proposal:
    """Proxmox's TOPSIS rebalancing choice, applied up to ``max_moves`` times.

    Per iteration, the candidates are those of ``pve-bruteforce`` (movable bundles × allowed
    targets, preferred nodes first), in Proxmox's order: leaders sorted, then targets sorted. Each
    candidate's post-move cluster gives the alternative ``[1+RMS cpu, 1+max cpu, 1+RMS mem,
    1+max mem]`` over the usable nodes' load fractions (``score_best_balancing_migrations_topsis``),
    ranked by :func:`~opendrs.engine.mcdm.topsis_scores` with weights −1, −2, −5, −10. The best
    closeness wins, the first candidate on a tie. As in Proxmox, the winner is committed only if
    the (untruncated) imbalance — the CV of the combined loads — improves by at least ``margin``.
    ``view`` and ``request`` as :func:`propose_bruteforce` reads them.
    """
    return _repeat(view, request, options, "pve-topsis", _choose_topsis)


class PveBruteforce:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = "pve-bruteforce"
    summary = "Proxmox auto-rebalance: best single move by imbalance, repeated"
    Options = PveOptions

    def propose(self, view: CycleView, request: Request, options: PveOptions) -> Proposal:
        return propose_bruteforce(view, request, options)


class PveTopsis:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = "pve-topsis"
    summary = "Proxmox auto-rebalance: best single move by TOPSIS on RMS/max load"
    Options = PveOptions

    def propose(self, view: CycleView, request: Request, options: PveOptions) -> Proposal:
        return propose_topsis(view, request, options)


STRATEGIES: tuple[Strategy, ...] = (
    PveBruteforce(),
    PveTopsis(),
)
