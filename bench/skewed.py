"""A second seeded generator of unbalanced clusters, with other distributions than
:mod:`bench.generate` (the ``skewed`` generator of ``python -m bench --generator``).

Shape, at the same sizes (:data:`bench.generate.SIZES`):

- **nodes of three generations**, drawn per node: 64 cores / 384 GiB (25 %), 96 cores / 768 GiB
  (40 %), 128 cores / 1,024 GiB (35 %), each with an 8 TiB local pool ``local-lvm``;
- **heavy-tailed guest sizes**: memory from a Pareto law (shape :data:`PARETO_SHAPE`, from
  0.5 GiB, at most 128 GiB), scaled so that the guests fill :data:`MEMORY_FILL` of the memory, in
  quarter-GiB steps: many guests of 0.5–2 GiB, a few of 32–128 GiB;
- **vCPU overcommit 2:1 to 4:1**: the cluster's vCPUs per core are drawn per seed from 2.0, 2.5,
  … 4.0; a guest's vCPUs grow as ``GiB^0.75`` with a log-normal factor (1–64 vCPUs), scaled to
  that ratio. A node may carry up to :data:`CPU_OVERCOMMIT` vCPUs per core (``Settings``);
- **skewed placement**: each guest draws its node with a Zipf-like weight ``1 / rank^SKEW`` over
  the nodes in a random order; a guest that would take its node beyond :data:`NODE_FILL` of its
  memory, beyond its vCPU capacity or beyond its local pool draws again among the nodes it fits,
  with the same weights. The first-ranked nodes end packed, the last ones nearly empty;
- **local disks**: :data:`LOCAL_DISK_SHARE` of the guests have a local disk of 16–128 GiB
  (``allow_local_disks``: they may move, at the cost of copying the disk);
- usage mode ``static`` (configured sizes), as :mod:`bench.generate`; no reserves.

With ``rules=True``, rules the initial placement satisfies (all hard):

- **pinned guests** (:data:`PINNED_SHARE`): strict node affinity to their current node and zero to
  two other nodes of the same generation — a third of them to their current node alone;
- **rule-bound guests** (:data:`GROUPED_SHARE`): hard anti-affinity groups of 3–5 guests on
  distinct nodes, and hard affinity groups of 2–4 guests sharing a node.

The same ``(size, seed, rules)`` always gives the same cluster.
"""

from __future__ import annotations

import numpy as np

from bench.generate import SIZES, Size, bench_guest
from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3
#: Node generations: (cores, memory GiB) and their shares.
GENERATIONS = np.array([[64, 384], [96, 768], [128, 1024]])
GENERATION_P = np.array([0.25, 0.40, 0.35])
#: Local pool per node, in GiB.
LOCAL_POOL_GIB = 8 * 1024
#: Pareto shape of the guests' memory, its scale and its cap (GiB).
PARETO_SHAPE = 1.6
MIN_GIB = 0.5
MAX_GIB = 128.0
#: Share of the memory the guests fill.
MEMORY_FILL = 0.40
#: vCPUs a node may carry per core (the clusters' :class:`Settings`).
CPU_OVERCOMMIT = 8.0
#: Share of a node's memory the placement fills at most.
NODE_FILL = 0.95
#: Exponent of the placement's Zipf-like node weights.
SKEW = 1.2
#: The clusters' vCPUs per core, one drawn per seed.
OVERCOMMITS = (2.0, 2.5, 3.0, 3.5, 4.0)
LOCAL_DISK_SHARE = 0.10
PINNED_SHARE = 0.03
GROUPED_SHARE = 0.06


def _nodes(rng: np.random.Generator, count: int) -> tuple[Node, ...]:
    shapes = GENERATIONS[rng.choice(len(GENERATIONS), size=count, p=GENERATION_P)]
    return tuple(
        Node(
            f"node{i + 1:04d}",
            int(cores),
            int(mem) * GiB,
            storage={"local-lvm": LOCAL_POOL_GIB * GiB},
            tags=(f"gen{int(np.searchsorted(GENERATIONS[:, 0], cores)) + 1}",),
        )
        for i, (cores, mem) in enumerate(shapes)
    )


