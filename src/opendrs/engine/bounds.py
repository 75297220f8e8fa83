"""Lower bounds: how close to the best possible is a result?

Every plan reports the balance it reaches next to two lower bounds, so an operator can see how far
from optimal it is:

* :func:`spread_lower_bound` — no placement can bring a resource's spread (max − min of the usable
  nodes' load fractions) below this. Guests that may not move stay where they are, so a node's
  fraction is at least its immovable load over its capacity, while the smallest fraction can never
  exceed the cluster mean: ``spread ≥ max_n immovable_n / C_n − mean``.
* :func:`migration_lower_bound` — the fewest migrations (and the least moved memory) any placement
  needs to bring every resource's spread to a target. See :func:`migration_lower_bound` for the
  argument; in one line: every node's net outflow must land in a box, a guest's cpu and memory
  move together, and each migration leaves one node and enters one; and every node's load in one
  window as wide as the target, wherever it sits (:func:`_window_bound`). Only the resources the
  cluster balances (weight above 0) are held to a target unless ``resources`` says otherwise: on a
  cluster that balances memory alone (a proxlb-solver scenario with ``method: memory``) it is the
  memory-only bound.

The bounds are valid for any strategy (they ignore most constraints, which can only make the true
optimum worse), cheap (vectorised), and tight when guests are small relative to nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from opendrs.model.cluster import Cluster
from opendrs.model.rules import Rules

from .constraints import hard_groups, movability
from .usage import RESOURCES, LoadModel


@dataclass(frozen=True)
class LowerBounds:
    """Lower bounds for one cluster and one target spread."""

    #: Per resource: no placement has a smaller spread.
    spread: Mapping[str, float]
    #: Per resource: the spread the migration bounds are computed for.
    target_spread: Mapping[str, float]
    #: At least this many migrations are needed to reach ``target_spread``.
    migrations: int
    #: At least this many bytes of memory must move to reach ``target_spread``.
    moved_bytes: int
    #: The resources held to ``target_spread`` by the migration bounds (the others may end
    #: anywhere).
    resources: tuple[str, ...] = RESOURCES

    def as_dict(self) -> dict[str, object]:
        return {
            "spread": dict(self.spread),
            "target_spread": dict(self.target_spread),
            "resources": list(self.resources),
            "migrations": self.migrations,
            "moved_bytes": self.moved_bytes,
        }


def balanced_resources(cluster: Cluster) -> tuple[str, ...]:
    """The resources the cluster balances: those with a weight above 0 (all when none is)."""
    settings = cluster.settings
    weights = {"cpu": settings.weight_cpu, "memory": settings.weight_memory}
    chosen = tuple(r for r in RESOURCES if weights.get(r, 1.0) > 0)
    return chosen or RESOURCES


def _movable(cluster: Cluster, kept: Rules | None = None) -> np.ndarray:
    """(G,) guests that may move to rebalance (the others keep their load where it is).

    Guests kept together by hard affinity move as one: if one of them may not move, none may
    (``kept``: the rules :func:`~.constraints.check_rules` keeps, when the caller has them).
    """
    movable = np.array(
        [movability(g, cluster, "balance") is None for g in cluster.guests], dtype=bool
    )
    for group in hard_groups(cluster, kept):
        if not movable[group].all():
            movable[group] = False
    return movable


def arch_parts(cluster: Cluster, kept: Rules | None = None) -> list[Cluster]:
    """The cluster cut by CPU architecture: each part holds the nodes of one architecture, the
    guests on them and the rules among those guests (guests cannot move between parts). A guest
    that may not move in the whole cluster (a member of a hard-affinity bundle split across
    architectures, say) is ignored in its part, so that it may not move there either. The
    cluster itself when its nodes share one architecture. ``kept``: as for :func:`_movable`."""
    arches = sorted({n.arch for n in cluster.nodes})
    if len(arches) < 2:
        return [cluster]
    movable = _movable(cluster, kept)
    held = {g.id for g, free in zip(cluster.guests, movable, strict=True) if not free}
    parts = []
    for arch in arches:
        nodes = tuple(n for n in cluster.nodes if n.arch == arch)
        names = {n.name for n in nodes}
        guests = tuple(g for g in cluster.guests if g.node in names)
        ids = {g.id for g in guests}
        rules = cluster.rules
        kept = Rules(
            node_affinity=tuple(
                replace(r, guests=tuple(g for g in r.guests if g in ids))
                for r in rules.node_affinity
                if ids.intersection(r.guests)
            ),
            guest_affinity=tuple(
                replace(r, guests=tuple(g for g in r.guests if g in ids))
                for r in rules.guest_affinity
                if len(ids.intersection(r.guests)) >= 2
            ),
            ignored=frozenset((rules.ignored | held) & ids),
            ignore_reasons=rules.ignore_reasons,
        )
        parts.append(replace(cluster, nodes=nodes, guests=guests, rules=kept))
    return parts


def spread_lower_bound(
    cluster: Cluster, loads: LoadModel | None = None, kept: Rules | None = None
) -> dict[str, float]:
    """Per resource, a spread no placement can beat (of the worst CPU architecture, where the
    nodes have several: each is balanced on its own). ``kept``: as for :func:`_movable`."""
    parts = arch_parts(cluster, kept)
    if len(parts) > 1:
        each = [_spread_lower_bound(part) for part in parts]
        return {r: max(bound[r] for bound in each) for r in RESOURCES}
    return _spread_lower_bound(cluster, loads, kept)


def _spread_lower_bound(
    cluster: Cluster,
    loads: LoadModel | None = None,
    kept: Rules | None = None,
    movable: np.ndarray | None = None,
) -> dict[str, float]:
    """:func:`spread_lower_bound` of one architecture's nodes (``movable``: :func:`_movable` of
    the cluster, when the caller has it)."""
    loads = loads or LoadModel.build(cluster)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool) & np.all(
        loads.capacity > 0, axis=1
    )
    out = dict.fromkeys(RESOURCES, 0.0)
    if usable.sum() < 2:
        return out
    movable = movable if movable is not None else _movable(cluster, kept)
    total = _redistributable_total(loads, usable, movable)
    cap = loads.capacity[usable]
    mean = total / cap.sum(axis=0)
    fixed_assign = np.where(movable, -1, loads.assign)
    fixed = loads.loads(fixed_assign)[usable]
    floor = fixed / cap
    for i, name in enumerate(RESOURCES):
        out[name] = float(max(0.0, floor[:, i].max() - mean[i]))
    return out


def _redistributable_total(loads: LoadModel, usable: np.ndarray, movable: np.ndarray) -> np.ndarray:
    """(R,) the load the usable nodes share: theirs, plus what can leave unusable nodes."""
    total = loads.loads()[usable].sum(axis=0)
    leaving = movable & loads.active & (loads.assign >= 0)
    leaving &= ~usable[np.maximum(loads.assign, 0)]
    return total + loads.demand[leaving].sum(axis=0)


def _cover_count(sizes_desc: np.ndarray, amount: float) -> int:
    """Fewest items from ``sizes_desc`` (sorted descending) whose sum reaches ``amount``."""
    if amount <= 0:
        return 0
    return _prefix_cover_count(np.cumsum(sizes_desc), amount)


def _prefix_cover_count(csum: np.ndarray, amount: float) -> int:
    """:func:`_cover_count` from the running sums ``csum`` of the sizes sorted descending
    (computed once for many amounts)."""
    if amount <= 0:
        return 0
    k = int(np.searchsorted(csum, amount * (1 - 1e-12), side="left")) + 1
    return min(k, len(csum)) if len(csum) else 0


#: Directions the joint migration bound looks at (a multiple of 4, so the axes are among them).
#: Any set of directions gives a valid bound; more give a tighter one.
DIRECTIONS = 64
#: Weights λ tried when the joint bound combines departures and arrivals (0 and 1 included).
LAMBDAS = 65
#: Arrivals per node the joint bound tabulates; beyond, it uses a bound that holds for any number.
MAX_ARRIVALS = 256


def _directions(n_resources: int) -> np.ndarray:
    """(K, R) directions: evenly spaced angles for two resources, else the axes both ways."""
    if n_resources == 2:
        angles = np.arange(DIRECTIONS) * (2 * np.pi / DIRECTIONS)
        u = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    else:
        eye = np.eye(n_resources)
        u = np.vstack([eye, -eye])
    u[np.abs(u) < 1e-12] = 0.0
    return u


def _joint_migration_bound(
    demand: np.ndarray,
    assign: np.ndarray,
    movable: np.ndarray,
    usable: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
) -> float:
    """The joint (all resources at once) bound of :func:`migration_lower_bound`, before rounding.

    ``demand`` (G, R), ``assign`` (G,), ``movable`` (G,) as in the caller; ``usable`` (N,);
    ``low``/``high`` (N, R): the least and most net outflow each usable node may have.
    """
    guests = np.nonzero(movable & (assign >= 0))[0]
    leaving = np.bincount(assign[guests], minlength=len(usable))
    evacuated = float(leaving[~usable].sum())
    if guests.size == 0:
        return 0.0
    # Work in "typical guests" per resource, so the directions weigh resources evenly and one
    # absolute tolerance fits all.
    unit = demand[guests].mean(axis=0)
    unit = np.where(unit > 0, unit, 1.0)
    d = demand[guests] / unit
    u = _directions(d.shape[1])
    proj = d @ u.T  # (g, K)
    # Arrivals: the i largest positive parts of −u·d over every movable guest, for i = 0..I,
    # and all of them (sorted in place: the array is as large as ``proj``).
    arrive = np.negative(proj)
    np.maximum(arrive, 0.0, out=arrive)
    arrive.sort(axis=0)
    arrive = np.cumsum(arrive[::-1], axis=0)
    n_arrivals = min(len(guests), MAX_ARRIVALS)
    arrivals = np.vstack([np.zeros(len(u)), arrive[:n_arrivals], arrive[-1:]])  # (I+2, K)
    del arrive
    with np.errstate(invalid="ignore", over="ignore"):
        lo = low / unit
        hi = high / unit
        terms = np.minimum(u[None, :, :] * lo[:, None, :], u[None, :, :] * hi[:, None, :])
    support = np.where(u[None, :, :] == 0, 0.0, terms).sum(axis=2)  # (N, K): min over the box
    table, beyond = _departure_table(proj, assign[guests], usable, support, arrivals)
    count = leaving[np.nonzero(usable)[0]].astype(float)
    return _best_lambda(table, beyond, count, evacuated)


def _departure_table(
    proj: np.ndarray,
    where: np.ndarray,
    usable: np.ndarray,
    support: np.ndarray,
    arrivals: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per usable node, the fewest departures that keep it in its box (``support`` (N, K)),
    given i = 0..I arrivals, and whatever the arrivals: (rows, I+1) and (rows,).

    ``proj`` (g, K): the movable guests' demands along each direction, ``where`` their nodes;
    ``arrivals`` (I+2, K): the sums of the i largest arrivals along each direction, i = 0..I,
    then the sum of them all."""
    n_arrivals = arrivals.shape[0] - 2
    order = np.argsort(where, kind="stable")
    starts = np.searchsorted(where[order], np.arange(len(usable) + 1))
    rows = np.nonzero(usable)[0]
    table = np.full((len(rows), n_arrivals + 1), np.inf)  # fewest departures, given i arrivals
    beyond = np.full(len(rows), np.inf)  # fewest departures, whatever the arrivals
    for k, n in enumerate(rows.tolist()):
        mine = proj[order[starts[n] : starts[n + 1]]]
        depart = np.sort(np.maximum(mine, 0.0), axis=0)[::-1]
        depart = np.vstack([np.zeros(proj.shape[1]), np.cumsum(depart, axis=0)])  # (o+1, K)
        need = support[n][None, :] - arrivals  # (I+2, K)
        need = need - 1e-9 * (1.0 + np.abs(support[n]) + arrivals)
        fewest = _fewest(depart, need)
        fewest = np.where(fewest < depart.shape[0], fewest, np.inf)
        table[k] = fewest[:-1]
        beyond[k] = fewest[-1]
    return table, beyond


