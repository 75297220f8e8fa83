"""``balance`` over many seeds, one process: what it reaches, at what cost, against the bounds.

``python -m bench.seeds [--generator basic|skewed] [--sizes S,M,L] [--seeds 1,2,3]
[--rules both|with|without] [--no-bounds] [--yardstick] [--yardstick-cpu]
[--option NAME=VALUE …]``

For every (size, seed, rules) cluster of the generator (:data:`bench.clusters.GENERATORS`) it runs
the default strategy's ``propose`` once (with the ``--option`` values, JSON, as ``opendrs plan -o``
gives them) and prints one JSON line: the memory and CPU spread after it (pp, as
:mod:`bench.metrics` measures them), the migrations and their cost (GiB: moved memory plus the
disk factor times moved local disk), whether it stopped balanced, its CPU time (this process's
user and system time, which other jobs on a shared machine barely change) and wall time, the
process's peak RSS so far, and — unless ``--no-bounds`` — the lower bound on migrations for the
spreads reached (:class:`bench.metrics.Evaluator`) and for the memory spread alone
(:func:`bench.realistic_report.memory_bound`), and the ratios. With ``--yardstick`` (sizes up to L)
also the fewest moves the exact search (:mod:`bench.yardstick`) finds for the memory spread
reached, started from its warm start, and opendrs's moves over them; with ``--yardstick-cpu``
also for the memory and vCPU spreads reached (the same goals as the plan's: where ``balance``
left the vCPU commitments no wider than they started, their spread then), from the warm start
for both where that reaches them.
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
from bench.metrics import Evaluator, GiB, Snapshot
from bench.realistic_report import memory_bound
from bench.worker import peak_rss_bytes
from bench.yardstick import TIME_LIMITS, fewest_moves, warm_start, within
from opendrs.engine.strategies import get_strategy
from opendrs.model.cluster import Cluster

RULES = {"both": (False, True), "with": (True,), "without": (False,)}


def measure(
    generator: str,
    size: str,
    seed: int,
    rules: bool,
    bounds: bool,
    options: dict[str, Any] | None = None,
    yardstick: bool = False,
    yardstick_cpu: bool = False,
) -> dict[str, Any]:
    """One cluster balanced (with ``options``), measured; with ``yardstick``, beside the exact
    search's best for the same memory spread, with ``yardstick_cpu`` for the same memory and
    vCPU spreads too."""
    cluster = generated(generator, size, seed=seed, rules=rules)
    wall, cpu = time.perf_counter(), time.process_time()
    proposal = get_strategy("balance").propose(cluster, options=options or {})
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
        "cpu_commit_kept": "cpu_commit_moves" in (proposal.stop.details if proposal.stop else {}),
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "peak_rss_mib": round((peak_rss_bytes() or 0) / 2**20),
    }
    line["cost_gib"] = round(_cost_gib(cluster, placement))
    if bounds:
        evaluation = Evaluator(cluster).evaluate(placement)
        line["lb_migrations"] = evaluation.lb_migrations
        if evaluation.lb_migrations:
            line["migrations_per_lb"] = round(len(placement) / evaluation.lb_migrations, 3)
        memory_lb = memory_bound(cluster, after.memory_spread)
        line["lb_memory_migrations"] = memory_lb
        if memory_lb:
            line["migrations_per_memory_lb"] = round(len(placement) / memory_lb, 3)
        line["violations"] = len(evaluation.violations)
    if yardstick and size in TIME_LIMITS:
        line.update(_best_found(cluster, after.memory_spread, TIME_LIMITS[size], len(placement)))
    if yardstick_cpu and size in TIME_LIMITS:
        both = _best_found_both(cluster, after, TIME_LIMITS[size], len(placement))
        line.update(both)
    return line


def _best_found_both(cluster: Cluster, after: Snapshot, limit: float, moves: int) -> dict[str, Any]:
    """The exact search's fewest moves for the memory and vCPU spreads ``after`` (in ``limit``
    s), from the warm start for both where it reaches them, and ``moves`` over them."""
    spread, cpu = after.memory_spread, after.cpu_spread
    start = warm_start(cluster, spread, cpu_spread=cpu)
    hint = start if within(cluster, start, spread, cpu) else None
    found = fewest_moves(cluster, spread, limit, hint=hint, cpu_spread=cpu)
    out: dict[str, Any] = {"best_found_both": found.moves, "best_found_both_bound": found.bound}
    out["best_found_both_status"] = found.status
    if found.moves:
        out["migrations_per_best_both"] = round(moves / found.moves, 3)
    return out


def _best_found(cluster: Cluster, spread: float, limit: float, moves: int) -> dict[str, Any]:
    """The exact search's fewest moves for the memory ``spread`` (in ``limit`` s), and
    ``moves`` over them."""
    found = fewest_moves(cluster, spread, limit, hint=warm_start(cluster, spread))
    out: dict[str, Any] = {"best_found": found.moves, "best_found_bound": found.bound}
    out["best_found_optimal"] = found.optimal
    out["best_found_s"] = round(found.seconds, 1)
    if found.moves:
        out["migrations_per_best"] = round(moves / found.moves, 3)
    return out


def _cost_gib(cluster: Cluster, placement: dict[str, str]) -> float:
    """The moves' cost in GiB, as :attr:`bench.metrics.Evaluation.cost_gib` counts it."""
    factor = float(cluster.settings.cost_disk_factor)
    moved = [g for g in cluster.guests if placement.get(g.id, g.node) != g.node]
    return sum(g.memory + factor * g.local_disk_bytes for g in moved) / GiB


def _option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with a JSON value (a bare word where it is not JSON)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.seeds", description=__doc__)
    parser.add_argument("--generator", default="skewed", choices=tuple(GENERATORS))
    parser.add_argument("--sizes", default="S,M,L")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--rules", default="both", choices=tuple(RULES))
    parser.add_argument("--no-bounds", action="store_true", help="leave the lower bounds out")
    parser.add_argument(
        "--yardstick",
        action="store_true",
        help="the exact search's fewest moves for the memory spread reached (sizes up to L)",
    )
    parser.add_argument(
        "--yardstick-cpu",
        action="store_true",
        help="the exact search's fewest moves for the memory and vCPU spreads reached",
    )
    parser.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a balance option (JSON value), repeatable, e.g. --option hold=true",
    )
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
                line = measure(
                    args.generator,
                    size,
                    seed,
                    rules,
                    not args.no_bounds,
                    dict(args.option),
                    args.yardstick,
                    args.yardstick_cpu,
                )
                print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
