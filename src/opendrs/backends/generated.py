"""Generated months: simulator scenarios of different shapes from a seed.

``opendrs simulate --generate SEED [--nodes N --guests M]`` runs the policies on the month this
module makes from ``SEED``. The seed alone draws the month's **shape** — five independent choices:

* **node sizes** — ``uniform`` (one size), ``two sizes`` (half big, half medium) or ``mixed``
  (each node its own size); scaled so that the guests' configured memory fills 55–70 % of the
  cluster (``--fill`` sets that share instead: 0.8 and more leave little room to restart a
  failed node's HA guests);
* **packing** at the start — ``balanced`` (memory spread evenly), ``skewed`` (a quarter of the
  nodes filled to 90 % of their memory), ``packed`` (a third filled to 97 %) or ``one hot node``
  (one node filled to 97 %);
* **workload mix** — how many guests of each kind of the built-in month (web, app, db, batch, ci,
  cache, analytics, infra, dev): ``office hours``, ``batch bursts``, ``trends``, ``random walks``
  or ``mixed`` (the month's proportions). Each kind follows the built-in month's workload pattern
  for its tag (``opendrs/data/scenarios/month.yaml``), with its levels, peak hours, burst rates,
  trends and walks drawn anew around it;
* **faults** — 0–2 node failures (1–8 h), 0–2 maintenance windows (2–6 h), 0–3 API outages
  (5–45 min), and 0–5 % of migrations failing part-way;
* **hot spots** — 1–3 lasting (a job's CPU up for 2–8 hours on one node) and 1–2 alternating (two
  jobs on two nodes taking hourly turns), the jobs pinned to their node
  (:mod:`.generated_hotspots`).

``--nodes`` and ``--guests`` change the size, not the shape: the same seed gives the same shape at
any size; ``--fill`` changes how full the nodes are, not the shape. Everything is deterministic:
the same ``(seed, nodes, guests, fill)`` gives the same scenario, byte for byte. The guests are
built and packed as the built-in month's are (:mod:`opendrs.backends.simgen`): every hard rule
holds at the start and no node is over its capacity; at the default size and fill, with the
biggest node down the others still hold every guest's configured memory (the generated months'
tests check both for the first seeds).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from opendrs.backends.generated_hotspots import hot_spot_jobs, job_workloads, pinned
from opendrs.backends.scenario import Fault, MigrationModel, Scenario, builtin_scenario
from opendrs.backends.simgen import MONTH_KINDS, db_pairs, make_guests, place_guests
from opendrs.backends.workload import Pattern, Workload
from opendrs.model.cluster import Cluster, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules

__all__ = [
    "DEFAULT_GUESTS",
    "DEFAULT_NODES",
    "DRAWN_FILL",
    "FILL_RANGE",
    "GUESTS_RANGE",
    "NODES_RANGE",
    "Shape",
    "generated_scenario",
    "shape_of",
]

GiB: Final = 1024**3
HOUR: Final = 3600.0
DAY: Final = 86_400.0
DAYS: Final = 30
DEFAULT_NODES: Final = 10
DEFAULT_GUESTS: Final = 200
#: Sizes a generated month may have (``--nodes``, ``--guests``).
NODES_RANGE: Final = (3, 200)
GUESTS_RANGE: Final = (10, 10_000)
#: Shares of the cluster's memory the guests' configured memory may fill (``--fill``); drawn
#: from :data:`DRAWN_FILL` when not given.
FILL_RANGE: Final = (0.3, 0.85)
DRAWN_FILL: Final = (0.55, 0.7)

#: Node sizes: (cores, memory in GiB), small to big.
_NODE_CLASSES: Final = ((32, 256), (48, 384), (64, 512), (96, 768))
_NODE_LAYOUTS: Final = ("uniform", "two sizes", "mixed")
#: Packing: (share of the nodes packed, at least one; memory filled on them); none: balanced.
_PACKINGS: Final[dict[str, tuple[float, float] | None]] = {
    "balanced": None,
    "skewed": (0.25, 0.9),
    "packed": (0.34, 0.97),
    "one hot node": (0.0, 0.97),
}
#: Guests of each kind of :data:`MONTH_KINDS` per 400, by mix (in that order: web, app, db,
#: batch, ci, cache, analytics, infra, dev).
_MIXES: Final[dict[str, tuple[int, ...]]] = {
    "mixed": tuple(kind.count for kind in MONTH_KINDS),
    "office hours": (140, 100, 30, 10, 10, 20, 10, 30, 50),
    "batch bursts": (40, 40, 20, 110, 110, 20, 20, 20, 20),
    "trends": (50, 70, 50, 20, 20, 100, 30, 30, 30),
    "random walks": (50, 100, 30, 20, 20, 30, 100, 30, 20),
}


@dataclass(frozen=True)
class Shape:
    """What a seed draws: node sizes, packing at the start, workload mix, faults."""

    nodes: str
    packing: str
    mix: str
    node_failures: int
    maintenance: int
    api_outages: int
    failure_rate: float
    #: Hot spots: lasting ones (a job's usage up for hours on one node) and alternating ones
    #: (two jobs on two nodes taking turns) (:mod:`.generated_hotspots`).
    lasting_hot_spots: int
    alternating_hot_spots: int

    def describe(self) -> str:
        return (
            f"{self.nodes} nodes, {self.packing}, {self.mix}; {self.node_failures} node "
            f"failure(s), {self.maintenance} maintenance window(s), {self.api_outages} API "
            f"outage(s), {100 * self.failure_rate:g} % of migrations failing; "
            f"{self.lasting_hot_spots} lasting and {self.alternating_hot_spots} alternating "
            "hot spot(s)"
        )


def shape_of(seed: int) -> Shape:
    """The shape ``seed`` draws (whatever the size)."""
    rng = np.random.default_rng([seed, 0])
    return Shape(
        nodes=str(rng.choice(_NODE_LAYOUTS)),
        packing=str(rng.choice(list(_PACKINGS))),
        mix=str(rng.choice(list(_MIXES))),
        node_failures=int(rng.integers(0, 3)),
        maintenance=int(rng.integers(0, 3)),
        api_outages=int(rng.integers(0, 4)),
        failure_rate=float(rng.choice((0.0, 0.01, 0.02, 0.05))),
        lasting_hot_spots=int(rng.integers(1, 4)),
        alternating_hot_spots=int(rng.integers(1, 3)),
    )


def generated_scenario(
    seed: int, nodes: int = DEFAULT_NODES, guests: int = DEFAULT_GUESTS, fill: float | None = None
) -> Scenario:
    """The 30-day month of ``seed`` with ``nodes`` nodes and about ``guests`` guests, the
    guests' configured memory ``fill`` of the cluster's (None: drawn from :data:`DRAWN_FILL`)."""
    if not NODES_RANGE[0] <= nodes <= NODES_RANGE[1]:
        raise ValueError(f"nodes must be from {NODES_RANGE[0]} to {NODES_RANGE[1]}")
    if not GUESTS_RANGE[0] <= guests <= GUESTS_RANGE[1]:
        raise ValueError(f"guests must be from {GUESTS_RANGE[0]} to {GUESTS_RANGE[1]}")
    if fill is not None and not FILL_RANGE[0] <= fill <= FILL_RANGE[1]:
        raise ValueError(f"fill must be from {FILL_RANGE[0]:g} to {FILL_RANGE[1]:g}")
    shape = shape_of(seed)
    rng = np.random.default_rng([seed, 1, nodes, guests])
    name = f"generated-{seed}" if fill is None else f"generated-{seed}-fill-{fill:g}"
    cluster = _cluster(rng, shape, nodes, guests, name, fill)
    node_names = tuple(n.name for n in cluster.nodes)
    workloads = _workloads(rng)
    faults = _faults(rng, shape, node_names)
    jobs = hot_spot_jobs(
        np.random.default_rng([seed, 2, nodes, guests]),
        cluster,
        shape.lasting_hot_spots,
        shape.alternating_hot_spots,
        DAYS,
    )
    cluster = pinned(cluster, jobs)
    return Scenario(
        cluster=cluster,
        name=name,
        seed=seed,
        step=60.0,
        duration=DAYS * DAY,
        migration=MigrationModel(failure_rate=shape.failure_rate),
        workloads=job_workloads(cluster, jobs, workloads),
        faults=faults,
        file=f"generated:{seed}",
    )


def _counts(mix: tuple[int, ...], guests: int) -> list[int]:
    """``guests`` shared out in the proportions of ``mix`` (largest remainders)."""
    exact = np.array(mix, dtype=float) * guests / sum(mix)
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: guests - int(counts.sum())]:
        counts[i] += 1
    return [int(c) for c in counts]


def _node_classes(rng: np.random.Generator, layout: str, count: int) -> list[tuple[int, int]]:
    if layout == "uniform":
        return [_NODE_CLASSES[int(rng.integers(1, 4))]] * count
    if layout == "two sizes":
        big = int(rng.integers(2, 4))
        return [_NODE_CLASSES[big if i < (count + 1) // 2 else big - 1] for i in range(count)]
    return [_NODE_CLASSES[int(rng.integers(0, 4))] for _ in range(count)]


def _cluster(
    rng: np.random.Generator, shape: Shape, count: int, guests: int, name: str, fill: float | None
) -> Cluster:
    kinds = tuple(
        replace(kind, count=n)
        for kind, n in zip(MONTH_KINDS, _counts(_MIXES[shape.mix], guests), strict=True)
    )
    made = make_guests(rng, kinds, 1000)
    classes = _node_classes(rng, shape.nodes, count)
    drawn = float(rng.uniform(*DRAWN_FILL))  # drawn whatever ``fill`` is: the rest stays
    fill = drawn if fill is None else fill
    memory = sum(g.memory for g in made) / GiB
    vcpus = sum(g.cpu for g in made)
    scale = memory / fill / sum(gib for _, gib in classes)
    # At least a vCPU per two guest vCPUs over the cluster (and per core, four).
    cpu_scale = max(scale, vcpus / 2.0 / sum(cores for cores, _ in classes))
    nodes = tuple(
        Node(
            f"node{i + 1:02d}",
            cpu=float(max(8, round(cores * cpu_scale))),
            memory=max(64, 16 * round(gib * scale / 16)) * GiB,
            base_cpu=round(float(rng.uniform(0.4, 1.0)), 2),
            base_memory=int(rng.integers(3, 7)) * GiB,
        )
        for i, (cores, gib) in enumerate(classes)
    )
    settings = Settings(reserve_cpu=1.0, reserve_memory=8 * GiB, min_uptime=600)
    pairs = db_pairs(made)
    packing = _PACKINGS[shape.packing]
    hot, packed_fill = (0, 1.0) if packing is None else packing
    packed = max(1, round(hot * count)) if packing is not None else 0
    try:
        placed = place_guests(rng, made, nodes, settings, hot=packed, fill=packed_fill, apart=pairs)
    except RuntimeError as exc:  # a --fill too high for the packing
        raise ValueError(f"fill {fill:g}: {exc}") from None
    rules = Rules(
        guest_affinity=tuple(
            GuestAffinity(f"db-pair-{k + 1}", pair, positive=False, hard=True)
            for k, pair in enumerate(pairs)
        )
    )
    return Cluster(nodes, tuple(placed), rules, settings, name)


def _workloads(rng: np.random.Generator) -> tuple[Workload, ...]:
    """The built-in month's workloads by tag, each drawn anew around the month's pattern."""
    return tuple(
        replace(w, cpu=_vary(rng, w.cpu), memory=_vary(rng, w.memory))
        for w in builtin_scenario("month").workloads
    )


def _vary(rng: np.random.Generator, pattern: Pattern | None) -> Pattern | None:
    """``pattern`` with its levels, peak hour, bursts, trend and walk drawn around its own."""
    if pattern is None:
        return None
    factor = float(rng.uniform(0.75, 1.3))
    out = replace(
        pattern, constant=None if pattern.constant is None else min(1.0, pattern.constant * factor)
    )
    if pattern.diurnal is not None:
        peak = (pattern.diurnal.peak + float(rng.uniform(-3, 3))) % 24
        amplitude = pattern.diurnal.amplitude * float(rng.uniform(0.6, 1.5))
        out = replace(out, diurnal=replace(pattern.diurnal, peak=peak, amplitude=amplitude))
    if pattern.spikes is not None:
        rate = pattern.spikes.rate * float(rng.uniform(0.5, 1.8))
        height = min(1.0, pattern.spikes.height * float(rng.uniform(0.8, 1.3)))
        out = replace(out, spikes=replace(pattern.spikes, rate=rate, height=height))
    if pattern.ramp is not None:
        begin = float(rng.uniform(1, 10)) * DAY
        over = float(rng.uniform(5, 20)) * DAY
        to = min(0.95, pattern.ramp.to * float(rng.uniform(0.85, 1.1)))
        out = replace(out, ramp=replace(pattern.ramp, begin=begin, over=over, to=to))
    if pattern.walk is not None:
        volatility = pattern.walk.volatility * float(rng.uniform(0.6, 1.6))
        out = replace(out, walk=replace(pattern.walk, volatility=volatility))
    return out


def _faults(rng: np.random.Generator, shape: Shape, nodes: tuple[str, ...]) -> tuple[Fault, ...]:
    """Node failures and maintenance windows on distinct nodes, API outages, over days 1–28."""
    down = [str(n) for n in rng.permutation(nodes)[: shape.node_failures + shape.maintenance]]
    faults: list[Fault] = []
    for node in down[: shape.node_failures]:
        at = _minute(float(rng.uniform(1, 28)) * DAY)
        hours = float(rng.choice((1, 2, 4, 8)))
        faults.append(Fault("node-failure", at=at, node=node, duration=hours * HOUR))
    for node in down[shape.node_failures :]:
        # Maintenance on a weekday, from 8 to 11 o'clock.
        day = int(rng.integers(1, 28))
        day += 2 if day % 7 == 5 else 1 if day % 7 == 6 else 0
        at = day * DAY + float(rng.integers(8, 12)) * HOUR
        hours = float(rng.choice((2, 4, 6)))
        faults.append(Fault("maintenance", at=at, node=node, duration=hours * HOUR))
    for _ in range(shape.api_outages):
        at = _minute(float(rng.uniform(1, 29)) * DAY)
        faults.append(Fault("api-error", at=at, duration=float(rng.integers(5, 46)) * 60))
    return tuple(sorted(faults, key=lambda f: (f.at or 0.0, f.type, f.node or "")))


def _minute(seconds: float) -> float:
    return float(round(seconds / 60) * 60)
