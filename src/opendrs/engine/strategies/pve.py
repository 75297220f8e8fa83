"""Proxmox VE's auto-rebalancer (its RFC), on opendrs's model, applied repeatedly.

Proxmox picks one migration per trigger among every movable guest (guests kept together by a hard
positive affinity move as one bundle) and every allowed target. Two selection methods exist
(``proxmox-resource-scheduling`` ``scheduler.rs``):

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
up to ``max_moves``. Unlike Proxmox, every hard constraint of opendrs holds — capacity included —
and the targets of a non-strict node affinity are its preferred nodes, as Proxmox restricts them.
Only usable nodes (online, not in maintenance, with capacity) take part in the figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from opendrs.engine.constraints import Constraints, movability
from opendrs.engine.mcdm import topsis_scores
from opendrs.engine.placement import PlacementState
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import Cluster

from .base import (
    Proposal,
    ProposedMove,
    StrategyOptions,
    bundle_moves,
    cluster_imbalance,
    constraints_for,
    register_function,
)

#: Proxmox's defaults (test-log scale: the plain coefficient of variation).
DEFAULT_THRESHOLD = 0.3
DEFAULT_MARGIN = 0.1
DEFAULT_MAX_MOVES = 10

#: Proxmox's TOPSIS criteria weights (``PVE_HA_TOPSIS_CRITERIA``): average (RMS) cpu, highest cpu,
#: average (RMS) memory, highest memory — all minimised.
TOPSIS_WEIGHTS: tuple[float, float, float, float] = (-1.0, -2.0, -5.0, -10.0)


def pve_weights(cluster: Cluster) -> np.ndarray | None:
    """The cluster's (cpu, memory) weights summing to 1, or None when they are equal — then
    the plain mean is used, bit for bit as Proxmox computes it."""
    settings = cluster.settings
    w = np.array([max(settings.weight_cpu, 0.0), max(settings.weight_memory, 0.0)])
    if w[0] == w[1] or w.sum() <= 0:
        return None
    return w / w.sum()


def combine(values: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """The (cpu, memory) values along the last axis combined: their mean, or weighted mean."""
    if weights is None:
        return values.mean(axis=-1)
    return (values * weights).sum(axis=-1)


def topsis_weights(weights: np.ndarray | None) -> tuple[float, ...]:
    """:data:`TOPSIS_WEIGHTS` with the cpu and memory criteria scaled by ``2 · w``."""
    if weights is None:
        return TOPSIS_WEIGHTS
    cpu, memory = (2.0 * float(w) for w in weights)
    rms_cpu, max_cpu, rms_mem, max_mem = TOPSIS_WEIGHTS
    return (rms_cpu * cpu, max_cpu * cpu, rms_mem * memory, max_mem * memory)


def _combined(
    node_load: np.ndarray, cap: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    return combine(fractions_of(node_load, cap), weights)


def _cv(values: np.ndarray) -> float:
    n = values.size
    total = float(values.sum())
    if n < 2 or total == 0.0:
        return 0.0
    mean = total / n
    return math.sqrt(float(((values - mean) ** 2).sum()) / n) / mean


def _cv_after_moves(
    combined: np.ndarray, usable: np.ndarray, src: int, targets: np.ndarray, shift: np.ndarray
) -> np.ndarray:
    """CV of the usable nodes' combined loads after moving a bundle from ``src`` to each target."""
    together = _cv_after_all(combined, usable, np.array([src], dtype=np.intp), shift[None, :])
    return together[0][np.asarray(targets, dtype=np.intp)]


def _trunc(value: float) -> float:
    return math.trunc(value * 1e15) / 1e15


