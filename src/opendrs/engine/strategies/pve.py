"""Proxmox VE's auto-rebalancer (seed 000), on opendrs's model, applied repeatedly.

Proxmox picks one migration per trigger: among every movable guest (guests kept together by a hard
positive affinity move as one bundle) and every allowed target, the move whose predicted imbalance
is lowest (``bruteforce``). The imbalance is the coefficient of variation of the node loads, where
a node's load is ``(cpu/maxcpu + mem/maxmem) / 2``; it is truncated to 1e-15 and ties go to the
smallest ``(guest, source, target)``. The move is made only if it improves the imbalance by at least
``margin`` (relative), and only while the imbalance is above ``threshold``.

``pve-bruteforce`` applies that choice repeatedly, re-predicting after each move, up to
``max_moves``. Unlike Proxmox, every hard constraint of opendrs holds — capacity included — and the
targets of a non-strict node affinity are its preferred nodes, as Proxmox restricts them.
"""

from __future__ import annotations

import math

import numpy as np

from opendrs.engine.constraints import movability
from opendrs.engine.placement import PlacementState
from opendrs.model.cluster import Cluster

from .base import Proposal, ProposedMove, cluster_imbalance, migration_cost, register

#: Proxmox's defaults (test-log scale: the plain coefficient of variation).
DEFAULT_THRESHOLD = 0.3
DEFAULT_MARGIN = 0.1
DEFAULT_MAX_MOVES = 10


def _combined(node_load: np.ndarray, cap: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(cap > 0, node_load / np.where(cap > 0, cap, 1.0), 0.0)
    return frac.mean(axis=1)


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
    base = np.where(usable, combined, 0.0)
    n = int(usable.sum())
    if n < 2:
        return np.zeros(len(targets))
    s1 = np.full(len(targets), base.sum())
    s2 = np.full(len(targets), (base**2).sum())
    if usable[src]:
        new_src = max(base[src] - shift[src], 0.0)
        s1 += new_src - base[src]
        s2 += new_src**2 - base[src] ** 2
    tgt_usable = usable[targets]
    old_t = base[targets]
    new_t = old_t + shift[targets]
    s1 = s1 + np.where(tgt_usable, new_t - old_t, 0.0)
    s2 = s2 + np.where(tgt_usable, new_t**2 - old_t**2, 0.0)
    mean = s1 / n
    var = np.maximum(s2 / n - mean**2, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, np.sqrt(var) / np.where(mean > 0, mean, 1.0), 0.0)


def _trunc(value: float) -> float:
    return math.trunc(value * 1e15) / 1e15


@register("pve-bruteforce", "Proxmox auto-rebalance: best single move by imbalance, repeated")
def propose_bruteforce(
    cluster: Cluster,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    margin: float = DEFAULT_MARGIN,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> Proposal:
    """Proxmox's bruteforce rebalancing choice, applied up to ``max_moves`` times."""
    options = {"threshold": threshold, "margin": margin, "max_moves": max_moves}
    before = cluster_imbalance(cluster)
    state = PlacementState.build(cluster)
    cons = state.constraints
    guests = cluster.guests
    cap = state.loads.capacity
    usable = cons.usable & np.all(cap > 0, axis=1)
    notes = [str(p) for p in cons.problems]
    moves: list[ProposedMove] = []
    if cluster.settings.mode == "basic":
        stopped = "basic mode counts guests only: Proxmox never rebalances in it"
        return Proposal("pve-bruteforce", (), before, before, stopped, tuple(notes), options)
    stopped = f"move limit {max_moves} reached"
    while True:
        combined = _combined(state.node_load, cap)
        imbalance = _cv(combined[usable])
        if imbalance <= threshold:
            stopped = f"imbalance {imbalance:.3f} at or below threshold {threshold:g}"
            break
        if len(moves) >= max_moves:
            break
        best: tuple[float, str, str, str, np.ndarray, int] | None = None
        seen: set[int] = set()
        for j in range(len(guests)):
            if j in seen:
                continue
            members = state.bundle(j)
            seen.update(members.tolist())
            src = int(state.assign[members[0]])
            if src < 0 or np.any(state.assign[members] != src):
                continue  # split bundle: Proxmox skips it
            if any(movability(guests[m], cluster, "balance") for m in members.tolist()):
                continue
            allowed = state.allowed(members)
            allowed[src] = False
            if not allowed.any():
                continue
            # Proxmox's targets are the node-affinity rule's top-priority nodes when any allows.
            preferred = allowed & np.all(cons.preferred[members], axis=0)
            targets = np.nonzero(preferred if preferred.any() else allowed)[0]
            demand = state.loads.demand[members[state.running[members]]].sum(axis=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                shift = np.where(cap > 0, demand[None, :] / np.where(cap > 0, cap, 1.0), 0.0)
            shift = shift.mean(axis=1)  # (N,) combined-load change where the bundle lands
            values = _cv_after_moves(combined, usable, src, targets, shift)
            leader = min(guests[m].id for m in members.tolist())
            for t, value in zip(targets.tolist(), values.tolist(), strict=True):
                key = (_trunc(value), leader, cluster.nodes[src].name, cluster.nodes[t].name)
                if best is None or key < best[:4]:
                    best = (*key, members, t)
        if best is None:
            stopped = "no movable guest has an allowed target"
            break
        value, leader, source, target, members, t = best
        if imbalance <= 0 or (imbalance - value) / imbalance < margin:
            stopped = (
                f"best move ({leader} to {target}) would bring {imbalance:.3f} to {value:.3f}, "
                f"less than the margin {margin:g}"
            )
            break
        for m in members.tolist():
            moves.append(
                ProposedMove(
                    guest=guests[m].id,
                    source=source,
                    target=target,
                    metric="cv",
                    before=imbalance,
                    after=value,
                    cost=migration_cost(guests[m], cluster.settings),
                    reason=(
                        f"imbalance {imbalance:.2f} -> {value:.2f}"
                        + (f" (with {leader})" if guests[m].id != leader else "")
                    ),
                )
            )
        state.commit(members, t)
    after = cluster_imbalance(cluster, state.assign)
    return Proposal("pve-bruteforce", tuple(moves), before, after, stopped, tuple(notes), options)
