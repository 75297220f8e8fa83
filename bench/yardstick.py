"""The exact-search yardstick: the fewest moves that bring a cluster's memory spread (and, if
asked, its vCPU spread) to a target.

``fewest_moves(cluster, target_spread, time_limit)`` builds a CP-SAT model of the cluster and
searches it for the placement with the fewest migrations whose memory spread (max − min of the
usable nodes' memory fractions, as :func:`opendrs.engine.strategies.cluster_imbalance` measures
it) is at most ``target_spread``; with ``cpu_spread`` the usable nodes' vCPUs over cores must
also differ by at most that. The benchmark gives it the spreads opendrs's default strategy
reached, so "opendrs's moves / best found" says how many more moves opendrs spent on its balance
than an exact search needs for the same memory spread, and for the same memory and vCPU spreads
(``python -m bench``'s realistic table).

The model keeps itself small and its answers valid:

- **Only free guests move**: running guests, movable for ``balance``
  (:func:`opendrs.engine.constraints.movability`), in no rule (no node or guest affinity, not
  ignored) and without a local disk. Every other guest stays where it is, so every rule the
  placement satisfies stays satisfied and no disk is copied; opendrs may move those guests too, so
  it can beat the yardstick.
- **Capacity**: on every node the committed vCPUs and memory (the engine's
  :class:`opendrs.engine.usage.CapacityModel`: memory ≤ the node's memory, vCPUs ≤ cores × the
  vCPU overcommit) stay within the limits; local disks stay where they are.
- **Spread, exactly**: for every two usable nodes ``n, m``, ``L_n·C_m − L_m·C_n ≤ ⌊s·C_n·C_m⌋``
  with ``L`` the memory load and ``C`` the memory capacity in whole units (the greatest common
  divisor of every size, so no rounding) — the same as ``L_n/C_n − L_m/C_m ≤ s``. The vCPU
  spread, when asked, is held the same way with ``L`` the configured vCPUs and ``C`` the cores
  net of reserves (whole thousandths, divided by their greatest common divisor).
- **Guests of one size on one node are alike**: a class ``(home node, memory, vCPUs)`` has an
  integer per node (how many of its guests end there) instead of a boolean per guest — the same
  optimum, far fewer variables.

The search is repeatable: one worker interleaving CP-SAT's subsolvers (its neighbourhood
searches too), a fixed seed, a budget in CP-SAT's deterministic time
(:func:`opendrs.engine.strategies.cpsat.new_solver`: a fifth of ``time_limit``, which one
core spends in a fifth to four fifths of it), the wall-clock
limit only a cap. The answer is the best placement found, whether CP-SAT proved it optimal, and
the model's own lower bound on the moves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from opendrs.engine.constraints import movability
from opendrs.engine.strategies import cluster_imbalance
from opendrs.engine.strategies.cpsat import new_solver
from opendrs.engine.usage import RESOURCES, CapacityModel, LoadModel
from opendrs.model.cluster import Cluster

if TYPE_CHECKING:
    from ortools.sat.python.cp_model import CpModel, CpSolver, IntVar, LinearExprT

#: Per class of free guests, node index → how many of them end there.
Counts = list[dict[int, "IntVar"]]
#: Free guests by (home node, memory units, vCPU thousandths).
Classes = dict[tuple[int, int, int], list[int]]

#: The yardstick's time limit (s) per benchmark size: beyond L it is not run.
TIME_LIMITS: dict[str, float] = {"S": 10.0, "M": 30.0, "L": 60.0}
SEED = 1
#: Relative slack on the target spread, so a placement that reaches it to the last bit is in.
_SLACK = 1e-9
_MEMORY = RESOURCES.index("memory")
_CPU = RESOURCES.index("cpu")


@dataclass(frozen=True)
class Yardstick:
    """What the exact search found for one cluster and target spread."""

    target_spread: float
    #: The fewest moves found reaching the target (None: no placement found).
    moves: int | None
    #: CP-SAT proved ``moves`` the fewest (or proved that no placement reaches the target).
    optimal: bool
    #: The model's lower bound on the moves (CP-SAT's best objective bound, rounded up).
    bound: int
    #: CP-SAT's status name: OPTIMAL, FEASIBLE, INFEASIBLE or UNKNOWN.
    status: str
    #: Guests the model may move, and their classes (variables per node).
    free_guests: int
    classes: int
    seconds: float
    #: CP-SAT's deterministic time spent.
    deterministic: float
    #: Guest id → node for the guests the best placement moves.
    placement: dict[str, str] = field(default_factory=dict)
    #: The vCPU spread the search held too (None: memory alone).
    cpu_spread: float | None = None
    #: The search started from a hint (a placement within its targets, or not).
    hinted: bool = False

    @property
    def summary(self) -> str:
        """``12 (optimal)``, ``15 (≥ 11)``, ``infeasible`` or ``none in time``."""
        if self.moves is None:
            return "infeasible" if self.status == "INFEASIBLE" else "none in time"
        return f"{self.moves:,} (optimal)" if self.optimal else f"{self.moves:,} (≥ {self.bound:,})"


def free_guests(cluster: Cluster) -> np.ndarray:
    """(G,) the guests the yardstick may move: running on a known node, movable for balancing,
    in no rule, without local disks."""
    rules = cluster.rules
    loads = LoadModel.build(cluster)
    return np.array(
        [
            bool(loads.active[j])
            and loads.assign[j] >= 0
            and g.local_disk_bytes == 0
            and g.id not in rules.ignored
            and not rules.node_rules_for(g.id)
            and not rules.guest_rules_for(g.id)
            and movability(g, cluster, "balance") is None
            for j, g in enumerate(cluster.guests)
        ],
        dtype=bool,
    )


@dataclass(frozen=True)
class _Units:
    """The model's integers: memory in one unit, vCPUs in thousandths."""

    memory_unit: int
    guest_memory: np.ndarray  # (G,) memory load, units
    guest_cpu: np.ndarray  # (G,) vCPUs committed, thousandths
    load_fixed: np.ndarray  # (N,) memory load of what stays, units
    balance_capacity: np.ndarray  # (N,) memory the spread divides by, units
    committed_fixed: np.ndarray  # (N, 2) vCPUs (thousandths) and memory (units) committed
    limit: np.ndarray  # (N, 2) the same dimensions' limits
    cpu_unit: int  # vCPU thousandths per unit of the vCPU spread
    cpu_load_fixed: np.ndarray  # (N,) vCPUs of what stays, cpu units
    cpu_capacity: np.ndarray  # (N,) cores the vCPU spread divides by, cpu units


