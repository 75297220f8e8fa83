"""The reading benchmark: how long opendrs takes to read big inputs, and its peak memory then.

``python -m bench.reading [--seed 1] [--repeats 3] [--keep DIR] [--markdown FILE]`` (also part of
``python -m bench``). The inputs are written first, into a temporary folder (or ``--keep DIR``):

* the XXL benchmark cluster (:mod:`bench.generate`, 1,000 nodes and 100,000 guests, without
  rules) as a YAML snapshot and as a JSON snapshot, written by :func:`opendrs.model.snapshot.dump`;
* a proxlb-solver scenario of 100,000 VMs with a skewed placement and 2:1 vCPU overcommit
  (:mod:`bench.proxlb_scale`).

Each is read ``--repeats`` times, each time in a fresh interpreter (``python -m bench.reading
--one FILE``) as ``opendrs plan FILE`` reads it: the file's bytes, the document parsed, then the
snapshot or the scenario built and checked. A reading reports its wall and CPU seconds (parse and
build apart) and the process's peak RSS (``VmHWM``), the interpreter with opendrs imported
included. The table gives the median of the repeats' times and the largest peak.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import emit

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024**2
#: The size the snapshots are generated at, and the VMs of the scenario.
SNAPSHOT_SIZE = "XXL"
SCENARIO_VMS = 100_000


@dataclass(frozen=True)
class Input:
    """A file to read: its label in the table, its path and its guest count."""

    label: str
    path: Path
    guests: int


@dataclass
class Reading:
    """One input's readings, summarised: medians of the times, the largest peak RSS."""

    input: Input
    megabytes: float
    wall: float
    cpu: float
    parse: float
    build: float
    rss_peak: int
    rss_imports: int
    repeats: int


def write_inputs(folder: Path, seed: int = 1) -> list[Input]:
    """Write the benchmark's inputs into ``folder``."""
    from bench.generate import SIZES, generate
    from bench.proxlb_scale import dumps, scenario
    from opendrs.model.snapshot import dump

    cluster = generate(SNAPSHOT_SIZE, seed=seed)
    guests = SIZES[SNAPSHOT_SIZE].guests
    inputs = []
    for fmt in ("yaml", "json"):
        path = folder / f"bench-{SNAPSHOT_SIZE}.{fmt}"
        dump(cluster, path, fmt)
        inputs.append(Input(f"{SNAPSHOT_SIZE} snapshot, {fmt.upper()}", path, guests))
    del cluster
    path = folder / f"proxlb-scale-{SCENARIO_VMS}.yaml"
    path.write_text(dumps(scenario(SCENARIO_VMS, seed=seed)), encoding="utf-8")
    inputs.append(Input(f"proxlb-solver scenario, {SCENARIO_VMS:,} VMs", path, SCENARIO_VMS))
    return inputs


def read_once(path: str) -> dict[str, Any]:
    """Read ``path`` as ``opendrs plan`` does, in this process; the figures of :class:`Reading`."""
    from bench.worker import peak_rss_bytes
    from opendrs.compat.proxlb import is_proxlb_scenario, scenario_from_dict
    from opendrs.model.document import parse, read_file
    from opendrs.model.snapshot import from_dict

    rss_imports = peak_rss_bytes()
    wall, cpu = time.perf_counter(), time.process_time()
    filename, data = read_file(path)
    document = parse(data, filename=filename)
    del data
    parsed = time.process_time()
    if is_proxlb_scenario(document):
        guests = len(scenario_from_dict(document, filename=filename).cluster.guests)
    else:
        guests = len(from_dict(document, filename=filename).guests)
    done = time.process_time()
    return {
        "wall": time.perf_counter() - wall,
        "cpu": done - cpu,
        "parse": parsed - cpu,
        "build": done - parsed,
        "guests": guests,
        "rss_peak": peak_rss_bytes(),
        "rss_imports": rss_imports,
    }


def measure(item: Input, repeats: int) -> Reading:
    """``repeats`` readings of ``item``, each in a fresh interpreter."""
    from bench.process import checkout_env

    env = checkout_env()
    runs = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-m", "bench.reading", "--one", str(item.path)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout))
        if runs[-1]["guests"] != item.guests:
            raise RuntimeError(f"{item.path}: read {runs[-1]['guests']} guests, not {item.guests}")
    return Reading(
        input=item,
        megabytes=item.path.stat().st_size / 1e6,
        wall=statistics.median(r["wall"] for r in runs),
        cpu=statistics.median(r["cpu"] for r in runs),
        parse=statistics.median(r["parse"] for r in runs),
        build=statistics.median(r["build"] for r in runs),
        rss_peak=max(r["rss_peak"] for r in runs),
        rss_imports=max(r["rss_imports"] for r in runs),
        repeats=repeats,
    )


def section(readings: list[Reading]) -> str:
    """The readings as a Markdown section."""
    lines = [
        "### Reading big inputs",
        "",
        "Each file read as `opendrs plan FILE` reads it, in a fresh interpreter; times are the "
        f"median of {readings[0].repeats if readings else 0} readings, the peak RSS the largest "
        "(the interpreter with opendrs imported included).",
        "",
        "| input | MB | guests | read s (wall) | CPU s | parse s | build s | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in readings:
        lines.append(
            f"| {r.input.label} | {r.megabytes:.1f} | {r.input.guests:,} | {r.wall:.2f} | "
            f"{r.cpu:.2f} | {r.parse:.2f} | {r.build:.2f} | {r.rss_peak / MIB:.0f} |"
        )
    return "\n".join(lines) + "\n"


def run(seed: int, repeats: int, keep: Path | None = None) -> list[Reading]:
    """Write the inputs and read each ``repeats`` times."""
    with tempfile.TemporaryDirectory(prefix="opendrs-reading-") as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"[reading] writing the inputs into {folder} …", file=sys.stderr, flush=True)
        readings = []
        for item in write_inputs(folder, seed):
            readings.append(measure(item, repeats))
            print(
                f"[reading] {item.label}: {readings[-1].wall:.2f} s",
                file=sys.stderr,
                flush=True,
            )
        return readings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reading",
        description="Measure how long opendrs takes to read big snapshots and scenarios.",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE")
    parser.add_argument("--one", default=None, metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(read_once(args.one)))
        return 0
    if args.repeats < 1:
        parser.error("--repeats: expected at least 1")
    emit(section(run(args.seed, args.repeats, args.keep)), args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
