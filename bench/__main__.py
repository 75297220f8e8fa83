"""Run the benchmarks: ``python -m bench [--sizes S,M] [--seed N]``.

Each case runs in this process, one after the other, twice: once timed with ``time.perf_counter``,
once under ``tracemalloc`` for its peak memory (Python allocations, numpy included) — tracing slows
allocation-heavy code several times, so the two are never measured in the same run.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from bench.generate import SIZES, generate
from opendrs.engine.placement import place_new
from opendrs.engine.strategies.pve import propose_bruteforce
from opendrs.model.cluster import Guest

GiB = 1024**3


def measure(func: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, seconds, peak MiB) of a call: timed untraced, then run again under tracemalloc."""
    start = time.perf_counter()
    result = func()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    try:
        func()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, seconds, peak / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--sizes", default="S,M", help="comma-separated sizes (S, M, L, XL, XXL)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        parser.error(f"unknown size {unknown[0]!r} (known: {', '.join(SIZES)})")
    header = f"{'case':28} {'time':>9} {'peak MiB':>9}  result"
    print(header)
    print("-" * len(header))
    for name in names:
        for rules in (False, True):
            cluster = generate(SIZES[name], seed=args.seed, rules=rules)
            label = f"{name}{'+rules' if rules else ''}"
            placement, secs, peak = measure(
                lambda c=cluster: place_new(c, Guest("new", "", cpu=4, memory=16 * GiB))
            )
            print(f"{label + ' place new':28} {secs:8.3f}s {peak:9.1f}  best {placement.best}")
            proposal, secs, peak = measure(
                lambda c=cluster: propose_bruteforce(c, threshold=0.0, margin=0.0, max_moves=10)
            )
            before = proposal.before.combined.cv
            after = proposal.after.combined.cv
            print(
                f"{label + ' pve-bruteforce x10':28} {secs:8.3f}s {peak:9.1f}  "
                f"{len(proposal.moves)} moves, CV {before:.3f} -> {after:.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
