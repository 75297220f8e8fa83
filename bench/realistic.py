"""A third seeded generator, of clusters shaped like production ones (``python -m bench
--generator new-node|hot-rack|mixed``): full memory, a few hardware generations, cloud-like guest
sizes, rules and local disks, and one of three skews.

Shape, at the sizes of :data:`bench.generate.SIZES` (the node count includes the new node):

- **three hardware generations** in uneven shares drawn per seed (a Dirichlet draw, each share at
  least 10 %), oldest first as a cluster grows: 32 cores / 256 GiB, 64 cores / 512 GiB, 128 cores
  / 1 TiB, each with a 16 TiB local pool ``local-lvm``; nodes sit in racks of
  :func:`rack_size` nodes, in order (tag ``rackN``, plus ``genN``);
- **guest sizes heavy-tailed as in public cloud traces**: vCPUs from :data:`VCPU_SHARES` (most
  1–4, a tail to 64) and 2, 4 or 8 GiB per vCPU (at most 256 GiB); memory and vCPUs are scaled by
  one factor (vCPUs never up, at least 1) so that the guests fill a share of the cluster's memory
  drawn per seed in :data:`MEMORY_FILL` (85–92 %), lowered where the skew's nodes cannot hold
  that much under :data:`NODE_FILL` (small sizes with a new node); quarter-GiB steps, at least
  0.5 GiB;
- **16 % of the guests with a local disk** (:data:`LOCAL_DISK_SHARE`) of 32–512 GiB,
  heavy-tailed (``allow_local_disks``: they may move, at the cost of copying the disk);
- **placement by target fill**: every node gets a target share of its memory (the skew's, ±3 pp
  of noise); guests, largest first, go to a node drawn in proportion to the room left under its
  target, or, where no node has room left, to the least filled node they fit (memory within
  :data:`NODE_FILL`, vCPUs within :data:`CPU_OVERCOMMIT` per core, the local pool);
- the skews (:data:`SKEWS`): ``new-node`` — a new, empty 128-core / 1 TiB node, the others evenly
  full; ``hot-rack`` — one rack filled to 96 %, the others evenly below; ``mixed`` — both;
- usage mode ``static`` (configured sizes), as the other generators; no reserves.

With ``rules=True``, rules the initial placement satisfies (all hard):

- :data:`GROUPED_SHARE` of the guests in groups of 2–5: half of the groups affinity (members on
  one node), half anti-affinity (members on distinct nodes); every other group is given as
  ProxLB tags (``plb_affinity_*`` / ``plb_anti_affinity_*`` on its guests, origin ``tag``), the
  rest as configured rules;
- :data:`PINNED_SHARE` of the guests pinned (strict node affinity) to their node and zero to two
  other nodes of the same generation.

The same ``(skew, size, seed, rules)`` always gives the same cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np

from bench.generate import SIZES, Size
from bench.skewed import apart_chunks, generation_pins, placed_guests
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules

GiB = 1024**3
#: Node generations: (cores, memory GiB), oldest first.
GENERATIONS = ((32, 256), (64, 512), (128, 1024))
#: vCPUs of a guest and their shares: most 1–4, a tail to 64.
VCPU_SHARES = {1: 0.28, 2: 0.30, 4: 0.24, 8: 0.10, 16: 0.05, 32: 0.02, 64: 0.01}
#: GiB per vCPU and their shares (compute-, general- and memory-optimised shapes).
GIB_PER_VCPU = {2: 0.3, 4: 0.5, 8: 0.2}
MAX_GIB = 256.0
MIN_GIB = 0.5
#: The share of the cluster's memory the guests fill: drawn per seed in this range.
MEMORY_FILL = (0.85, 0.92)
#: A node's memory the placement fills at most, and its vCPUs per core.
NODE_FILL = 0.97
CPU_OVERCOMMIT = 4.0
LOCAL_POOL_GIB = 16 * 1024
LOCAL_DISK_SHARE = 0.16
GROUPED_SHARE = 0.10
PINNED_SHARE = 0.005
#: The over-full rack's target fill in ``hot-rack`` and ``mixed``.
HOT_RACK_FILL = 0.96
#: Per-node noise on the target fill (± this share of the memory).
FILL_NOISE = 0.03
SKEWS = ("new-node", "hot-rack", "mixed")


def rack_size(nodes: int) -> int:
    """Nodes per rack: 8, or a quarter of the nodes on small clusters (at least 2)."""
    return max(2, min(8, nodes // 4))


def _nodes(rng: np.random.Generator, count: int, new_node: bool) -> tuple[Node, ...]:
    """``count`` nodes: the generations in uneven shares, oldest first, then the new node."""
    old = count - 1 if new_node else count
    shares = np.maximum(rng.dirichlet([3.0, 4.0, 2.0]), 0.10)
    per_gen = np.floor(shares / shares.sum() * old).astype(int)
    per_gen[int(np.argmax(shares))] += old - int(per_gen.sum())
    gens = [g for g, k in enumerate(per_gen) for _ in range(k)] + ([2] if new_node else [])
    per_rack = rack_size(count)
    return tuple(
        Node(
            f"pve{i + 1:04d}",
            GENERATIONS[g][0],
            GENERATIONS[g][1] * GiB,
            storage={"local-lvm": LOCAL_POOL_GIB * GiB},
            tags=(f"gen{g + 1}", f"rack{i // per_rack + 1}"),
        )
        for i, g in enumerate(gens)
    )


def _targets(rng: np.random.Generator, nodes: tuple[Node, ...], skew: str) -> np.ndarray:
    """Each node's target share of its memory, and the guests' total (GiB) in ``[-1]``."""
    mem = np.array([n.memory / GiB for n in nodes])
    count = len(nodes)
    target = np.ones(count)
    if skew in ("new-node", "mixed"):
        target[-1] = 0.0
    hot = np.zeros(count, dtype=bool)
    if skew in ("hot-rack", "mixed"):
        racks = np.array([int(n.tags[1][4:]) for n in nodes])
        full = racks[: count - 1 if skew == "mixed" else count]
        hot = racks == int(rng.choice(np.unique(full)))
        if skew == "mixed":
            hot[-1] = False
    fill = float(rng.uniform(*MEMORY_FILL))
    room = NODE_FILL - FILL_NOISE
    hot_total = float((mem[hot] * HOT_RACK_FILL).sum())
    rest = (target > 0) & ~hot
    total = min(fill * mem.sum(), hot_total + room * float(mem[rest].sum()))
    even = (total - hot_total) / float(mem[rest].sum())
    target = np.where(hot, HOT_RACK_FILL, np.where(rest, even, 0.0))
    noise = rng.uniform(-FILL_NOISE, FILL_NOISE, count) * (target > 0)
    return np.append(np.clip(target + noise, 0.0, NODE_FILL), total)


def _sizes(rng: np.random.Generator, count: int, total_gib: float) -> tuple[np.ndarray, ...]:
    """vCPUs, memory (GiB) and local disk (GiB, 0 for none) of ``count`` guests; memory and
    vCPUs scaled alike (vCPUs never up) so that the memory totals ``total_gib``."""
    cpu = rng.choice(list(VCPU_SHARES), size=count, p=list(VCPU_SHARES.values()))
    ratio = rng.choice(list(GIB_PER_VCPU), size=count, p=list(GIB_PER_VCPU.values()))
    raw = np.minimum(cpu * ratio, MAX_GIB).astype(float)
    scale = total_gib / raw.sum()
    memory = np.clip(np.round(raw * scale * 4) / 4, MIN_GIB, MAX_GIB)
    cpu = np.clip(np.round(cpu * min(1.0, scale)), 1, max(VCPU_SHARES))
    has_disk = rng.random(count) < LOCAL_DISK_SHARE
    disk = np.minimum(512, 32 * np.floor(1 + rng.pareto(1.5, count)))
    return cpu.astype(float), memory, np.where(has_disk, disk, 0.0)


def _place(
    rng: np.random.Generator, demand: np.ndarray, capacity: np.ndarray, target: np.ndarray
) -> np.ndarray:
    """Each guest's node index: largest first, drawn in proportion to the room under the
    node's target, else the least filled node it fits (``demand`` (G, 3) in ``capacity``)."""
    used = np.zeros_like(capacity)
    placed = np.empty(len(demand), dtype=np.int64)
    goal = target * capacity[:, 0] / NODE_FILL
    for j in np.argsort(-demand[:, 0], kind="stable"):
        fits = np.all(used + demand[j] <= capacity, axis=1)
        room = np.where(fits, np.maximum(goal - used[:, 0] - demand[j, 0], 0.0), 0.0)
        if room.sum() > 0:
            node = int(rng.choice(len(room), p=room / room.sum()))
        elif fits[target > 0].any():
            filled = used[:, 0] / np.maximum(goal, 1e-9)
            node = int(np.argmin(np.where(fits & (target > 0), filled, np.inf)))
        else:
            raise ValueError(f"guest {j} ({demand[j, 0]:g} GiB) fits no node")
        placed[j] = node
        used[node] += demand[j]
    return placed


