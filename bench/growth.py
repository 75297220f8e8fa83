"""How ``opendrs plan FILE --format json`` grows with the cluster, with and without rules.

``python -m bench.growth [--generators skewed,mixed] [--sizes S,M,L,XL,XXL] [--seed 1]
[--split SHARE] [--timeout 900] [--json FILE]``

Each size of each generator (:mod:`bench.clusters`), without and with rules, is written as a JSON
snapshot and planned in a fresh process (:func:`bench.process.measure`: wall time, CPU time, peak
RSS, the interpreter's start and the reading included). The growth exponent of each series is the
least-squares slope of log time against log guests: 1 is linear. The smallest sizes are dominated
by the interpreter's start (about 0.5 s), which flattens a slope over them; the slope from L up is
shown beside it. ``--split SHARE`` breaks that share of the hard affinity rules before planning
(:func:`split_groups`): the plan starts with a repair of the rules.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.clusters import generated
from bench.endtoend_report import exponent
from bench.generate import SIZES
from bench.process import checkout_env, measure
from opendrs.model.cluster import Cluster
from opendrs.model.snapshot import dump

MiB = 1024**2


def split_groups(cluster: Cluster, share: float, seed: int) -> Cluster:
    """``cluster`` with ``share`` of its hard affinity rules broken (drawn with ``seed``): the last
    guest of each moved to another node, drawn at random."""
    rng = np.random.default_rng(seed)
    names = [n.name for n in cluster.nodes]
    where = {g.id: g.node for g in cluster.guests}
    for rule in cluster.rules.guest_affinity:
        if rule.positive and rule.hard and rng.random() < share:
            guest = rule.guests[-1]
            away = (names.index(where[guest]) + 1 + int(rng.integers(len(names) - 1))) % len(names)
            where[guest] = names[away]
    return replace(cluster, guests=tuple(replace(g, node=where[g.id]) for g in cluster.guests))


def series(
    generator: str, sizes: list[str], rules: bool, seed: int, timeout: float, split: float = 0.0
) -> list[dict]:
    """One row per size: guests, wall s, CPU s, peak RSS MiB, exit code (``split``: the share of
    hard affinity rules broken first)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            path = Path(tmp) / f"{generator}-{size}.json"
            cluster = generated(generator, size, seed=seed, rules=rules)
            if split:
                cluster = split_groups(cluster, split, seed)
            dump(cluster, path, "json")
            cmd = [sys.executable, "-m", "opendrs", "plan", str(path), "--format", "json"]
            done = measure(cmd, timeout=timeout, env=checkout_env())
            rss = None if done.rss_peak is None else round(done.rss_peak / MiB)
            row = {"size": size, "guests": len(cluster.guests), "wall_s": round(done.wall, 2)}
            row |= {"cpu_s": round(done.cpu, 2), "rss_mib": rss, "exit": done.returncode}
            print(f"{generator} {size} rules={rules}: {row}", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def fitted(rows: list[dict]) -> dict[str, float]:
    """The growth exponents of a series: CPU and wall, over every size and from L up (none for
    a single size)."""
    out: dict[str, float] = {}
    large = [r for r in rows if r["size"] not in ("S", "M")]
    for key in ("cpu_s", "wall_s"):
        series = {key: rows, f"{key}_from_L": large if len(large) < len(rows) else []}
        for name, chosen in series.items():
            slope = exponent([(r["guests"], r[key]) for r in chosen])
            if slope is not None:
                out[name] = round(slope, 2)
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = ["| generator | rules | size | guests | wall s | CPU s | peak RSS MiB |"]
    lines.append("|---|---|---|---:|---:|---:|---:|")
    for name, found in results.items():
        generator, rules = name.rsplit("/", 1)
        for r in found["rows"]:
            cells = [generator, rules, r["size"], f"{r['guests']:,}", r["wall_s"], r["cpu_s"]]
            lines.append("| " + " | ".join(str(c) for c in [*cells, r["rss_mib"]]) + " |")
    lines += ["", "| generator | rules | exponent (CPU) | (wall) | from L (CPU) | (wall) |"]
    lines.append("|---|---|---:|---:|---:|---:|")
    for name, found in results.items():
        f = found["exponent"]
        cells = [*name.rsplit("/", 1), f.get("cpu_s", "—"), f.get("wall_s", "—")]
        cells += [f.get("cpu_s_from_L", "—"), f.get("wall_s_from_L", "—")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__)
    parser.add_argument("--generators", default="skewed,mixed")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--split", type=float, default=0.0, help="share of affinity rules broken")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    sizes = args.sizes.split(",")
    results: dict[str, Any] = {}
    for generator in args.generators.split(","):
        for rules in (False, True) if not args.split else (True,):
            rows = series(generator, sizes, rules, args.seed, args.timeout, args.split)
            name = f"{generator}/{'with' if rules else 'without'}"
            results[name] = {"rows": rows, "exponent": fitted(rows)}
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
