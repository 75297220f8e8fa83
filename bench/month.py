"""How balanced can the built-in month be kept with a given number of migrations?

``python -m bench.month [--moves 15,20,25,30] [--days 14] [--scenario month]``

Issue #4 asks opendrs for fewer migrations *and* less time above the threshold than every emulated
peer on the month scenario. This measures what a number of migrations can buy there at all. For
each budget ``K`` it moves at most ``K`` guests once, from the scenario's starting placement, and
reports the share of the minutes of days 1 … ``days`` whose spread — the simulator's yardstick:
the larger of the cpu and memory max − min of the node loads averaged over 30 minutes, all nodes
up — is above 15 pp:

* **foresight** — the placement a local search finds knowing every guest's usage over those very
  days (greedy moves, then swaps of one moved guest for another move, on the number of minutes
  above the threshold): better than any controller can do, which only knows the past. It is a
  search, not a proof: the best placement may be better still.
* **day 0** — what a controller could know after a day: moves chosen greedily on each guest's
  mean usage over day 0 (cpu and memory, the capacity-weighted variance of the node fractions —
  what ``balance`` minimises), then judged on days 1 … ``days``.

No faults (node failure, maintenance) and no later moves: it prices the initial rebalance alone.
Deterministic: the usage is the scenario's, from its seed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opendrs.backends.scenario import BUILTIN_SCENARIOS, Scenario, builtin_scenario
from opendrs.backends.workload import UsageGenerator
from opendrs.engine.usage import node_base, node_capacity

DAY_STEPS = 1440
THRESHOLD = 0.15
WINDOW = 30  # minutes of the yardstick's average
SAMPLE = 10  # the search looks at every tenth minute
BLOCK = 1440


@dataclass(frozen=True)
class Month:
    """The usage of every guest, per minute, and the nodes' capacities and own loads."""

    cpu: np.ndarray  # (G, T) cores
    memory: np.ndarray  # (G, T) bytes
    capacity: np.ndarray  # (N, 2)
    base: np.ndarray  # (N, 2)
    start: np.ndarray  # (G,) node index

    @classmethod
    def load(cls, scenario: Scenario, days: int) -> Month:
        cluster = scenario.cluster
        if scenario.step != 60:
            raise ValueError(f"the scenario's step must be one minute, not {scenario.step:g} s")
        generator = UsageGenerator(
            cluster.guests,
            scenario.patterns(),
            seed=scenario.seed,
            step=scenario.step,
            block=BLOCK,
            trace=scenario.trace,
        )
        steps = (days + 1) * DAY_STEPS
        blocks = [generator.block(b) for b in range(math.ceil(steps / BLOCK))]
        cpu = np.concatenate([b[0] for b in blocks], axis=1)[:, :steps]
        memory = np.concatenate([b[1] for b in blocks], axis=1)[:, :steps]
        capacity = node_capacity(cluster, "dynamic")
        base = node_base(cluster, "dynamic")
        start = np.array([cluster.node_index[g.node] for g in cluster.guests], dtype=np.intp)
        return cls(cpu, memory, capacity, base, start)

    def averaged(self, first: int, last: int, every: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Each guest's 30-minute trailing mean, per node fraction of a node of capacity 1, at
        minutes ``first, first + every, … < last``: (G, T') for cpu and memory."""
        out = []
        for usage in (self.cpu, self.memory):
            sums = np.cumsum(np.concatenate([np.zeros((usage.shape[0], 1)), usage], axis=1), 1)
            ends = np.arange(first + 1, last + 1, every)
            starts = np.maximum(ends - WINDOW, 0)
            out.append((sums[:, ends] - sums[:, starts]) / (ends - starts))
        return out[0], out[1]


class Loads:
    """Node load fractions (N, T') for a placement, kept up to date move by move."""

    def __init__(self, month: Month, cpu: np.ndarray, memory: np.ndarray, assign: np.ndarray):
        self.cap = month.capacity
        self.usage = (cpu, memory)
        n_nodes = self.cap.shape[0]
        self.assign = assign.copy()
        self.f = []
        for k, usage in enumerate(self.usage):
            total = np.zeros((n_nodes, usage.shape[1]))
            np.add.at(total, self.assign, usage)
            self.f.append((month.base[:, k : k + 1] + total) / self.cap[:, k : k + 1])

    def move(self, guest: int, target: int) -> None:
        source = int(self.assign[guest])
        for k, usage in enumerate(self.usage):
            self.f[k][source] -= usage[guest] / self.cap[source, k]
            self.f[k][target] += usage[guest] / self.cap[target, k]
        self.assign[guest] = target

    def spread(self) -> np.ndarray:
        return np.maximum(*(f.max(axis=0) - f.min(axis=0) for f in self.f))


def _score(spread: np.ndarray) -> np.ndarray:
    """Minutes above the threshold, then (to break ties and guide the search) how far above."""
    return (spread > THRESHOLD).sum(axis=-1) + 0.01 * np.maximum(spread - 0.12, 0).sum(axis=-1)


def best_move(loads: Loads) -> tuple[float, int, int]:
    """The single move with the lowest score: (score, guest, target); guest −1 when none."""
    n_nodes = loads.cap.shape[0]
    best = (math.inf, -1, -1)
    for source in range(n_nodes):
        guests = np.nonzero(loads.assign == source)[0]
        if not guests.size:
            continue
        for target in range(n_nodes):
            if target == source:
                continue
            others = np.ones(n_nodes, dtype=bool)
            others[[source, target]] = False
            parts = []
            for k, usage in enumerate(loads.usage):
                f = loads.f[k]
                left = f[source][None] - usage[guests] / loads.cap[source, k]
                right = f[target][None] + usage[guests] / loads.cap[target, k]
                high = np.maximum(np.maximum(f[others].max(axis=0), left), right)
                low = np.minimum(np.minimum(f[others].min(axis=0), left), right)
                parts.append(high - low)
            scores = _score(np.maximum(*parts))
            i = int(np.argmin(scores))
            if scores[i] < best[0]:
                best = (float(scores[i]), int(guests[i]), target)
    return best


def foresight(month: Month, budget: int, days: int, passes: int = 3) -> np.ndarray:
    """A placement with at most ``budget`` guests moved, searched on days 1 … ``days``."""
    cpu, memory = month.averaged(DAY_STEPS, (days + 1) * DAY_STEPS, SAMPLE)
    loads = Loads(month, cpu, memory, month.start)
    current = float(_score(loads.spread()))
    while np.count_nonzero(loads.assign != month.start) < budget:
        score, guest, target = best_move(loads)
        if guest < 0 or score >= current:
            break
        loads.move(guest, target)
        current = score
    for _ in range(passes):
        improved = False
        for guest in np.nonzero(loads.assign != month.start)[0].tolist():
            where = int(loads.assign[guest])
            loads.move(guest, int(month.start[guest]))
            score, other, target = best_move(loads)
            # One guest back home, one move made: never more than the budget.
            if other >= 0 and score < current - 1e-9:
                loads.move(other, target)
                current, improved = score, True
            else:
                loads.move(guest, where)
        if not improved:
            break
    return loads.assign.copy()


def day_zero(month: Month, budget: int) -> np.ndarray:
    """At most ``budget`` greedy moves on day 0's mean usage (capacity-weighted variance)."""
    demand = np.stack(
        [month.cpu[:, :DAY_STEPS].mean(axis=1), month.memory[:, :DAY_STEPS].mean(axis=1)], axis=1
    )
    cap = month.capacity
    weight = 1.0 / cap.sum(axis=0)
    n_guests = demand.shape[0]
    assign = month.start.copy()
    load = month.base.copy()
    np.add.at(load, assign, demand)
    rows = np.arange(n_guests)
    while np.count_nonzero(assign != month.start) < budget:
        here = load[assign]
        leave = ((here - demand) ** 2 - here**2) / cap[assign]
        arrive = ((load[None] + demand[:, None]) ** 2 - load[None] ** 2) / cap[None]
        delta = ((leave[:, None, :] + arrive) * weight).sum(axis=2)
        delta[rows, assign] = np.inf
        guest, target = np.unravel_index(int(np.argmin(delta)), delta.shape)
        if delta[guest, target] >= -1e-12:
            break
        load[assign[guest]] -= demand[guest]
        load[target] += demand[guest]
        assign[guest] = target
    return assign


def above(month: Month, assign: np.ndarray, days: int) -> float:
    """Percent of the minutes of days 1 … ``days`` above the threshold, for ``assign``."""
    cpu, memory = month.averaged(DAY_STEPS, (days + 1) * DAY_STEPS)
    return 100.0 * float(np.mean(Loads(month, cpu, memory, assign).spread() > THRESHOLD))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.month", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--moves", default="15,20,25,30", help="migration budgets (default %(default)s)"
    )
    parser.add_argument(
        "--days", type=int, default=14, help="days judged, from day 1 (default %(default)s)"
    )
    parser.add_argument("--scenario", default="month", choices=BUILTIN_SCENARIOS)
    args = parser.parse_args(argv)
    try:
        budgets = [int(v) for v in args.moves.split(",")]
    except ValueError:
        parser.error(f"--moves: expected whole numbers separated by commas, got {args.moves!r}")
    if any(b < 0 for b in budgets) or args.days < 1:
        parser.error("--moves must be ≥ 0 and --days ≥ 1")
    month = Month.load(builtin_scenario(args.scenario), args.days)
    print(f"{args.scenario}: minutes above {THRESHOLD * 100:g} pp, days 1–{args.days}")
    print(f"start: {above(month, month.start, args.days):.1f} %")
    print("| migrations | foresight | day 0 |")
    print("|---:|---:|---:|")
    for budget in budgets:
        best = above(month, foresight(month, budget, args.days), args.days)
        causal = above(month, day_zero(month, budget), args.days)
        print(f"| {budget} | {best:.1f} % | {causal:.1f} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
