"""CPU time of one engine step on a benchmark cluster: what a shared machine does not blur.

``python -m bench.cputime balance|constraints [--size XXL] [--seed 1] [--rules] [--repeat N]
[--generator basic|skewed]``

Generates the cluster (:data:`bench.clusters.GENERATORS`, default ``basic``), then runs the step
``--repeat`` times in this process — ``balance``: the default strategy's ``propose``;
``constraints``: ``Constraints.build`` — and prints, per run, its CPU time (this process's user
and system time, which other jobs on the machine barely change), its wall time, and the
process's peak RSS so far (the cluster included). The wall time on a machine shared with other
jobs can be twice the CPU time or more; compare code before and after by CPU time, each measured
alternately.
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable

from bench.clusters import GENERATORS, generated
from bench.generate import SIZES
from opendrs.engine.constraints import Constraints
from opendrs.engine.strategies import get_strategy
from opendrs.model.cluster import Cluster


def _step(name: str) -> Callable[[Cluster], object]:
    if name == "balance":
        strategy = get_strategy("balance")
        return lambda cluster: strategy.propose(cluster, options={})
    return Constraints.build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cputime", description=__doc__)
    parser.add_argument("step", choices=("balance", "constraints"))
    parser.add_argument("--size", default="XXL", choices=tuple(SIZES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rules", action="store_true", help="the cluster's rules variant")
    parser.add_argument("--repeat", type=int, default=1, help="runs in this process (default 1)")
    parser.add_argument("--generator", default="basic", choices=tuple(GENERATORS))
    args = parser.parse_args(argv)
    cluster = generated(args.generator, args.size, seed=args.seed, rules=args.rules)
    step = _step(args.step)
    for _ in range(max(1, args.repeat)):
        wall, cpu = time.perf_counter(), time.process_time()
        step(cluster)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rules = "with rules" if args.rules else "without rules"
        print(
            f"{args.step} {args.size} {args.generator} seed {args.seed} {rules}: "
            f"cpu {cpu:.2f} s, wall {wall:.2f} s, "
            f"peak RSS {peak:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
