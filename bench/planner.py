"""The planner alone at scale: ``plan_moves`` ordering ``balance``'s proposal into safe steps.

``python -m bench.planner [--size XXL] [--seed 1] [--rules] [--generator basic|skewed]``

Generates the cluster (:data:`bench.clusters.GENERATORS`), asks the default strategy
(``balance``) for its proposal, then times ``plan_moves`` on the proposal's net moves twice: with
the constraints built for the cluster passed in (as the daemon and ``opendrs plan`` pass the
view's), and building its own. Prints the moves, the steps, whether every placement was reached,
the wall and CPU seconds of each and the process's peak RSS (the cluster included).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.clusters import GENERATORS, generated
from bench.generate import SIZES
from bench.worker import peak_rss_bytes
from opendrs.engine.constraints import Constraints
from opendrs.engine.planner import plan_moves
from opendrs.engine.strategies import get_strategy


def measure(size: str, seed: int, rules: bool, generator: str) -> dict[str, Any]:
    """``plan_moves`` on ``balance``'s proposal for one generated cluster, timed."""
    cluster = generated(generator, size, seed=seed, rules=rules)
    proposal = get_strategy("balance").propose(cluster, options={})
    target = {m.guest: m.target for m in proposal.net_moves()}
    constraints = Constraints.build(cluster)
    result: dict[str, Any] = {
        "generator": generator,
        "size": size,
        "seed": seed,
        "rules": rules,
        "moves": len(target),
    }
    for label, given in (("with_constraints", constraints), ("building_constraints", None)):
        wall, cpu = time.perf_counter(), time.process_time()
        plan = plan_moves(cluster, target, constraints=given)
        result[label] = {
            "wall_s": round(time.perf_counter() - wall, 3),
            "cpu_s": round(time.process_time() - cpu, 3),
            "planned": len(plan.moves),
            "steps": plan.steps,
            "feasible": plan.feasible,
        }
    result["peak_rss_mib"] = round((peak_rss_bytes() or 0) / 2**20, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.planner", description=__doc__)
    parser.add_argument("--size", default="XXL", choices=tuple(SIZES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rules", action="store_true", help="the cluster's rules variant")
    parser.add_argument("--generator", default="basic", choices=tuple(GENERATORS))
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.size, args.seed, args.rules, args.generator), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