def fractions_of(node_load: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Node load fractions (N, R); 0 where a node has no capacity."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cap > 0, node_load / np.where(cap > 0, cap, 1.0), 0.0)


def fraction_shift(demand: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """(N, R): the load fraction ``demand`` (R,) adds on each node (0 without capacity)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cap > 0, demand[None, :] / np.where(cap > 0, cap, 1.0), 0.0)


def topsis_alternatives(
    fractions: np.ndarray,
    usable: np.ndarray,
    src: np.ndarray,
    tgt: np.ndarray,
    d_src: np.ndarray,
    d_tgt: np.ndarray,
) -> np.ndarray:
    """Proxmox's TOPSIS alternative for each of K moves, vectorised: shape (K, 4).

    ``fractions`` (N, 2) are the node load fractions (cpu, memory) now; move ``k`` takes the load
    fraction ``d_src[k]`` (2,) off node ``src[k]`` (floored at 0; ``src[k] = -1``: the load is on no
    node yet, as for a new guest) and adds ``d_tgt[k]`` on node ``tgt[k]``. Only ``usable`` nodes
    count. The row is ``[1 + RMS cpu, 1 + max cpu, 1 + RMS mem, 1 + max mem]`` over those nodes
    (``scheduler.rs`` ``PveTopsisAlternative``; RMS, not mean, and the maximum starts at 0).

    The sums are updated incrementally (O(K) rather than O(K·N)); the maximum over the nodes a move
    does not touch comes from the three largest fractions per resource.
    """
    k = len(tgt)
    n_res = fractions.shape[1]
    out = np.zeros((k, 2 * n_res))
    n = int(usable.sum())
    if k == 0 or n == 0:
        out[:] = 1.0
        return out
    base = np.where(usable[:, None], fractions, 0.0)
    squares = (base**2).sum(axis=0)  # (R,)
    has_src = src >= 0
    src_i = np.where(has_src, src, 0)
    src_counts = (has_src & usable[src_i])[:, None]
    tgt_counts = usable[tgt][:, None]
    old_src = base[src_i]
    new_src = np.maximum(old_src - d_src, 0.0)
    old_tgt = base[tgt]
    new_tgt = old_tgt + d_tgt
    s2 = (
        squares[None, :]
        + np.where(src_counts, new_src**2 - old_src**2, 0.0)
        + np.where(tgt_counts, new_tgt**2 - old_tgt**2, 0.0)
    )
    rms = np.sqrt(np.maximum(s2, 0.0) / n)
    # The largest fraction among the usable nodes other than the source and the target.
    ranked = np.where(usable[:, None], fractions, -np.inf)
    top = np.argsort(-ranked, axis=0, kind="stable")[:3]  # (≤3, R) node indices
    top_val = np.take_along_axis(ranked, top, axis=0)
    others = np.full((k, n_res), -np.inf)
    for level in range(top.shape[0] - 1, -1, -1):
        idx = top[level][None, :]
        free = (idx != np.where(has_src, src, -1)[:, None]) & (idx != tgt[:, None])
        others = np.where(free & np.isfinite(top_val[level])[None, :], top_val[level], others)
    highest = np.maximum(others, 0.0)
    highest = np.maximum(highest, np.where(src_counts, new_src, 0.0))
    highest = np.maximum(highest, np.where(tgt_counts, new_tgt, 0.0))
    out[:, 0::2] = 1.0 + rms
    out[:, 1::2] = 1.0 + highest
    return out


# --------------------------------------------------------------------------------------------
# Candidates shared by both methods


@dataclass(frozen=True)
class Bundle:
    """A movable bundle: its alphabetically first member (the leader), members and source."""

    leader: str
    members: np.ndarray
    src: int


def movable_bundles(state: PlacementState, cluster: Cluster) -> list[Bundle]:
    """Movable bundles, leaders sorted (Proxmox keys a bundle by its first member's sid).

    A bundle is skipped when its members are split over several nodes or on no node (Proxmox
    skips it), or when any member may not move for balancing.
    """
    guests = cluster.guests
    out: list[Bundle] = []
    seen: set[int] = set()
    for j in range(len(guests)):
        if j in seen:
            continue
        members = state.bundle(j)
        seen.update(members.tolist())
        src = int(state.assign[members[0]])
        if src < 0 or np.any(state.assign[members] != src):
            continue
        if any(movability(guests[m], cluster, "balance") for m in members.tolist()):
            continue
        out.append(Bundle(min(guests[m].id for m in members.tolist()), members, src))
    out.sort(key=lambda b: b.leader)
    return out


def _targets(state: PlacementState, bundle: Bundle) -> np.ndarray:
    """Allowed targets of a bundle (not its source), sorted by node name.

    Proxmox's targets are the node-affinity rule's top-priority nodes when any of them allows the
    bundle; the other allowed nodes only otherwise.
    """
    allowed = state.allowed(bundle.members)
    allowed[bundle.src] = False
    if not allowed.any():
        return np.zeros(0, dtype=np.intp)
    preferred = allowed & np.all(state.constraints.preferred[bundle.members], axis=0)
    targets = np.nonzero(preferred if preferred.any() else allowed)[0]
    names = [state.cluster.nodes[t].name for t in targets.tolist()]
    return targets[np.argsort(np.array(names, dtype=object), kind="stable")]


def _bundle_demand(state: PlacementState, members: np.ndarray) -> np.ndarray:
    """Balance load (R,) the bundle's running members carry."""
    return state.loads.demand[members[state.running[members]]].sum(axis=0)


def _usable(state: PlacementState) -> np.ndarray:
    return state.constraints.usable & np.all(state.loads.capacity > 0, axis=1)


# --------------------------------------------------------------------------------------------
# pve-bruteforce


@dataclass(frozen=True)
class _Choice:
    """The move a Proxmox method picks in one round."""

    members: np.ndarray
    leader: str
    src: int
    target: int
    #: The imbalance (CV) after the move.
    value: float
    #: For the messages: " by TOPSIS" and ", closeness 0.984", or empty.
    label: str = ""
    extra: str = ""
    #: Prefix of the move's reason.
    why: str = ""


def _repeat(
    cluster: Cluster,
    name: str,
    choose: Callable[[PlacementState, np.ndarray, np.ndarray, np.ndarray], _Choice | None],
    *,
    forbidden: Iterable[tuple[str, str]],
    constraints: Constraints | None,
    loads: LoadModel | None,
    threshold: float,
    margin: float,
    max_moves: int,
) -> Proposal:
    """Proxmox's auto-rebalance round, repeated: while the imbalance is above ``threshold``, make
    the move ``choose(state, capacity, usable, combined loads)`` picks if it improves the
    imbalance by ``margin`` (relative), up to ``max_moves``. Basic mode never rebalances.
    ``constraints`` and ``loads``: a cycle view's models, as :func:`propose_bruteforce` says."""
    options = {"threshold": threshold, "margin": margin, "max_moves": max_moves}
    cons = constraints_for(cluster, forbidden, constraints)
    state = PlacementState.build(cluster, cons, loads=loads)
    before = cluster_imbalance(cluster, loads=state.loads)
    cap = state.loads.capacity
    usable = _usable(state)
    notes = tuple(str(p) for p in state.constraints.problems)
    moves: list[ProposedMove] = []
    if cluster.settings.mode == "basic":
        stopped = "basic mode counts guests only: Proxmox never rebalances in it"
        return Proposal(name, (), before, before, stopped, notes, options)
    stopped = f"move limit {max_moves} reached"
    weights = pve_weights(cluster)
    while True:
        combined = _combined(state.node_load, cap, weights)
        imbalance = _cv(combined[usable])
        if imbalance <= threshold:
            stopped = f"imbalance {imbalance:.3f} at or below threshold {threshold:g}"
            break
        if len(moves) >= max_moves:
            break
        choice = choose(state, cap, usable, combined)
        if choice is None:
            stopped = "no movable guest has an allowed target"
            break
        source, target = cluster.nodes[choice.src].name, cluster.nodes[choice.target].name
        value = choice.value
        if imbalance <= 0 or (imbalance - value) / imbalance < margin:
            stopped = (
                f"best move{choice.label} ({choice.leader} to {target}{choice.extra}) would bring "
                f"{imbalance:.3f} to {value:.3f}, less than the margin {margin:g}"
            )
            break
        moves += bundle_moves(
            cluster,
            choice.members.tolist(),
            choice.leader,
            source,
            target,
            metric="cv",
            before=imbalance,
            after=value,
            reason=f"{choice.why}imbalance {imbalance:.2f} -> {value:.2f}",
        )
        state.commit(choice.members, choice.target)
    after = cluster_imbalance(cluster, state.assign, state.loads)
    return Proposal(name, tuple(moves), before, after, stopped, notes, options)


def _choose_bruteforce(
    state: PlacementState, cap: np.ndarray, usable: np.ndarray, combined: np.ndarray
) -> _Choice | None:
    """Lowest truncated imbalance after the move; ties to the smallest (leader, source, target).

    Every (bundle, node) pair is scored at once as if every node allowed every bundle; the pairs
    are then visited best first and the first one the constraints allow wins — the same answer
    as checking every bundle's allowed targets first, without the cost of doing so.
    """
    cluster = state.cluster
    bundles = movable_bundles(state, cluster)
    if not bundles:
        return None
    n_nodes = len(cluster.nodes)
    demand = np.array([_bundle_demand(state, b.members) for b in bundles]).reshape(len(bundles), -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        per = np.where(cap[None, :, :] > 0, demand[:, None, :] / np.where(cap > 0, cap, 1.0), 0.0)
    shift = combine(per, pve_weights(cluster))  # (B, N)
    src = np.array([b.src for b in bundles], dtype=np.intp)
    values = _cv_after_all(combined, usable, src, shift)  # (B, N)
    values[np.arange(len(bundles)), src] = np.inf  # a move stays off its own node
    truncated = np.trunc(values * 1e15) / 1e15
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


def _cv_after_all(
    combined: np.ndarray, usable: np.ndarray, src: np.ndarray, shift: np.ndarray
) -> np.ndarray:
    """CV of the usable nodes' combined loads after moving bundle ``b`` from ``src[b]`` to each
    node: (B, N). ``shift[b]`` is the combined load fraction the bundle adds on each node; the
    source loses its own share, floored at 0 (Proxmox). The sums are updated incrementally."""
    base = np.where(usable, combined, 0.0)
    n = int(usable.sum())
    n_bundles, n_nodes = shift.shape
    if n < 2:
        return np.zeros((n_bundles, n_nodes))
    rows = np.arange(n_bundles)
    s1 = np.full(n_bundles, base.sum())
    s2 = np.full(n_bundles, (base**2).sum())
    from_usable = usable[src]
    old_s = base[src]
    new_s = np.maximum(old_s - shift[rows, src], 0.0)
    s1 = np.where(from_usable, s1 + (new_s - old_s), s1)
    s2 = np.where(from_usable, s2 + (new_s**2 - old_s**2), s2)
    old_t = base[None, :]
    new_t = old_t + shift
    s1 = s1[:, None] + np.where(usable[None, :], new_t - old_t, 0.0)
    s2 = s2[:, None] + np.where(usable[None, :], new_t**2 - old_t**2, 0.0)
    mean = s1 / n
    var = np.maximum(s2 / n - mean**2, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, np.sqrt(var) / np.where(mean > 0, mean, 1.0), 0.0)


def propose_bruteforce(
    cluster: Cluster,
    *,
    forbidden: Iterable[tuple[str, str]] = (),
    constraints: Constraints | None = None,
    loads: LoadModel | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    margin: float = DEFAULT_MARGIN,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> Proposal:
    """Proxmox's bruteforce rebalancing choice, applied up to ``max_moves`` times.

    ``constraints`` and ``loads`` are the models a cycle view built already — its constraints
    (capacity on the usage it checks, ``forbidden`` not yet refused: :func:`constraints_for`) and
    ``cluster``'s balance loads; without them they are built from ``cluster``.
    """
    return _repeat(
        cluster,
        "pve-bruteforce",
        _choose_bruteforce,
        forbidden=forbidden,
        constraints=constraints,
        loads=loads,
        threshold=threshold,
        margin=margin,
        max_moves=max_moves,
    )


# --------------------------------------------------------------------------------------------
# pve-topsis


def _choose_topsis(
    state: PlacementState, cap: np.ndarray, usable: np.ndarray, combined: np.ndarray
) -> _Choice | None:
    """Best TOPSIS closeness of the post-move clusters; the first candidate on a tie."""
    bundles: list[Bundle] = []
    cand_bundle: list[int] = []
    cand_target: list[int] = []
    shifts: list[np.ndarray] = []
    for bundle in movable_bundles(state, state.cluster):
        targets = _targets(state, bundle)
        if not targets.size:
            continue
        shifts.append(fraction_shift(_bundle_demand(state, bundle.members), cap))
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
    value = float(
        _cv_after_moves(
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


def propose_topsis(
    cluster: Cluster,
    *,
    forbidden: Iterable[tuple[str, str]] = (),
    constraints: Constraints | None = None,
    loads: LoadModel | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    margin: float = DEFAULT_MARGIN,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> Proposal:
    """Proxmox's TOPSIS rebalancing choice, applied up to ``max_moves`` times.

    Per iteration, the candidates are those of ``pve-bruteforce`` (movable bundles × allowed
    targets, preferred nodes first), in Proxmox's order: leaders sorted, then targets sorted. Each
    candidate's post-move cluster gives the alternative ``[1+RMS cpu, 1+max cpu, 1+RMS mem,
    1+max mem]`` over the usable nodes' load fractions (``score_best_balancing_migrations_topsis``),
    ranked by :func:`~opendrs.engine.mcdm.topsis_scores` with weights −1, −2, −5, −10. The best
    closeness wins, the first candidate on a tie. As in Proxmox, the winner is committed only if
    the (untruncated) imbalance — the CV of the combined loads — improves by at least ``margin``.
    ``constraints`` and ``loads``: a cycle view's models, as :func:`propose_bruteforce` says.
    """
    return _repeat(
        cluster,
        "pve-topsis",
        _choose_topsis,
        forbidden=forbidden,
        constraints=constraints,
        loads=loads,
        threshold=threshold,
        margin=margin,
        max_moves=max_moves,
    )


@dataclass(frozen=True)
class PveOptions(StrategyOptions):
    """The options of ``pve-bruteforce`` and ``pve-topsis`` (Proxmox's own defaults)."""

    threshold: float = DEFAULT_THRESHOLD
    margin: float = DEFAULT_MARGIN
    max_moves: int = DEFAULT_MAX_MOVES


register_function(
    "pve-bruteforce",
    "Proxmox auto-rebalance: best single move by imbalance, repeated",
    PveOptions,
    propose_bruteforce,
    asks=("max_moves",),
)
register_function(
    "pve-topsis",
    "Proxmox auto-rebalance: best single move by TOPSIS on RMS/max load",
    PveOptions,
    propose_topsis,
    asks=("max_moves",),
)
