"""Proxmox's node selection, as ``proxmox-resource-scheduling`` computes it (``node.rs``,
``scheduler.rs``) — the one place for ``opendrs pve decide`` (:mod:`opendrs.compat.pve`) and the
``pve-bruteforce``/``pve-topsis`` strategies (:mod:`opendrs.engine.strategies.pve`).

The rules, defined once here: a node's load is ``(cpu/maxcpu + mem/maxmem) / 2``; the imbalance
is the coefficient of variation of the node loads (÷ √(N−1) since crate 2.1.0); a move takes
its load off its source, floored at 0, and adds it to its target; brute force picks the lowest
imbalance after the move, truncated to 1e-15 (:func:`truncate_imbalance`), ties to the smallest
``(leader, source, target)``; TOPSIS ranks each move's post-move cluster ``[1 + RMS cpu,
1 + max cpu, 1 + RMS mem, 1 + max mem]`` with :data:`TOPSIS_WEIGHTS`, ties to the first.

Two evaluations of that arithmetic:

* **the crate's own** — :class:`NodeStats`, :func:`node_imbalance`,
  :func:`score_nodes_to_start_service` and the ``select_best_migration_*`` functions over
  :class:`MigrationCandidate` moves. The floating-point operations keep the crate's order, so
  that ``pve decide`` agrees with Proxmox's answers to the last bit (the truncation to 1e-15
  decides ties on those bits);
* **batched** — numpy arrays over every node and candidate at once, the sums updated
  incrementally (:func:`cv_after_moves`, :func:`topsis_alternatives`), so that a strategy scores
  100,000 guests' moves in one pass; with the cluster's resource weights when they differ
  (:func:`pve_weights`). Its results agree with the crate's to rounding, not to the bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from opendrs.engine.mcdm import topsis_rank, topsis_scores
from opendrs.model.cluster import Cluster

__all__ = [
    "TOPSIS_WEIGHTS",
    "MigrationCandidate",
    "NodeStats",
    "combine",
    "combined_loads",
    "cv_after_move",
    "cv_after_moves",
    "fraction_shift",
    "fractions_of",
    "load_cv",
    "node_imbalance",
    "pve_imbalance",
    "pve_topsis_alternative",
    "pve_weights",
    "scale_of",
    "score_migrations_bruteforce",
    "score_nodes_to_start_service",
    "select_best_migration_bruteforce",
    "select_best_migration_topsis",
    "sort_scored_migrations",
    "stats_with_migration",
    "topsis_alternatives",
    "topsis_weights",
    "truncate_imbalance",
]

#: Proxmox's TOPSIS criteria weights (``PVE_HA_TOPSIS_CRITERIA``, scheduler.rs): average (RMS)
#: cpu, highest cpu, average (RMS) memory, highest memory — all minimised.
TOPSIS_WEIGHTS: tuple[float, float, float, float] = (-1.0, -2.0, -5.0, -10.0)


@dataclass
class NodeStats:
    """``NodeStats`` (node.rs): cpu in cores, memory in bytes."""

    cpu: float
    maxcpu: int
    mem: int
    maxmem: int

    def add_started(self, maxcpu: float, maxmem: int) -> None:
        """``add_started_resource``: a maxcpu of 0 means "no limit", i.e. the node's maxcpu."""
        self.cpu = self.cpu + (float(self.maxcpu) if maxcpu == 0.0 else maxcpu)
        self.mem = self.mem + maxmem

    def add_running(self, cpu: float, mem: int) -> None:
        """``add_running_resource``."""
        self.cpu = self.cpu + cpu
        self.mem = self.mem + mem

    def remove_running(self, cpu: float, mem: int) -> None:
        """``remove_running_resource``, floored at 0."""
        self.cpu = max(0.0, self.cpu - cpu)
        self.mem = max(0, self.mem - mem)

    def cpu_load(self) -> float:
        """cpu / maxcpu."""
        return self.cpu / float(self.maxcpu)

    def mem_load(self) -> float:
        """mem / maxmem."""
        return float(self.mem) / float(self.maxmem)

    def load(self) -> float:
        """(cpu load + memory load) / 2."""
        return (self.cpu_load() + self.mem_load()) / 2.0

    def copy(self) -> NodeStats:
        """A copy."""
        return NodeStats(self.cpu, self.maxcpu, self.mem, self.maxmem)