def _units(cluster: Cluster, free: np.ndarray) -> _Units:
    """The cluster's figures in whole model units; ValueError unless the cluster balances
    configured sizes (usage mode ``static``), where a guest's load and commitment are one."""
    loads = LoadModel.build(cluster)
    if cluster.settings.mode != "static" or not loads.memory_is_bytes:
        raise ValueError("the yardstick balances configured memory: usage mode static only")
    cap = CapacityModel.build(cluster)
    demand = loads.demand[:, _MEMORY]
    balance_cap = loads.capacity[:, _MEMORY]
    fixed_load = loads.fractions(None)[:, _MEMORY] * balance_cap
    fixed_load -= np.bincount(loads.assign[free], demand[free], minlength=loads.n_nodes)
    committed = cap.committed()[:, :2]
    committed[:, 0] -= np.bincount(loads.assign[free], cap.demand[free, 0], loads.n_nodes)
    committed[:, 1] -= np.bincount(loads.assign[free], cap.demand[free, 1], loads.n_nodes)
    values = [demand, balance_cap, fixed_load, committed[:, 1], cap.limit[:, 1]]
    whole = [np.rint(v).astype(np.int64) for v in values]
    unit = math.gcd(*(int(x) for w in whole for x in w.tolist())) or 1
    memory = [w // unit for w in whole]
    cpu = np.rint(cap.demand[:, 0] * 1000).astype(np.int64)
    cpu_unit, cpu_fixed, cpu_capacity = _cpu_spread_units(loads, free)
    return _Units(
        memory_unit=unit,
        guest_memory=memory[0],
        guest_cpu=cpu,
        load_fixed=memory[2],
        balance_capacity=memory[1],
        committed_fixed=np.column_stack([np.rint(committed[:, 0] * 1000), memory[3]]).astype(
            np.int64
        ),
        limit=np.column_stack([np.floor(cap.limit[:, 0] * 1000 + 1e-6), memory[4]]).astype(
            np.int64
        ),
        cpu_unit=cpu_unit,
        cpu_load_fixed=cpu_fixed,
        cpu_capacity=cpu_capacity,
    )


def _cpu_spread_units(loads: LoadModel, free: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """The vCPU spread's unit (thousandths of a vCPU), the vCPUs of what stays and the cores per
    node in that unit: configured vCPUs over cores net of reserves, as the balance loads read."""
    demand = loads.demand[:, _CPU] * 1000
    capacity = loads.capacity[:, _CPU] * 1000
    fixed = loads.fractions(None)[:, _CPU] * capacity
    fixed -= np.bincount(loads.assign[free], demand[free], minlength=loads.n_nodes)
    whole = [np.rint(v).astype(np.int64) for v in (demand, capacity, fixed)]
    unit = math.gcd(*(int(x) for w in whole for x in w.tolist())) or 1
    return unit, whole[2] // unit, whole[1] // unit


def _classes(cluster: Cluster, free: np.ndarray, units: _Units) -> Classes:
    """Free guests by (home node, memory units, vCPU thousandths), in guest order."""
    assign = LoadModel.build(cluster).assign
    classes: Classes = {}
    for j in np.flatnonzero(free).tolist():
        key = (int(assign[j]), int(units.guest_memory[j]), int(units.guest_cpu[j]))
        classes.setdefault(key, []).append(j)
    return classes


#: The targets, as shares of the search's, the warm start hands opendrs's default strategy in
#: turn until one leaves the memory spread within the search's target.
WARM_TARGETS: tuple[float, ...] = (1.0, 0.5, 0.25, 0.0)


def warm_start(
    cluster: Cluster,
    target_spread: float,
    free: np.ndarray | None = None,
    *,
    cpu_spread: float | None = None,
) -> dict[str, str]:
    """A first placement for the search (guest id → node): opendrs's default strategy on the
    cluster with every guest but the free ones held where it is and memory alone balanced (with
    ``cpu_spread``, memory and vCPUs, the vCPUs' goal ``cpu_spread``) to the target and, while a
    spread stays above its target, to the smaller targets of :data:`WARM_TARGETS` (shares of
    both; the last one tried when none reaches them)."""
    from opendrs.engine.strategies import DEFAULT_STRATEGY, get_strategy

    free = free_guests(cluster) if free is None else free
    held = frozenset(g.id for g, f in zip(cluster.guests, free.tolist(), strict=True) if not f)
    rules = replace(cluster.rules, ignored=cluster.rules.ignored | held)
    settings = (
        cluster.settings if cpu_spread is not None else replace(cluster.settings, weight_cpu=0.0)
    )
    alone = replace(cluster, rules=rules, settings=settings)
    strategy = get_strategy(DEFAULT_STRATEGY)
    placement: dict[str, str] = {}
    for share in WARM_TARGETS:
        options: dict[str, float | str] = {"target_spread": target_spread * share}
        if cpu_spread is not None:
            # The vCPUs' goal is theirs (not the default strategy's; beyond 100 pp too), reached
            # however many moves it takes (never left as wide as they started instead).
            options["cpu_commit_spread"] = f"{cpu_spread * share * 100!r}%"
            options["cpu_commit_moves"] = 1e15
        proposal = strategy.propose(alone, options=options)
        placement = {m.guest: m.target for m in proposal.net_moves()}
        if within(cluster, placement, target_spread, cpu_spread):
            break
    return placement


def within(
    cluster: Cluster, placement: Mapping[str, str], target_spread: float, cpu_spread: float | None
) -> bool:
    """``placement`` leaves the memory spread within ``target_spread`` and, unless None, the
    vCPU spread within ``cpu_spread``."""
    memory, cpu = spreads(cluster, placement)
    return memory <= target_spread * (1 + _SLACK) and (
        cpu_spread is None or cpu <= cpu_spread * (1 + _SLACK)
    )


def spreads(cluster: Cluster, placement: Mapping[str, str]) -> tuple[float, float]:
    """The memory and vCPU spreads of the usable nodes once ``placement`` (guest id → node) is
    applied."""
    moved = {g: n for g, n in placement.items() if cluster.guest(g).node != n}
    resources = cluster_imbalance(cluster.with_placement(moved)).resources
    return float(resources["memory"].spread), float(resources["cpu"].spread)


def memory_spread(cluster: Cluster, placement: Mapping[str, str]) -> float:
    """The memory spread of the usable nodes once ``placement`` (guest id → node) is applied."""
    return spreads(cluster, placement)[0]


def fewest_moves(
    cluster: Cluster,
    target_spread: float,
    time_limit: float,
    *,
    seed: int = SEED,
    hint: Mapping[str, str] | None = None,
    cpu_spread: float | None = None,
) -> Yardstick:
    """The fewest moves of free guests found in ``time_limit`` s that bring the memory spread of
    the usable nodes to at most ``target_spread`` (a fraction) and, unless ``cpu_spread`` is
    None, their vCPU spread (configured vCPUs over cores) to at most ``cpu_spread``; ``hint``
    (guest id → node, e.g. :func:`warm_start`'s) is where the search starts."""
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    free = free_guests(cluster)
    units = _units(cluster, free)
    classes = _classes(cluster, free, units)
    usable = [
        n for n, node in enumerate(cluster.nodes) if node.usable and units.balance_capacity[n] > 0
    ]
    model = cp_model.CpModel()
    counts = _class_counts(model, classes, units, usable)
    _capacity(model, counts, classes, units, usable)
    memory = _Balanced(units.load_fixed, units.balance_capacity, 1, 1)
    _spread(model, counts, classes, memory, usable, target_spread)
    if cpu_spread is not None:
        cpu = _Balanced(units.cpu_load_fixed, units.cpu_capacity, 2, units.cpu_unit)
        cpu_usable = [n for n in usable if units.cpu_capacity[n] > 0]
        _spread(model, counts, classes, cpu, cpu_usable, cpu_spread)
    stays = [counts[c][home] for c, (home, _mem, _cpu) in enumerate(classes) if home in counts[c]]
    model.minimize(int(free.sum()) - sum(stays))
    if hint:
        _hint(model, cluster, counts, classes, hint)
    solver = new_solver(time_limit, 1, seed)
    solver.parameters.interleave_search = True  # its subsolvers (LNS too) in turn, repeatably
    status = solver.solve(model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    placement = _placement(cluster, solver, counts, classes) if found else {}
    return Yardstick(
        target_spread=target_spread,
        moves=round(solver.objective_value) if found else None,
        optimal=status in (cp_model.OPTIMAL, cp_model.INFEASIBLE),
        bound=_bound(solver.best_objective_bound),
        status=solver.status_name(status),
        free_guests=int(free.sum()),
        classes=len(classes),
        seconds=time.perf_counter() - started,
        deterministic=float(solver.deterministic_time),
        placement=placement,
        cpu_spread=cpu_spread,
        hinted=bool(hint),
    )


def _class_counts(model: CpModel, classes: Classes, units: _Units, usable: Sequence[int]) -> Counts:
    """Per class, an integer per node it fits alone (its home always): how many end there."""
    counts: Counts = []
    for c, ((home, mem, cpu), members) in enumerate(classes.items()):
        fits = [
            n
            for n in usable
            if n == home or (mem <= units.limit[n, 1] and cpu <= units.limit[n, 0])
        ]
        if home not in fits:
            fits.append(home)  # its home, even when not usable: it may stay
        per_node = {n: model.new_int_var(0, len(members), f"c{c}n{n}") for n in fits}
        model.add(sum(per_node.values()) == len(members))
        counts.append(per_node)
    return counts


def _node_sum(counts: Counts, classes: Classes, n: int, what: int) -> LinearExprT:
    """Σ over classes of (count on node ``n``) × the class's ``what`` (1 memory, 2 vCPUs)."""
    return sum(
        key[what] * per_node[n]
        for key, per_node in zip(classes, counts, strict=True)
        if n in per_node
    )


def _capacity(
    model: CpModel,
    counts: Counts,
    classes: Classes,
    units: _Units,
    usable: Sequence[int],
) -> None:
    """Committed vCPUs and memory within every node's limits (or no worse than now)."""
    for n in range(len(units.limit)):
        for dim, what in ((0, 2), (1, 1)):
            arriving = _node_sum(counts, classes, n, what)
            if isinstance(arriving, int):
                continue
            room = int(units.limit[n, dim] - units.committed_fixed[n, dim])
            now = sum(key[what] * len(m) for key, m in classes.items() if key[0] == n)
            model.add(arriving <= max(room, now))


@dataclass(frozen=True)
class _Balanced:
    """One balanced resource in whole units: what stays per node, the capacity the spread
    divides by, the class key's field of a guest's load (1 memory, 2 vCPUs) and how many of
    that field's units make one of the spread's."""

    load_fixed: np.ndarray
    capacity: np.ndarray
    what: int
    unit: int


def _spread(
    model: CpModel,
    counts: Counts,
    classes: Classes,
    resource: _Balanced,
    usable: Sequence[int],
    target: float,
) -> None:
    """``L_n·C_m − L_m·C_n ≤ ⌊s·C_n·C_m⌋`` for every two usable nodes (one resource)."""
    cap, what, unit = resource.capacity, resource.what, resource.unit
    if any(key[what] % unit for key in classes):
        raise ValueError("a guest's load is not a whole number of the spread's units")
    scaled = [key[what] // unit for key in classes]
    top = int(resource.load_fixed.max()) + sum(
        w * len(m) for w, m in zip(scaled, classes.values(), strict=True)
    )
    load = {}
    for n in usable:
        arriving = sum(
            w * per_node[n] for w, per_node in zip(scaled, counts, strict=True) if n in per_node
        )
        total = model.new_int_var(0, top, f"load{what}n{n}")
        model.add(total == int(resource.load_fixed[n]) + arriving)
        load[n] = total
    for n in usable:
        for m in usable:
            if n != m:
                slack = math.floor(target * (1 + _SLACK) * int(cap[n]) * int(cap[m]))
                model.add(load[n] * int(cap[m]) - load[m] * int(cap[n]) <= slack)


def _bound(value: float) -> int:
    """CP-SAT's objective bound in whole moves (0 when it has none)."""
    return max(0, math.ceil(value - 1e-6)) if math.isfinite(value) else 0


def _hint(
    model: CpModel, cluster: Cluster, counts: Counts, classes: Classes, hint: Mapping[str, str]
) -> None:
    """Every count hinted as ``hint`` places the class's guests (unhinted ones at home)."""
    index = cluster.node_index
    for (home, _mem, _cpu), per_node, members in zip(
        classes, counts, classes.values(), strict=True
    ):
        wanted = dict.fromkeys(per_node, 0)
        for j in members:
            n = index.get(hint.get(cluster.guests[j].id, ""), home)
            wanted[n if n in wanted else home] += 1
        for n, var in per_node.items():
            model.add_hint(var, wanted[n])


def _placement(
    cluster: Cluster,
    solver: CpSolver,
    counts: Counts,
    classes: Classes,
) -> dict[str, str]:
    """Guest id → node of the guests the solution moves: in each class the first ones stay."""
    placement: dict[str, str] = {}
    for (home, _mem, _cpu), per_node, members in zip(
        classes, counts, classes.values(), strict=True
    ):
        queue = list(members)[int(solver.value(per_node[home])) :]
        for n, var in sorted(per_node.items()):
            if n == home:
                continue
            for _ in range(int(solver.value(var))):
                placement[cluster.guests[queue.pop(0)].id] = cluster.nodes[n].name
    return placement


__all__ = [
    "SEED",
    "TIME_LIMITS",
    "Yardstick",
    "fewest_moves",
    "free_guests",
    "memory_spread",
    "spreads",
    "warm_start",
    "within",
]