def _best_lambda(
    table: np.ndarray, beyond: np.ndarray, count: np.ndarray, evacuated: float
) -> float:
    """The largest ``Σ_n min_i (λ F_n(i) + (1 − λ) i) + λ · evacuated`` over the λ tried, from
    the departure ``table`` (rows, I+1) and ``beyond`` (``F_n(∞)``); ``count``: each usable
    node's movable guests (all leave when the node cannot reach its box)."""
    n_arrivals = table.shape[1] - 1
    arrivals = np.arange(n_arrivals + 1, dtype=float)
    best = 0.0
    for lam in np.linspace(0.0, 1.0, LAMBDAS):
        with np.errstate(invalid="ignore"):
            cost = np.where(np.isfinite(table), lam * table + (1 - lam) * arrivals, np.inf)
            tail = np.where(
                np.isfinite(beyond), lam * beyond + (1 - lam) * (n_arrivals + 1), np.inf
            )
        per_node = np.minimum(cost.min(axis=1), tail)
        # A node that cannot reach its box at all makes the target unreachable: count its guests.
        per_node = np.where(np.isfinite(per_node), per_node, lam * count)
        best = max(best, float(per_node.sum() + lam * evacuated))
    return best


def _fewest(prefix: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per row of ``need`` (M, K): the least o with ``prefix[o, k] ≥ need[m, k]`` for every k.

    ``prefix`` (P, K) is non-decreasing down each column; P means "none": no o reaches it. One
    search over the columns laid end to end, each shifted above the previous one.
    """
    rows, cols = prefix.shape
    top = float(prefix[-1].max()) if prefix.size else 0.0
    clipped = np.clip(need, -0.5, prefix[-1][None, :] + 1.0)
    shift = (top + 4.0) * np.arange(cols)
    flat = (prefix + shift[None, :]).T.ravel()
    where = np.searchsorted(flat, (clipped + shift[None, :]), side="left")
    where = where - (np.arange(cols) * rows)[None, :]
    return where.max(axis=1)


def _held_resources(cluster: Cluster, resources: Sequence[str] | None) -> tuple[str, ...]:
    """The resources held to the target, in :data:`RESOURCES`'s order (default: those the
    cluster balances); ValueError for an unknown one or none."""
    chosen = tuple(resources) if resources is not None else balanced_resources(cluster)
    unknown = [r for r in chosen if r not in RESOURCES]
    if unknown or not chosen:
        raise ValueError(f"resources: expected some of {', '.join(RESOURCES)}, got {chosen!r}")
    return tuple(r for r in RESOURCES if r in chosen)


def _target_vector(target_spread: Mapping[str, float] | Sequence[float] | float) -> np.ndarray:
    """(R,) the target spread of each resource (a mapping's missing ones: 0)."""
    if isinstance(target_spread, Mapping):
        return np.array([float(target_spread.get(r, 0.0)) for r in RESOURCES])
    if isinstance(target_spread, int | float):
        return np.full(len(RESOURCES), float(target_spread))
    return np.asarray(target_spread, dtype=float)


def _parts_added_up(each: Sequence[LowerBounds]) -> LowerBounds:
    """The bounds of a cluster from those of its architectures' parts: the worst spread, the
    migrations and moved bytes added up."""
    return LowerBounds(
        spread={r: max(b.spread[r] for b in each) for r in RESOURCES},
        target_spread=each[0].target_spread,
        migrations=sum(b.migrations for b in each),
        moved_bytes=sum(b.moved_bytes for b in each),
        resources=each[0].resources,
    )


@dataclass
class _Tally:
    """The per-resource bounds, node by node: departures (``out_count``) and arrivals
    (``in_count``) at least, memory that must leave (``out_bytes``) or arrive (``in_bytes``),
    and each usable node's box of net outflow (``low``, ``high``: (N, R))."""

    out_count: int
    out_bytes: float
    in_count: int
    in_bytes: float
    low: np.ndarray
    high: np.ndarray


def _departures(
    demand: np.ndarray, on_node: np.ndarray, excess: np.ndarray, cols: list[int]
) -> int:
    """The fewest of a node's movable guests (``on_node``) whose departure removes its
    ``excess`` in every resource of ``cols`` (all of them when none suffices)."""
    k = 0
    for r in cols:
        if excess[r] > 0:
            sizes = np.sort(demand[on_node, r])[::-1]
            need = _cover_count(sizes, excess[r])
            k = max(k, need if need else int(on_node.sum()))
    return k


def _usable_mean(loads: LoadModel, usable: np.ndarray, movable: np.ndarray) -> np.ndarray:
    """(R,) the capacity-weighted mean load fraction of the usable nodes once every movable guest
    has left the unusable ones."""
    total = _redistributable_total(loads, usable, movable)
    usable_cap = loads.capacity[usable].sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(usable_cap > 0, total / np.where(usable_cap > 0, usable_cap, 1.0), 0.0)


def _tally(
    loads: LoadModel, usable: np.ndarray, movable: np.ndarray, target: np.ndarray, cols: list[int]
) -> _Tally:
    """The per-resource bounds of :func:`migration_lower_bound` for the spreads ``target`` in
    the resources ``cols``."""
    node_load, cap, demand = loads.loads(), loads.capacity, loads.demand
    mean = _usable_mean(loads, usable, movable)
    memory_col = RESOURCES.index("memory")
    out_count = 0
    out_bytes = 0.0
    in_need = np.zeros(len(RESOURCES))
    in_counts: list[int] = []
    all_movable = demand[movable]
    sums_all = [np.cumsum(np.sort(all_movable[:, r])[::-1]) for r in range(len(RESOURCES))]
    low = np.zeros_like(cap)
    high = np.zeros_like(cap)
    for n in range(len(usable)):
        on_node = movable & (loads.assign == n)
        if not usable[n]:
            # Everything movable on an unusable node must leave.
            count = int(on_node.sum())
            out_count += count
            out_bytes += float(demand[on_node, memory_col].sum()) if loads.memory_is_bytes else 0.0
            continue
        excess = node_load[n] - (mean + target) * cap[n]
        deficit = (mean - target) * cap[n] - node_load[n]
        low[n] = excess
        high[n] = -deficit
        out_count += _departures(demand, on_node, excess, cols)
        if memory_col in cols and excess[memory_col] > 0 and loads.memory_is_bytes:
            out_bytes += float(excess[memory_col])
        k_in = 0
        for r in cols:
            if deficit[r] > 0:
                k_in = max(k_in, _prefix_cover_count(sums_all[r], deficit[r]))
                in_need[r] += deficit[r]
        in_counts.append(k_in)
    in_bytes = float(in_need[memory_col]) if loads.memory_is_bytes else 0.0
    return _Tally(out_count, out_bytes, sum(in_counts), in_bytes, low, high)


#: Positions of the window the window bound tries, from ``m − s`` to ``m`` (any grid is valid).
WINDOW_STEPS = 64


def _cover_counts(csum: np.ndarray, amounts: np.ndarray) -> np.ndarray:
    """:func:`_prefix_cover_count` of many ``amounts`` at once."""
    k = np.minimum(np.searchsorted(csum, amounts * (1 - 1e-12), side="left") + 1, len(csum))
    return np.where(amounts > 0, k, 0)


def _window_bound(
    loads: LoadModel, usable: np.ndarray, movable: np.ndarray, target: np.ndarray, cols: list[int]
) -> tuple[int, float]:
    """The per-resource bound with the window placed (migrations, memory moved).

    A placement that reaches spread ``s`` puts every usable node's fraction in one window
    ``[α, α + s]``, ``α ∈ [m − s, m]``. The departures it needs, ``D(α)`` (each node's fewest
    largest movable guests that bring it down to ``α + s``, and every movable guest of an unusable
    node), fall as ``α`` rises; the arrivals, ``A(α)`` (the cluster's fewest largest movable
    guests that lift each node to ``α``), rise. So for ``α_k ≤ α ≤ α_(k+1)`` on a grid,
    ``M ≥ max(D(α_(k+1)), A(α_k))``, and the least of these over the grid is a bound — tighter
    than the box ``[m − s, m + s]`` of the first bound when the spread asked is wide, where the
    box lets most nodes stay as they are. The memory moved likewise, in bytes."""
    node_load, cap, demand = loads.loads(), loads.capacity, loads.demand
    nodes = np.nonzero(usable)[0]
    leaving = movable & (loads.assign >= 0) & ~usable[np.maximum(loads.assign, 0)]
    mean = _usable_mean(loads, usable, movable)
    steps = np.linspace(0.0, 1.0, WINDOW_STEPS + 1)
    moving = np.nonzero(movable & np.isin(loads.assign, nodes))[0]
    by_node = moving[np.argsort(loads.assign[moving], kind="stable")]
    starts = np.searchsorted(loads.assign[by_node], nodes)
    ends = np.searchsorted(loads.assign[by_node], nodes, side="right")
    count, moved = 0, 0.0
    for r in cols:
        alpha = mean[r] - target[r] + steps * target[r]
        excess = node_load[nodes, r, None] - (alpha + target[r]) * cap[nodes, r, None]
        deficit = alpha * cap[nodes, r, None] - node_load[nodes, r, None]
        out = np.full(len(alpha), int(leaving.sum()))
        for i in range(len(nodes)):
            sizes = np.sort(demand[by_node[starts[i] : ends[i]], r])[::-1]
            out += _cover_counts(np.cumsum(sizes), excess[i])
        everyone = np.cumsum(np.sort(demand[movable, r])[::-1])
        arrivals = _cover_counts(everyone, deficit.ravel()).reshape(deficit.shape).sum(axis=0)
        count = max(count, int(np.maximum(out[1:], arrivals[:-1]).min()))
        if RESOURCES[r] == "memory" and loads.memory_is_bytes:
            gone = np.maximum(excess, 0.0).sum(axis=0) + demand[leaving, r].sum()
            come = np.maximum(deficit, 0.0).sum(axis=0)
            moved = max(moved, float(np.maximum(gone[1:], come[:-1]).min()))
    return count, moved


def migration_lower_bound(
    cluster: Cluster,
    target_spread: Mapping[str, float] | Sequence[float] | float,
    loads: LoadModel | None = None,
    resources: Sequence[str] | None = None,
    kept: Rules | None = None,
) -> LowerBounds:
    """Bounds on the migrations and moved memory needed to bring every spread to ``target``
    (``kept``: the rules :func:`~.constraints.check_rules` keeps, when the caller has them).

    ``resources`` are the resources held to their target (default: those the cluster balances,
    :func:`balanced_resources`); any other may end with any spread. A placement that meets the
    target in more resources meets it in these, so every such bound is also a bound for them all.

    Where the nodes have several CPU architectures, the target holds for each one's nodes (no
    guest moves between them), and the bounds of the parts add up (:func:`arch_parts`).

    **Why it is a lower bound.** Take any placement that reaches the target spreads ``s`` and
    moves only guests that may move. The usable nodes' fractions then lie in one window
    ``[α, α + s]`` per resource, and since the capacity-weighted mean ``m`` of the fractions lies
    between their minimum and maximum, in ``[m − s, m + s]``. So a usable node ``n`` with load
    ``L`` and capacity ``C`` ends with a net outflow ``b = Σ_out d − Σ_in d`` (the demands of the
    guests that leave it, less those that arrive) in the box ``[L − (m + s)C, L − (m − s)C]``, per
    resource. Movable guests on unusable nodes must all leave. Each migration leaves one node and
    enters one, so with ``o_n`` departures and ``i_n`` arrivals, ``M = Σ o_n = Σ i_n``.

    *Per resource* (the first bound, cheap): ``Σ_out d_r ≥ L_r − (m_r + s_r)C_r``, so ``o_n`` is
    at least the number of its largest movable guests that add up to that excess; likewise
    ``i_n`` is at least the number of the cluster's largest movable guests that fill the deficit.
    ``M`` is at least the larger of the two sums.

    *Jointly* (the second bound): a guest's cpu and memory move together. For any direction ``u``
    (a weighting of the resources, signs allowed), ``u·b ≥ min over the box of u·x =: h(u)``,
    while ``u·b ≤ S_out(u, o_n) + S_in(−u, i_n)``, where ``S_out(u, o)`` is the sum of the ``o``
    largest positive values of ``u·d`` over the node's movable guests and ``S_in(−u, i)`` that of
    ``−u·d`` over all movable guests (a superset of the possible arrivals, so only weaker). Each
    such inequality is monotone in ``o_n``, so ``o_n ≥ F_n(i_n)``, the least ``o`` that satisfies
    all of them for the directions tried (a finite set: fewer conditions, a weaker but valid
    bound). For any ``λ ∈ [0, 1]``, ``M = λ Σ o_n + (1 − λ) Σ i_n ≥ Σ_n min_i (λ F_n(i) +
    (1 − λ) i)``, plus ``λ`` per guest that must leave an unusable node. Arrivals beyond a table
    of ``MAX_ARRIVALS`` use ``F_n(∞)`` (every movable guest arriving), which is smaller. The bound
    is the largest such sum over the ``λ`` tried, rounded up, and never below the first bound.
    With one direction per resource and ``λ ∈ {0, 1}`` it is the first bound; mixed directions
    capture that a node which must shed much cpu but little memory cannot use its biggest guests.

    The moved-memory bound is the larger of the memory excesses and deficits; it is 0 when the
    memory column does not count bytes (basic mode counts guests, ``balance_source: pressure``
    balances pressure).
    """
    parts = arch_parts(cluster, kept)
    if len(parts) > 1:
        return _parts_added_up(
            [migration_lower_bound(part, target_spread, None, resources) for part in parts]
        )
    loads = loads or LoadModel.build(cluster)
    chosen = _held_resources(cluster, resources)
    cols = [r for r in range(len(RESOURCES)) if RESOURCES[r] in chosen]
    target = _target_vector(target_spread)
    targets = {r: float(target[i]) for i, r in enumerate(RESOURCES)}
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool) & np.all(
        loads.capacity > 0, axis=1
    )
    free = _movable(cluster, kept)
    # One architecture (parts added up above): spread_lower_bound, on the guests found free once.
    spread_lb = _spread_lower_bound(cluster, loads, movable=free)
    movable = free & loads.active
    if usable.sum() < 2:
        # No spread to speak of: only what must leave unusable nodes has to move.
        leaving = movable & (loads.assign >= 0) & ~usable[np.maximum(loads.assign, 0)]
        memory = loads.demand[leaving, RESOURCES.index("memory")].sum()
        moved_bytes = int(memory) if loads.memory_is_bytes else 0
        return LowerBounds(spread_lb, targets, int(leaving.sum()), moved_bytes, chosen)
    tally = _tally(loads, usable, movable, target, cols)
    demand, low, high = loads.demand[:, cols], tally.low[:, cols], tally.high[:, cols]
    joint = _joint_migration_bound(demand, loads.assign, movable, usable, low, high)
    window_count, window_bytes = _window_bound(loads, usable, movable, target, cols)
    return LowerBounds(
        spread=spread_lb,
        target_spread=targets,
        migrations=int(max(tally.out_count, tally.in_count, np.ceil(joint - 1e-6), window_count)),
        moved_bytes=int(max(tally.out_bytes, tally.in_bytes, window_bytes)),
        resources=chosen,
    )


def lower_bounds(
    cluster: Cluster,
    target_spread: Mapping[str, float] | None = None,
    resources: Sequence[str] | None = None,
) -> LowerBounds:
    """Both bounds; the migration bound for ``target_spread`` (default: the spread bound) in
    ``resources`` (default: those the cluster balances)."""
    loads = LoadModel.build(cluster)
    if target_spread is None:
        target_spread = spread_lower_bound(cluster, loads)
    return migration_lower_bound(cluster, target_spread, loads, resources)
