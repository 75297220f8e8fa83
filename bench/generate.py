"""A seeded generator of unbalanced clusters, the benchmarks' input.

Shape (as in the peers' measured baseline): nodes alternate between
128 cores / 768 GiB and 96 cores / 512 GiB; guests (1–32 GiB before scaling, in quarter-GiB steps,
vCPUs ≈ GiB/4 + 0–2) fill about 55 % of the memory; a quarter of the nodes (the first ones) are
drawn for 60 % of the guests. No node is filled beyond 97 % of its memory or beyond its vCPU
capacity (cores × 4.0 overcommit): a guest that does not fit its drawn node goes to the least
filled node it fits. Usage mode is ``static`` (configured sizes), no reserves, no local disks.

With ``rules=True`` about 5 % of the guests get rules that the initial placement satisfies: strict
pins to two nodes (the current one and a random one), hard anti-affinity pairs (guests on different
nodes) and hard affinity pairs (guests on the same node).

The same ``(size, seed, rules)`` always gives the same cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3
#: vCPUs per core a node may carry (the generated clusters' :class:`Settings`).
CPU_OVERCOMMIT = 4.0


@dataclass(frozen=True)
class Size:
    """A benchmark size: its name, node count and guest count."""

    name: str
    nodes: int
    guests: int


SIZES: dict[str, Size] = {
    s.name: s
    for s in (
        Size("S", 8, 200),
        Size("M", 16, 1_000),
        Size("L", 32, 3_000),
        Size("XL", 128, 20_000),
        Size("XXL", 1_000, 100_000),
    )
}

_MEMORY_GIB = np.array([1, 2, 4, 8, 16, 32])
_MEMORY_P = np.array([0.15, 0.25, 0.25, 0.2, 0.1, 0.05])


def bench_guest(
    j: int, node: str, cpu: float, memory_gib: float, util: float, disks: tuple[Disk, ...] = ()
) -> Guest:
    """Guest ``100 + j`` of a generated cluster, up for a day: its measured use a share ``util``
    of its vCPUs and half of its memory plus ``util`` of the other half."""
    return Guest(
        id=str(100 + j),
        node=node,
        cpu=float(cpu),
        memory=int(memory_gib * GiB),
        disks=disks,
        cpu_used=round(float(cpu * util), 3),
        memory_used=int(memory_gib * GiB * (0.5 + 0.5 * util)),
        uptime=86_400,
    )


def generate(size: Size | str, *, seed: int = 1, rules: bool = False) -> Cluster:
    """An unbalanced cluster of ``size`` (a :class:`Size` or a name in :data:`SIZES`).

    The same seed gives the same cluster; ``rules`` adds pins and guest (anti-)affinity pairs.
    """
    if isinstance(size, str):
        size = SIZES[size]
    rng = np.random.default_rng(seed)
    nodes = tuple(
        Node(f"pve{i + 1:04d}", 128, 768 * GiB)
        if i % 2 == 0
        else Node(f"pve{i + 1:04d}", 96, 512 * GiB)
        for i in range(size.nodes)
    )
    total_mem = sum(n.memory for n in nodes)
    memory = rng.choice(_MEMORY_GIB, size=size.guests, p=_MEMORY_P).astype(np.int64)
    scale = 0.55 * total_mem / (float(memory.sum()) * GiB)
    memory = np.maximum(1, np.round(memory * scale * 4) / 4)  # quarter-GiB steps
    cpu = np.clip(np.round(memory / 4 + rng.integers(0, 3, size.guests)), 1, 32)
    hot = max(1, size.nodes // 4)
    on_hot = rng.random(size.guests) < 0.6
    node_idx = np.where(
        on_hot, rng.integers(0, hot, size.guests), rng.integers(hot, size.nodes, size.guests)
    )
    # Keep every node within 97 % of its memory and within its vCPU capacity (cores × overcommit):
    # a guest that does not fit its drawn node goes to the node with the lowest memory fraction
    # among those it fits.
    used = np.zeros(size.nodes)
    vcpus = np.zeros(size.nodes)
    caps = np.array([n.memory / GiB for n in nodes])
    cpu_caps = np.array([n.cpu * CPU_OVERCOMMIT for n in nodes])
    for j in range(size.guests):
        n = node_idx[j]
        if used[n] + memory[j] > caps[n] * 0.97 or vcpus[n] + cpu[j] > cpu_caps[n]:
            fits = (used + memory[j] <= caps * 0.97) & (vcpus + cpu[j] <= cpu_caps)
            if not fits.any():
                raise ValueError(f"size {size.name}: guest {j} fits no node")
            n = int(np.argmin(np.where(fits, used / caps, np.inf)))
            node_idx[j] = n
        used[n] += memory[j]
        vcpus[n] += cpu[j]
    util = rng.beta(2, 5, size.guests)
    guests = tuple(
        bench_guest(j, nodes[int(node_idx[j])].name, cpu[j], memory[j], util[j])
        for j in range(size.guests)
    )
    rule_set = Rules()
    if rules:
        ids = [g.id for g in guests]
        picks = rng.permutation(len(ids))
        k = max(2, size.guests // 60)
        pins = tuple(
            NodeAffinity(
                f"pin-{ids[j]}",
                (ids[j],),
                {guests[j].node: 0, nodes[int(rng.integers(size.nodes))].name: 0},
                strict=True,
            )
            for j in picks[:k]
        )
        pairs = picks[k : k + 4 * k].reshape(-1, 2)
        apart = tuple(
            GuestAffinity(f"apart-{i}", (ids[a], ids[b]), positive=False)
            for i, (a, b) in enumerate(pairs[: len(pairs) // 2])
            if guests[a].node != guests[b].node
        )
        together = tuple(
            GuestAffinity(f"together-{i}", (ids[a], ids[b]), positive=True)
            for i, (a, b) in enumerate(pairs[len(pairs) // 2 :])
            if guests[a].node == guests[b].node
        )
        rule_set = Rules(node_affinity=pins, guest_affinity=apart + together)
    settings = Settings(mode="static", cpu_overcommit=CPU_OVERCOMMIT)
    return Cluster(nodes, guests, rule_set, settings, name=f"bench-{size.name}")