def generate(size: Size | str, *, skew: str, seed: int = 1, rules: bool = False) -> Cluster:
    """A cluster of ``size`` (a :class:`Size` or a name in :data:`SIZES`) with ``skew``."""
    if skew not in SKEWS:
        raise ValueError(f"unknown skew {skew!r} (known: {', '.join(SKEWS)})")
    if isinstance(size, str):
        size = SIZES[size]
    rng = np.random.default_rng([seed, 3, SKEWS.index(skew)])
    nodes = _nodes(rng, size.nodes, new_node=skew != "hot-rack")
    target = _targets(rng, nodes, skew)
    cpu, memory, disk = _sizes(rng, size.guests, float(target[-1]))
    mem_cap = np.array([n.memory / GiB for n in nodes])
    capacity = np.column_stack(
        [
            mem_cap * NODE_FILL,
            np.array([n.cpu for n in nodes]) * CPU_OVERCOMMIT,
            np.full(len(nodes), float(LOCAL_POOL_GIB)),
        ]
    )
    node_idx = _place(rng, np.column_stack([memory, cpu, disk]), capacity, target[:-1])
    guests = placed_guests(rng, nodes, node_idx, cpu, memory, disk)
    rule_set = Rules()
    if rules:
        rule_set, guests = _rules(rng, nodes, node_idx, guests)
    settings = Settings(mode="static", cpu_overcommit=CPU_OVERCOMMIT, allow_local_disks=True)
    return Cluster(nodes, tuple(guests), rule_set, settings, name=f"{skew}-{size.name}")