def _sizes(
    rng: np.random.Generator, count: int, memory_gib: float, vcpus: float
) -> tuple[np.ndarray, np.ndarray]:
    """Memory (GiB, quarter steps) and vCPUs of ``count`` guests, heavy-tailed."""
    raw = np.minimum(MAX_GIB, MIN_GIB * (1.0 + rng.pareto(PARETO_SHAPE, size=count)))
    memory = np.clip(np.round(raw * MEMORY_FILL * memory_gib / raw.sum() * 4) / 4, 0.25, MAX_GIB)
    shape = memory**0.75 * rng.lognormal(0.0, 0.4, size=count)
    cpu = np.clip(np.round(shape * vcpus / shape.sum()), 1, 64)
    return memory, cpu


def _placement(rng: np.random.Generator, demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Each guest's node index: Zipf-like weights over a random node order, redrawn among the
    nodes it still fits (``demand`` (G, R) within ``capacity`` (N, R))."""
    count = len(capacity)
    weights = 1.0 / np.arange(1, count + 1) ** SKEW
    order = rng.permutation(count)
    by_node = weights[np.argsort(order)]
    drawn = order[rng.choice(count, size=len(demand), p=weights / weights.sum())]
    used = np.zeros_like(capacity)
    for j, node in enumerate(drawn):
        if np.any(used[node] + demand[j] > capacity[node]):
            fits = np.all(used + demand[j] <= capacity, axis=1)
            if not fits.any():
                raise ValueError(f"guest {j} fits no node")
            share = np.where(fits, by_node, 0.0)
            node = int(rng.choice(count, p=share / share.sum()))
            drawn[j] = node
        used[node] += demand[j]
    return drawn


def generate(size: Size | str, *, seed: int = 1, rules: bool = False) -> Cluster:
    """A skewed cluster of ``size`` (a :class:`Size` or a name in :data:`SIZES`)."""
    if isinstance(size, str):
        size = SIZES[size]
    rng = np.random.default_rng([seed, 2])
    nodes = _nodes(rng, size.nodes)
    per_core = float(rng.choice(OVERCOMMITS))
    mem_cap = np.array([n.memory / GiB for n in nodes])
    cores = np.array([n.cpu for n in nodes])
    memory, cpu = _sizes(rng, size.guests, float(mem_cap.sum()), per_core * float(cores.sum()))
    has_disk = rng.random(size.guests) < LOCAL_DISK_SHARE
    disk = np.where(has_disk, rng.integers(1, 9, size.guests) * 16, 0)
    demand = np.column_stack([memory, cpu, disk]).astype(float)
    capacity = np.column_stack(
        [mem_cap * NODE_FILL, cores * CPU_OVERCOMMIT, np.full(size.nodes, float(LOCAL_POOL_GIB))]
    )
    node_idx = _placement(rng, demand, capacity)
    guests = tuple(placed_guests(rng, nodes, node_idx, cpu, memory, disk))
    rule_set = _rules(rng, nodes, node_idx) if rules else Rules()
    settings = Settings(mode="static", cpu_overcommit=CPU_OVERCOMMIT, allow_local_disks=True)
    return Cluster(nodes, guests, rule_set, settings, name=f"skewed-{size.name}")


def placed_guests(
    rng: np.random.Generator,
    nodes: tuple[Node, ...],
    node_idx: np.ndarray,
    cpu: np.ndarray,
    memory: np.ndarray,
    disk: np.ndarray,
) -> list[Guest]:
    """The guests on their nodes (``node_idx``), each with its vCPUs, memory (GiB), a local disk
    on ``local-lvm`` where ``disk`` (GiB) is not 0, and a use drawn from Beta(2, 5)."""
    util = rng.beta(2, 5, len(node_idx))
    return [
        bench_guest(
            j,
            nodes[int(node_idx[j])].name,
            cpu[j],
            memory[j],
            util[j],
            (Disk("local-lvm", int(disk[j]) * GiB),) if disk[j] else (),
        )
        for j in range(len(node_idx))
    ]


def generation_pins(
    rng: np.random.Generator, nodes: tuple[Node, ...], node_idx: np.ndarray, pinned: np.ndarray
) -> list[NodeAffinity]:
    """Strict pins of the guests ``pinned`` (guest ``j`` is ``100 + j``) to their node and zero
    to two other nodes of its generation (the node's first tag)."""
    gens = np.array([n.tags[0] for n in nodes])
    pins = []
    for j in pinned:
        here = int(node_idx[j])
        peers = np.flatnonzero(gens == gens[here])
        extra = rng.choice(peers, size=min(len(peers), int(rng.integers(0, 3))), replace=False)
        allowed = {nodes[here].name: 0} | {nodes[int(k)].name: 0 for k in extra}
        pins.append(NodeAffinity(f"pin-{100 + j}", (str(100 + j),), allowed, strict=True))
    return pins


def _rules(rng: np.random.Generator, nodes: tuple[Node, ...], node_idx: np.ndarray) -> Rules:
    """Pins, hard anti-affinity and hard affinity groups the placement ``node_idx`` satisfies."""
    count = len(node_idx)
    order = rng.permutation(count)
    pinned = order[: max(1, round(PINNED_SHARE * count))]
    free = order[len(pinned) :]
    pins = generation_pins(rng, nodes, node_idx, pinned)
    budget = round(GROUPED_SHARE * count)
    apart = _groups(rng, free[: budget // 2], node_idx, together=False)
    together = _groups(rng, free[budget // 2 : budget], node_idx, together=True)
    return Rules(node_affinity=tuple(pins), guest_affinity=apart + together)


def _groups(
    rng: np.random.Generator, pool: np.ndarray, node_idx: np.ndarray, *, together: bool
) -> tuple[GuestAffinity, ...]:
    """Hard groups from the guests of ``pool``: 2–4 sharing a node (``together``), or 3–5 on
    distinct nodes; guests that do not make a group stay free."""
    kind = "together" if together else "apart"
    groups: list[GuestAffinity] = []
    if together:
        by_node: dict[int, list[int]] = {}
        for j in pool:
            by_node.setdefault(int(node_idx[j]), []).append(int(j))
        members_lists = by_node.values()
        chunks = [
            members[i : i + int(rng.integers(2, 5))]
            for members in members_lists
            for i in range(0, len(members), 4)
        ]
    else:
        chunks = apart_chunks(rng, pool, node_idx, smallest=3)
    for chunk in chunks:
        if len(chunk) >= 2:
            ids = tuple(str(100 + j) for j in chunk)
            groups.append(GuestAffinity(f"{kind}-{len(groups)}", ids, positive=together))
    return tuple(groups)


def apart_chunks(
    rng: np.random.Generator, pool: np.ndarray, node_idx: np.ndarray, *, smallest: int
) -> list[list[int]]:
    """Groups of ``smallest``–5 guests of ``pool``, each on distinct nodes, taken in the pool's
    order until no such group is left."""
    chunks: list[list[int]] = []
    rest = [int(j) for j in pool]
    while len(rest) >= smallest:
        want = int(rng.integers(smallest, 6))
        chunk: list[int] = []
        seen: set[int] = set()
        for j in rest:
            if int(node_idx[j]) not in seen:
                chunk.append(j)
                seen.add(int(node_idx[j]))
            if len(chunk) == want:
                break
        if len(chunk) < smallest:
            break
        taken = set(chunk)
        rest = [j for j in rest if j not in taken]
        chunks.append(chunk)
    return chunks