def node_imbalance(stats: Sequence[NodeStats], *, normalized: bool = False) -> float:
    """``calculate_node_imbalance``: coefficient of variation of the node loads.

    ``load = (cpu/maxcpu + mem/maxmem) / 2``; I = population σ / mean, or 0 when
    all loads are 0. With ``normalized`` it is divided by √(N−1) as in
    proxmox-resource-scheduling 2.1.0 (0 for a single node); the Proxmox test
    logs, and the thresholds here, use the raw value.
    """
    count = len(stats)
    if count == 0:
        return 0.0
    loads = [s.load() for s in stats]
    load_sum = 0.0
    for load in loads:
        load_sum = load_sum + load
    if load_sum == 0.0:
        return 0.0
    mean = load_sum / count
    squared = 0.0
    for load in loads:
        squared = squared + (load - mean) * (load - mean)
    value = math.sqrt(squared / count) / mean
    if normalized:
        return 0.0 if count < 2 else value / math.sqrt(count - 1)
    return value


def truncate_imbalance(value: float | np.ndarray) -> np.ndarray:
    """``trunc(1e15 · I) / 1e15``, the brute-force comparison precision (element-wise)."""
    return np.trunc(np.multiply(value, 1e15)) / 1e15


def pve_topsis_alternative(stats: Sequence[NodeStats]) -> list[float]:
    """``[1+RMS cpu load, 1+max cpu load, 1+RMS mem load, 1+max mem load]`` (scheduler.rs)."""
    highest_cpu = squares_cpu = highest_mem = squares_mem = 0.0
    for s in stats:
        cpu = s.cpu_load()
        highest_cpu = max(highest_cpu, cpu)
        squares_cpu = squares_cpu + cpu * cpu
        mem = s.mem_load()
        highest_mem = max(highest_mem, mem)
        squares_mem = squares_mem + mem * mem
    n = float(len(stats))
    return [
        1.0 + math.sqrt(squares_cpu / n),
        1.0 + highest_cpu,
        1.0 + math.sqrt(squares_mem / n),
        1.0 + highest_mem,
    ]


def score_nodes_to_start_service(
    nodes: Sequence[tuple[str, NodeStats]], maxcpu: float, maxmem: int
) -> dict[str, float]:
    """``scheduler.rs score_nodes_to_start_service``: TOPSIS closeness per node (higher is better).

    Each node gives one alternative: the cluster as if the service (``maxcpu``
    cores, or the node's maxcpu when 0, and ``maxmem`` bytes) were added on it.

    Raises:
        McdmError: if the TOPSIS matrix is invalid (e.g. a node without capacity).
    """
    matrix: list[list[float]] = []
    for target_index in range(len(nodes)):
        alternative = []
        for index, (_, stats) in enumerate(nodes):
            node = stats.copy()
            if index == target_index:
                node.add_started(maxcpu, maxmem)
            alternative.append(node)
        matrix.append(pve_topsis_alternative(alternative))
    if not matrix:
        return {}
    scores = topsis_scores(matrix, TOPSIS_WEIGHTS)
    return {name: float(scores[i]) for i, (name, _) in enumerate(nodes)}


@dataclass(frozen=True)
class MigrationCandidate:
    """``MigrationCandidate`` (scheduler.rs): a leader, its source, a target and the stats."""

    sid: str
    source: str
    target: str
    cpu: float
    mem: int
    members: tuple[str, ...] = ()


def stats_with_migration(
    nodes: Sequence[tuple[str, NodeStats]], candidate: MigrationCandidate
) -> list[NodeStats]:
    """``node_imbalance_with_migration``'s cluster: the candidate's stats removed from its
    source (floored at 0) and added to its target."""
    out = []
    for name, stats in nodes:
        new = stats.copy()
        if name == candidate.source:
            new.remove_running(candidate.cpu, candidate.mem)
        elif name == candidate.target:
            new.add_running(candidate.cpu, candidate.mem)
        out.append(new)
    return out