def _rules(
    rng: np.random.Generator, nodes: tuple[Node, ...], node_idx: np.ndarray, guests: list[Guest]
) -> tuple[Rules, list[Guest]]:
    """Pins and groups the placement satisfies; tag groups also as tags on their guests."""
    order = rng.permutation(len(guests))
    pinned = order[: max(1, round(PINNED_SHARE * len(guests)))]
    pins = generation_pins(rng, nodes, node_idx, pinned)
    pool = order[len(pinned) : len(pinned) + round(GROUPED_SHARE * len(guests))]
    chunks = _chunks(rng, pool[: len(pool) // 2], node_idx, together=True)
    chunks += _chunks(rng, pool[len(pool) // 2 :], node_idx, together=False)
    groups = []
    tags: dict[int, list[str]] = {}
    for k, (together, chunk) in enumerate(chunks):
        kind = "affinity" if together else "anti_affinity"
        origin = "tag" if k % 2 else "config"
        name = f"plb_{kind}_g{k}" if origin == "tag" else f"{kind.replace('_', '-')}-{k}"
        ids = tuple(guests[j].id for j in chunk)
        groups.append(GuestAffinity(name, ids, positive=together, origin=origin))
        for j in chunk if origin == "tag" else ():
            tags.setdefault(j, []).append(name)
    for j, names in tags.items():
        guests[j] = replace(guests[j], tags=tuple(names))
    return Rules(node_affinity=tuple(pins), guest_affinity=tuple(groups)), guests


def _chunks(
    rng: np.random.Generator, pool: np.ndarray, node_idx: np.ndarray, *, together: bool
) -> list[tuple[bool, list[int]]]:
    """Groups of 2–5 from ``pool``: sharing a node (``together``) or on distinct nodes."""
    chunks: list[tuple[bool, list[int]]] = []
    if together:
        by_node: dict[int, list[int]] = {}
        for j in pool:
            by_node.setdefault(int(node_idx[j]), []).append(int(j))
        for members in by_node.values():
            while len(members) >= 2:
                want = int(rng.integers(2, 6))
                chunks.append((True, members[:want]))
                members = members[want:]
        return chunks
    return [(False, chunk) for chunk in apart_chunks(rng, pool, node_idx, smallest=2)]


#: Generator name → ``generate(size, *, seed, rules)``, one per skew.
GENERATORS: dict[str, Callable[..., Cluster]] = {
    skew: partial(generate, skew=skew) for skew in SKEWS
}
