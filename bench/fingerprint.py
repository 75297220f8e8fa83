"""What a change that keeps behaviour must leave byte for byte the same, as SHA-256 digests.

``python -m bench.fingerprint [--sizes S,M,L,XL,XXL] [--generators basic,skewed]
[--strategies balance,...] [--seed 1] [--month] [--keep DIR] [--json FILE]``

* ``plan``: ``opendrs plan FILE --format json [--strategy NAME]`` on each benchmark cluster (each
  generator of :mod:`bench.clusters`, with and without rules), the snapshot written as JSON first
  — each strategy asked for (default: the default one), the planner and the bounds, as a user
  runs them. A case is named ``SIZE[-rules]``, prefixed ``GENERATOR-`` for a generator other than
  ``basic`` and suffixed ``@STRATEGY`` for a strategy other than the default;
* ``month`` (with ``--month``): ``opendrs simulate --format json`` on the built-in month with the
  default policies, each run's ``wall_seconds`` left out (the only field that depends on the
  machine).

Each command runs in a subprocess with the interpreter running this script, so that
``PYTHONPATH`` chooses the code measured; compare two runs' JSON to see what changed.
``--keep DIR`` keeps the outputs for a diff.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.clusters import GENERATORS, generated
from bench.generate import SIZES
from opendrs.engine.strategies import DEFAULT_STRATEGY
from opendrs.model.snapshot import dump


def _opendrs(args: list[str]) -> tuple[int, str, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "opendrs", *args], capture_output=True, text=True, check=False
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"opendrs {' '.join(args)}: exit {done.returncode}: {done.stderr}")
    return done.returncode, done.stdout, time.perf_counter() - started


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plan_digests(
    sizes: list[str],
    generators: list[str],
    strategies: list[str],
    seed: int,
    keep: Path | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for generator, size, rules in (
            (g, s, r) for g in generators for s in sizes for r in (False, True)
        ):
            cluster = f"{'' if generator == 'basic' else generator + '-'}{size}"
            cluster += "-rules" if rules else ""
            path = Path(tmp) / f"{cluster}.json"
            dump(generated(generator, size, seed=seed, rules=rules), path, "json")
            for strategy in strategies:
                case = cluster if strategy == DEFAULT_STRATEGY else f"{cluster}@{strategy}"
                chosen = [] if strategy == DEFAULT_STRATEGY else ["--strategy", strategy]
                status, text, wall = _opendrs(["plan", str(path), "--format", "json", *chosen])
                moves = len(json.loads(text)["moves"])
                out[case] = {"sha256": _digest(text), "exit": status, "moves": moves}
                out[case]["wall_s"] = round(wall, 1)
                if keep is not None:
                    (keep / f"plan-{case}.json").write_text(text, encoding="utf-8")
                print(f"plan {case}: {out[case]}", file=sys.stderr)
    return out


def month_digest(keep: Path | None) -> dict[str, Any]:
    status, text, wall = _opendrs(["simulate", "--no-progress", "--format", "json"])
    data = json.loads(text)
    for run in data:  # one report per policy
        run.pop("wall_seconds", None)
    stable = json.dumps(data, indent=2, sort_keys=True)
    if keep is not None:
        (keep / "month.json").write_text(stable, encoding="utf-8")
    return {"sha256": _digest(stable), "exit": status, "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fingerprint", description=__doc__)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--generators", default=",".join(GENERATORS))
    parser.add_argument("--strategies", default=DEFAULT_STRATEGY)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--month", action="store_true", help="also the month's stability report")
    parser.add_argument("--keep", metavar="DIR", type=Path)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    plans = plan_digests(
        args.sizes.split(","),
        args.generators.split(","),
        args.strategies.split(","),
        args.seed,
        args.keep,
    )
    result: dict[str, Any] = {"plan": plans}
    if args.month:
        result["month"] = month_digest(args.keep)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
