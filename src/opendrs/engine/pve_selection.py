"""The scheduler arithmetic of ``proxmox-resource-scheduling`` (``node.rs``, ``scheduler.rs``).

The static and dynamic usage plugins hand their node stats to this crate: :class:`NodeStats`
and its load, the node imbalance (coefficient of variation of the node loads), TOPSIS start
scoring, and the choice of a balancing migration — brute force (the lowest imbalance after the
move) or TOPSIS — among :class:`MigrationCandidate` moves. Floating-point operations keep the
crate's order, so that the answers agree with Proxmox's to the last bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opendrs.engine.mcdm import topsis_rank, topsis_scores

__all__ = [
    "PVE_TOPSIS_WEIGHTS",
    "MigrationCandidate",
    "NodeStats",
    "node_imbalance",
    "pve_topsis_alternative",
    "score_migrations_bruteforce",
    "score_nodes_to_start_service",
    "select_best_migration_bruteforce",
    "select_best_migration_topsis",
    "sort_scored_migrations",
    "stats_with_migration",
    "truncate_imbalance",
]

#: ``PVE_HA_TOPSIS_CRITERIA`` (scheduler.rs): average cpu, highest cpu, average memory,
#: highest memory — all minimised.
PVE_TOPSIS_WEIGHTS: tuple[float, float, float, float] = (-1.0, -2.0, -5.0, -10.0)


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


def truncate_imbalance(value: float) -> float:
    """``trunc(1e15 · I) / 1e15``, the brute-force comparison precision."""
    return float(math.trunc(value * 1e15)) / 1e15


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
    scores = topsis_scores(matrix, PVE_TOPSIS_WEIGHTS)
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
    truncated = [(truncate_imbalance(value), candidate) for value, candidate in scored]
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
    scores = topsis_scores(matrix, PVE_TOPSIS_WEIGHTS)
    best = candidates[topsis_rank(matrix, PVE_TOPSIS_WEIGHTS)[0]]
    return best, node_imbalance(stats_with_migration(nodes, best)), [float(s) for s in scores]
