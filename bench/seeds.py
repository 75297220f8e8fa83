"""``balance`` over many seeds, one process: what it reaches, at what cost, against the bounds.

``python -m bench.seeds [--generator basic|skewed] [--sizes S,M,L] [--seeds 1,2,3]
[--rules both|with|without] [--no-bounds]``

For every (size, seed, rules) cluster of the generator (:data:`bench.clusters.GENERATORS`) it runs
the default strategy's ``propose`` once and prints one JSON line: the memory and CPU spread after
it (pp, as :mod:`bench.metrics` measures them), the migrations, whether it stopped balanced, its
CPU time (this process's user and system time, which other jobs on a shared machine barely
change) and wall time, the process's peak RSS so far, and — unless ``--no-bounds`` — the lower
bound on migrations for the spreads reached (:class:`bench.metrics.Evaluator`) and the ratio.
Every case runs in the same process, so the peak RSS is the largest so far, not the case's own;
``python -m bench`` gives each case its own process.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.clusters import GENERATORS, generated
from bench.generate import SIZES
from bench.metrics import Evaluator, Snapshot
from bench.worker import peak_rss_bytes
from opendrs.engine.strategies import get_strategy

RULES = {"both": (False, True), "with": (True,), "without": (False,)}


def measure(generator: str, size: str, seed: int, rules: bool, bounds: bool) -> dict[str, Any]:
    """One cluster balanced, measured."""
    cluster = generated(generator, size, seed=seed, rules=rules)
    wall, cpu = time.perf_counter(), time.process_time()
    proposal = get_strategy("balance").propose(cluster, options={})
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    placement = {m.guest: m.target for m in proposal.net_moves()}
    after = Snapshot.of(cluster.with_placement(placement))
    line: dict[str, Any] = {
        "generator": generator,
        "size": size,
        "seed": seed,
        "rules": rules,
        "memory_spread_pp": round(after.memory_spread * 100, 2),
        "cpu_spread_pp": round(after.cpu_spread * 100, 2),
        "migrations": len(placement),
        "balanced": proposal.stopped.startswith("balanced"),
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "peak_rss_mib": round((peak_rss_bytes() or 0) / 2**20),
    }
    if bounds:
        evaluation = Evaluator(cluster).evaluate(placement)
        line["lb_migrations"] = evaluation.lb_migrations
        if evaluation.lb_migrations:
            line["migrations_per_lb"] = round(len(placement) / evaluation.lb_migrations, 3)
        line["violations"] = len(evaluation.violations)
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.seeds", description=__doc__)
    parser.add_argument("--generator", default="skewed", choices=tuple(GENERATORS))
    parser.add_argument("--sizes", default="S,M,L")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--rules", default="both", choices=tuple(RULES))
    parser.add_argument("--no-bounds", action="store_true", help="leave the lower bounds out")
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown size {unknown[0]!r} (known: {', '.join(SIZES)})")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds: expected whole numbers separated by commas, got {args.seeds!r}")
    for size in sizes:
        for seed in seeds:
            for rules in RULES[args.rules]:
                line = measure(args.generator, size, seed, rules, not args.no_bounds)
                print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
