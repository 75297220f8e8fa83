"""``incus``: Incus's automatic cluster rebalancing with its bugs fixed.

Incus (``cmd/incusd/api_cluster_rebalance.go``, issue #485)
scores every member, groups the members by CPU architecture and, in each group whose busiest and
least busy members differ enough, live-migrates VMs from the busiest member to less busy ones until
each target reaches the midpoint between the two. opendrs keeps that shape:

* **Score** of a node: ``(100 · memory fraction + 100 · cpu fraction) / 2`` in the cluster's usage
  mode (dynamic: measured use, the analogue of Incus's used memory and load average over threads;
  static: configured sizes, Incus's ``limits.*``). Incus computes it in ``uint8``, so a load above
  the thread count wraps and the sum of the two parts can pass 255 and wrap again; here it is a
  float and may exceed 100. A cluster whose resource weights differ (``Settings.weight_cpu`` /
  ``weight_memory``; a proxlb-solver scenario with ``method: memory`` weighs memory alone) scores
  ``100 · (w_cpu · cpu fraction + w_mem · memory fraction)`` with the weights summing to 1; equal
  weights give Incus's mean.
* **Groups**: the usable nodes (online, not in maintenance, with capacity) per architecture,
  visited in sorted order — Incus visits them in Go map order, which is random. A group is skipped
  when it has fewer than two members, when its busiest score is 0, or when the relative gap
  ``(S_max − S_min) / S_max · 100`` is below ``threshold`` (percent, default 20; Incus truncates it
  to an integer first, opendrs does not).
* **Source**: the busiest member of the group (ties by name), recomputed after every move — Incus
  keeps the score it had at the start of the run.
* **Candidates**: VMs on the source — containers never, as Incus only live-migrates VMs — that may
  move (:func:`~opendrs.engine.constraints.movability`: running, which Incus never checks, no local
  devices or disks, not locked, …), are not in cooldown (``cooldown_until[guest] > now``; Incus's
  ``volatile.rebalance.last_move`` plus ``cluster.rebalance.cooldown``) and have not moved in this
  run (a move puts a guest in cooldown, in Incus too). Guests kept together by a hard positive
  affinity move together, as one candidate. A guest's size is its load in the usage mode.
* **Target**: for each candidate, the least loaded member of the group that passes every hard
  constraint for it (ties by name) and scores below the source — Incus's project restrictions and
  placement scriptlet become opendrs's constraints.
* **Fit**: a candidate fits when its target's predicted score, with the candidate's cpu *and*
  memory added where they belong (Incus's rebalancing code builds that impact as
  ``ServerUsage{MemoryUsage: cpuUsage, CPUUsage: memUsage}``, the two swapped), stays below the
  midpoint ``(S_src + S_tgt) / 2`` of the current scores; reaching it is too much (Incus: ``>=``
  skips). Incus fixes the midpoint with the scores of the run's start and tracks a running score
  per target; opendrs rescores after each move, which is the same for the first move and never
  lets a later one overshoot the current state. Of the fitting candidates the one
  with the largest impact on its target goes first (ties by guest id): the biggest step that does
  not overshoot — Incus takes them in database order. A candidate without an allowed target or
  that does not fit is skipped, and so is one that would change no score; nothing aborts the run
  (in Incus, any error does).
* **Batch**: at most ``max_moves`` moves (default 1) per run, across all architectures together,
  as Incus's ``cluster.rebalance.batch``; a bundle is one move. After each move the group is scored
  again and the next move is sought in the same architecture until its gap falls below the
  threshold, no candidate fits, or the batch is spent; then the next architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from opendrs.engine.placement import PlacementState
from opendrs.engine.pve_selection import fractions_of, pve_weights
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster

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
)
from .pve import Bundle, movable_bundles

NAME = "incus"
DEFAULT_THRESHOLD = 20.0
DEFAULT_MAX_MOVES = 1


def server_scores(
    node_load: np.ndarray, cap: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """(N,) Incus's server score, in float: the mean of the memory and cpu fractions × 100, or
    their mean weighted by ``weights`` (cpu, memory; summing to 1)."""
    frac = fractions_of(node_load, cap)
    if weights is not None:
        return 100.0 * (weights[0] * frac[:, 0] + weights[1] * frac[:, 1])
    return 100.0 * (frac[:, 0] + frac[:, 1]) / 2.0


def relative_gap(scores: np.ndarray) -> float:
    """``(max − min) / max · 100`` of some scores; 0 when the busiest is idle or no score."""
    if scores.size == 0:
        return 0.0
    top = float(scores.max())
    return 0.0 if top <= 0 else (top - float(scores.min())) / top * 100.0


def _by_name(cluster: Cluster, nodes: np.ndarray) -> np.ndarray:
    names = np.array([cluster.nodes[n].name for n in nodes.tolist()], dtype=object)
    return nodes[np.argsort(names, kind="stable")]


def propose_incus(view: CycleView, request: Request, options: IncusOptions) -> Proposal:
    """Incus's rebalancing run, fixed (see the module docstring), on the view's constraints
    (the request's forbidden placements refused as well) and its balance loads.

    ``options.threshold``: the relative gap in percent between the busiest and the least busy
    member of an architecture below which that architecture is left alone; ``max_moves`` (the
    option when set, else the request's, else the option's default): moves at most in this run,
    all architectures together. The request's ``cooldown_until`` (per guest id, the time until
    which it may not move again) needs its ``now`` (on the same clock).

    Raises:
        ValueError: ``cooldown_until`` is given without ``now``.
    """
    cooldown_until, now = request.cooldown_until, request.now
    if cooldown_until and now is None:
        raise ValueError("incus: cooldown_until needs now (the current time on the same clock)")
    cooling = sorted(
        g for g, until in (cooldown_until or {}).items() if now is not None and until > now
    )
    max_moves: int = options.pick("max_moves", request.max_moves)
    record: dict[str, object] = {
        "threshold": options.threshold,
        "max_moves": max_moves,
        "now": now,
        "in_cooldown": cooling,
    }
    begun = start(view, request.forbidden)
    cluster = begun.cluster
    usable = begun.usable
    blocked = {cluster.guest_index[g] for g in cooling if g in cluster.guest_index}
    run = _Run(begun, options.threshold, max_moves, blocked)
    outcome: list[tuple[str, Stop]] = []
    archs = sorted({n.arch for i, n in enumerate(cluster.nodes) if usable[i]})
    for arch in archs:
        group = _by_name(
            cluster,
            np.array(
                [i for i, n in enumerate(cluster.nodes) if usable[i] and n.arch == arch],
                dtype=np.intp,
            ),
        )
        if run.made >= max_moves:
            said = f"{arch}: not visited, batch of {max_moves} spent"
            outcome.append((said, Stop("move_limit", {"arch": arch, "max_moves": max_moves})))
        elif group.size < 2:
            outcome.append((f"{arch}: fewer than 2 members", Stop("too_few_nodes", {"arch": arch})))
        else:
            outcome.append(run.rebalance(arch, group))
    if not archs:
        outcome.append(("no usable node", Stop("no_usable_node")))
    stopped = "; ".join(said for said, _ in outcome)
    stop = Stop("by_arch", {}, tuple(part for _, part in outcome))
    return Proposal(
        NAME, tuple(run.moves), begun.before, begun.imbalance(), stopped, begun.notes, record, stop
    )


class _Run:
    """One rebalancing run: the moves made so far and the guests that may not move (in
    cooldown, or moved in this run already)."""

    def __init__(self, begun: Start, threshold: float, max_moves: int, blocked: set[int]) -> None:
        self.begun = begun
        self.threshold = threshold
        self.max_moves = max_moves
        self.excluded = set(blocked)
        self.weights = pve_weights(begun.cluster)
        self.moves: list[ProposedMove] = []
        self.made = 0

    def rebalance(self, arch: str, group: np.ndarray) -> tuple[str, Stop]:
        """Moves within one architecture's ``group`` (its members by name), one at a time,
        until its gap is below the threshold, no candidate fits or the batch is spent; why it
        stopped (a sentence and a :class:`~.base.Stop`)."""
        state, cluster = self.begun.state, self.begun.cluster
        cap = state.loads.capacity
        in_group = np.zeros(len(cluster.nodes), dtype=bool)
        in_group[group] = True
        while True:
            scores = server_scores(state.node_load, cap, self.weights)
            src = int(group[np.argmax(scores[group])])  # the first by name among equals
            gap = relative_gap(scores[group])
            node = cluster.nodes[src].name
            if float(scores[src]) <= 0:
                return f"{arch}: busiest member {node} is idle", Stop(
                    "idle", {"arch": arch, "node": node}
                )
            if gap < self.threshold:
                figures: dict[str, float | str] = {
                    "arch": arch,
                    "measure": "gap",
                    "unit": "%",
                    "value": gap,
                }
                figures["threshold"] = self.threshold
                return (
                    f"{arch}: gap {gap:.1f}% below threshold {self.threshold:g}%",
                    Stop("below_threshold", figures),
                )
            if self.made >= self.max_moves:
                said = f"{arch}: batch of {self.max_moves} spent"
                return said, Stop("move_limit", {"arch": arch, "max_moves": self.max_moves})
            best = _best_candidate(state, cluster, src, scores, in_group, self.excluded)
            if best is None:
                return (
                    f"{arch}: no VM on {node} fits below a target's midpoint",
                    Stop("no_fitting_move", {"arch": arch, "node": node}),
                )
            self.move(arch, group, src, scores, best)

    def move(
        self,
        arch: str,
        group: np.ndarray,
        src: int,
        scores: np.ndarray,
        best: tuple[Bundle, int, float, float],
    ) -> None:
        """Commit the chosen candidate and record its moves, with the group's gap before and
        after (``scores``: the nodes' scores before)."""
        state, cluster = self.begun.state, self.begun.cluster
        bundle, t, midpoint, predicted = best
        gap = relative_gap(scores[group])
        source, target = cluster.nodes[src].name, cluster.nodes[t].name
        state.commit(bundle.members, t)
        self.excluded.update(bundle.members.tolist())
        self.made += 1
        after_scores = server_scores(state.node_load, state.loads.capacity, self.weights)
        reason = (
            f"{arch} gap {gap:.1f}%: {source} score {float(scores[src]):.1f} -> "
            f"{after_scores[src]:.1f}, {target} {scores[t]:.1f} -> {predicted:.1f} "
            f"(midpoint {midpoint:.1f})"
        )
        self.moves += bundle_moves(
            cluster,
            bundle.members.tolist(),
            bundle.leader,
            source,
            target,
            metric="gap",
            before=gap,
            after=relative_gap(after_scores[group]),
            reason=reason,
        )


def _best_candidate(
    state: PlacementState,
    cluster: Cluster,
    src: int,
    scores: np.ndarray,
    in_group: np.ndarray,
    excluded: set[int],
) -> tuple[Bundle, int, float, float] | None:
    """The fitting candidate with the largest impact: (bundle, target, midpoint, predicted)."""
    guests = cluster.guests
    cap = state.loads.capacity
    weights = pve_weights(cluster)
    best: tuple[float, str, Bundle, int, float, float] | None = None
    for bundle in movable_bundles(state, cluster):
        if bundle.src != src:
            continue
        members = bundle.members.tolist()
        if any(guests[m].kind != "vm" or m in excluded for m in members):
            continue
        allowed = state.allowed(bundle.members) & in_group & (scores < scores[src])
        allowed[src] = False
        if not allowed.any():
            continue
        candidates = _by_name(cluster, np.nonzero(allowed)[0])
        t = int(candidates[np.argmin(scores[candidates])])
        demand = state.loads.demand[bundle.members[state.running[bundle.members]]].sum(axis=0)
        load = state.node_load[t] + demand
        predicted = float(server_scores(load[None, :], cap[t][None, :], weights)[0])
        impact = predicted - float(scores[t])
        midpoint = (float(scores[src]) + float(scores[t])) / 2.0
        if impact <= 0 or predicted >= midpoint:
            continue
        key = (-round(impact, 12), bundle.leader)
        if best is None or key < best[:2]:
            best = (*key, bundle, t, midpoint, predicted)
    if best is None:
        return None
    return best[2], best[3], best[4], best[5]


@dataclass(frozen=True)
class IncusOptions(StrategyOptions):
    """``incus``'s options (see :func:`propose_incus`)."""

    percents: ClassVar[frozenset[str]] = frozenset({"threshold"})

    threshold: float = DEFAULT_THRESHOLD
    max_moves: int = DEFAULT_MAX_MOVES


class Incus:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = NAME
    summary = "Incus rebalancing: busiest member to the least busy, up to the midpoint, per arch"
    Options = IncusOptions

    def propose(self, view: CycleView, request: Request, options: IncusOptions) -> Proposal:
        return propose_incus(view, request, options)


STRATEGIES: tuple[Strategy, ...] = (Incus(),)