def sort_scored_migrations(
    scored: Iterable[tuple[float, MigrationCandidate]],
) -> list[tuple[float, MigrationCandidate]]:
    """Order brute-force results best first: by ``trunc(1e15·I′)/1e15``, then by the
    ``(sid, source, target)`` strings (so ``"vm:1000"`` sorts before ``"vm:200"``).

    The returned imbalances are the truncated ones.
    """
    truncated = [(float(truncate_imbalance(value)), candidate) for value, candidate in scored]
    return sorted(
        truncated, key=lambda item: (item[0], item[1].sid, item[1].source, item[1].target)
    )


def score_migrations_bruteforce(
    nodes: Sequence[tuple[str, NodeStats]], candidates: Sequence[MigrationCandidate]
) -> list[tuple[float, MigrationCandidate]]:
    """``score_best_balancing_migrations``: every candidate with its imbalance after the
    move (subtract from the source, floored at 0; add to the target), best first."""
    return sort_scored_migrations(
        (node_imbalance(stats_with_migration(nodes, candidate)), candidate)
        for candidate in candidates
    )


def select_best_migration_bruteforce(
    nodes: Sequence[tuple[str, NodeStats]], candidates: Sequence[MigrationCandidate]
) -> tuple[MigrationCandidate, float] | None:
    """Exhaustive search: the lowest truncated imbalance I′ after the move wins.

    Ties go to the smallest ``(sid, source, target)`` string tuple.
    """
    scored = score_migrations_bruteforce(nodes, candidates)
    if not scored:
        return None
    value, candidate = scored[0]
    return candidate, value


def select_best_migration_topsis(
    nodes: Sequence[tuple[str, NodeStats]], candidates: Sequence[MigrationCandidate]
) -> tuple[MigrationCandidate, float, list[float]] | None:
    """TOPSIS over the post-move clusters' load vectors; ties keep the candidate order.

    Returns the best candidate, its (untruncated) imbalance after the move and
    the closeness of every candidate.
    """
    if not candidates:
        return None
    matrix = [pve_topsis_alternative(stats_with_migration(nodes, c)) for c in candidates]
    scores = topsis_scores(matrix, TOPSIS_WEIGHTS)
    best = candidates[topsis_rank(matrix, TOPSIS_WEIGHTS)[0]]
    return best, node_imbalance(stats_with_migration(nodes, best)), [float(s) for s in scores]


# --------------------------------------------------------------------------------------------
# Batched: every node and candidate at once (numpy)


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


def combined_loads(
    node_load: np.ndarray, cap: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """(N,) each node's load: its (cpu, memory) load fractions combined (:func:`combine`)."""
    return combine(fractions_of(node_load, cap), weights)


def load_cv(values: np.ndarray) -> float:
    """The coefficient of variation of the node loads ``values`` (N,), numpy's sums; 0 for
    fewer than two nodes or no load."""
    n = values.size
    total = float(values.sum())
    if n < 2 or total == 0.0:
        return 0.0
    mean = total / n
    return math.sqrt(float(((values - mean) ** 2).sum()) / n) / mean


def scale_of(imbalance: str, nodes: int) -> float:
    """What the raw coefficient of variation over ``nodes`` nodes is multiplied by on the
    ``imbalance`` scale: 1/√(N−1) ``normalised`` (1 for fewer than two nodes), 1 ``raw``."""
    if imbalance == "raw" or nodes < 2:
        return 1.0
    return 1.0 / math.sqrt(nodes - 1)


def pve_imbalance(fractions: np.ndarray) -> float:
    """Proxmox's node imbalance as proxmox-resource-scheduling 2.1.0 computes it: the CV of the
    nodes' ``(cpu + memory) / 2`` load fractions (``fractions`` (N, 2)) divided by √(N−1)."""
    combined = fractions.mean(axis=1)
    return load_cv(combined) * scale_of("normalised", combined.size)


def cv_after_move(
    combined: np.ndarray, usable: np.ndarray, src: int, targets: np.ndarray, shift: np.ndarray
) -> np.ndarray:
    """CV of the usable nodes' combined loads after moving a bundle from ``src`` to each target."""
    together = cv_after_moves(combined, usable, np.array([src], dtype=np.intp), shift[None, :])
    return together[0][np.asarray(targets, dtype=np.intp)]


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


def cv_after_moves(
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
