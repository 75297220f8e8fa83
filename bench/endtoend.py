"""End to end: ``opendrs plan FILE`` beside proxlb-solver's CLI and ProxLB, each a fresh process.

``python -m bench.endtoend [--sizes L,XL,XXL] [--generator both|all|NAME,…]
[--rules without|with|both] [--forms snapshot,scenario] [--peers proxlb-solver,proxlb-greedy]
[--seed 1] [--timeout 900] [--keep DIR] [--markdown FILE]`` (also the last sections of
``python -m bench``: the earlier generators with the peers, the production-like ones alone with
and without rules, for the growth exponent of :func:`bench.endtoend_report.growth_section`).

For every generator (:data:`bench.clusters.GENERATORS`), size and rules variant (``--rules``,
without by default) the generated cluster is written as the files an operator or a peer would
hand in (:data:`FORMS`): a snapshot as ``opendrs snapshot`` writes it by default (YAML) and the
proxlb-solver scenario of :mod:`bench.scenario` (``method: memory``: what proxlb-solver reads).
Then, on each file, each in a fresh process, from its start to its exit:

* ``opendrs plan FILE --format json`` (``python -m opendrs``): read, balance, bounds, ordered plan;
* proxlb-solver's own CLI, ``proxlb-solver --scenarios DIR --quiet --markdown OUT`` on the scenario
  alone in ``DIR`` (``python -m proxlb_solver.cli``): its YAML loader, CP-SAT with
  ``solve_reachable``'s default limit (:data:`SOLVER_CLI_TIME_LIMIT`: the CLI passes none), its
  planner and its Markdown report, the only output that lists its migrations;
* ProxLB's greedy balancer (:mod:`bench.peers.greedy_file`): the file read as opendrs reads it,
  ProxLB's ``ProxLbData`` built and its decision steps run (ProxLB itself collects from the
  Proxmox API instead, which is not in it).

Each row gives the process's wall and CPU seconds and its peak RSS (:mod:`bench.process`), and
the placement it leaves evaluated with opendrs's code on the cluster read from the same file
(:mod:`bench.metrics`), with ratios of wall time against the peers on the same file. The peers run
up to the largest sizes they finish (:data:`PEER_MAX_SIZE`); a run still going at ``--timeout`` is
killed and shown as such. The targets (#15): at 100,000 guests, ≤ 20 s wall and ≤ 1.5 GiB.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.clusters import GENERATORS, GROUPS, generated, generator_names
from bench.generate import SIZES
from bench.metrics import Evaluation, Evaluator, Snapshot
from bench.process import ROOT, Measured, checkout_env, measure
from bench.report import emit

GiB = 1024**3
#: The files each cluster is written as: the snapshot (YAML), the proxlb-solver scenario.
FORMS: tuple[str, ...] = ("snapshot", "scenario")
DEFAULT_SIZES: tuple[str, ...] = ("L", "XL", "XXL")
#: Largest size each peer runs at (as in ``python -m bench``), and the files it reads.
PEER_MAX_SIZE: dict[str, str] = {"proxlb-solver": "L", "proxlb-greedy": "XL"}
PEER_FORMS: dict[str, tuple[str, ...]] = {"proxlb-solver": ("scenario",), "proxlb-greedy": FORMS}
#: The package each peer needs (the ``bench`` extra).
PEER_PACKAGES: dict[str, str] = {"proxlb-solver": "proxlb_solver", "proxlb-greedy": "proxlb"}
#: proxlb-solver's CLI solves with ``solve_reachable``'s default total time limit (seconds).
SOLVER_CLI_TIME_LIMIT = 60.0
#: The targets of #15 for ``opendrs plan FILE`` at :data:`TARGET_GUESTS` guests.
TARGET_GUESTS = 100_000
TARGET_WALL = 20.0
TARGET_RSS = int(1.5 * GiB)
OPENDRS = "opendrs plan"
#: ``--rules`` → the rule variants of each cluster.
RULES: dict[str, tuple[bool, ...]] = {"without": (False,), "with": (True,), "both": (False, True)}


@dataclass(frozen=True)
class Input:
    """A file handed to the runners: which cluster, in which form, where."""

    generator: str
    size: str
    form: str
    path: Path
    guests: int
    rules: bool = False

    @property
    def label(self) -> str:
        rules = " with rules" if self.rules else ""
        return f"{self.generator} {self.size}{rules}, {self.form}"


@dataclass
class Row:
    """One runner's end-to-end run on one file."""

    runner: str
    measured: Measured | None = None
    evaluation: Evaluation | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Result:
    """Every runner on one file, with the file's balance before and the peers not run."""

    input: Input
    megabytes: float
    before: Snapshot | None = None
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def row(self, runner: str) -> Row | None:
        return next((r for r in self.rows if r.runner == runner), None)


def write_inputs(
    folder: Path,
    generator: str,
    size: str,
    seed: int,
    rules: bool = False,
    forms: Sequence[str] = FORMS,
) -> list[Input]:
    """The generated cluster of ``(generator, size, seed, rules)`` as a snapshot and as a
    scenario, those of ``forms``."""
    from bench.proxlb_scale import dumps
    from bench.scenario import scenario_document
    from opendrs.model.snapshot import dump

    cluster = generated(generator, size, seed=seed, rules=rules)
    stem = f"{generator}-{size}" + ("-rules" if rules else "")
    guests = len(cluster.guests)
    inputs = []
    if "snapshot" in forms:
        snapshot = folder / f"{stem}.yaml"
        dump(cluster, snapshot, "yaml")
        inputs.append(Input(generator, size, "snapshot", snapshot, guests, rules))
    if "scenario" in forms:
        scenario = folder / f"{stem}-scenario" / f"{stem}.yaml"  # alone in its folder, for the CLI
        scenario.parent.mkdir(parents=True, exist_ok=True)
        scenario.write_text(dumps(scenario_document(cluster, "memory")), encoding="utf-8")
        inputs.append(Input(generator, size, "scenario", scenario, guests, rules))
    return inputs


# The runners: each a command on a file, writing its output to ``out``, and a reader of it.


def opendrs_command(item: Input, out: Path) -> tuple[list[str], bool]:
    """``opendrs plan FILE --format json``; the plan goes to stdout (True: into ``out``)."""
    return [sys.executable, "-m", "opendrs", "plan", str(item.path), "--format", "json"], True


def solver_command(item: Input, out: Path) -> tuple[list[str], bool]:
    """proxlb-solver's CLI on the folder holding the scenario alone, its report into ``out``."""
    folder = str(item.path.parent)
    cli = [sys.executable, "-m", "proxlb_solver.cli"]
    return [*cli, "--scenarios", folder, "--quiet", "--markdown", str(out)], False


def greedy_command(item: Input, out: Path) -> tuple[list[str], bool]:
    """ProxLB's steps on the file (:mod:`bench.peers.greedy_file`), placement into ``out``."""
    return [sys.executable, "-m", "bench.peers.greedy_file", str(item.path), str(out)], False


def plan_placement(text: str) -> tuple[dict[str, str], list[str]]:
    """The final node of every guest ``opendrs plan --format json`` moves, and its stop note."""
    plan = json.loads(text)
    final: dict[str, str] = {}
    first: dict[str, str] = {}
    for move in sorted(plan["moves"], key=lambda m: m["step"]):
        first.setdefault(move["guest"], move["source"])
        final[move["guest"]] = move["target"]
    placement = {g: node for g, node in final.items() if node != first[g]}
    notes = [f"stopped: {plan['stopped']}", f"{plan['plan']['steps']} steps"]
    if not plan["plan"]["feasible"]:
        notes.append("plan not feasible")
    return placement, notes


_STATUS = re.compile(r"^- Status: \*\*(\w+)\*\*", re.MULTILINE)


def solver_placement(text: str) -> tuple[dict[str, str], list[str]]:
    """The migrations of proxlb-solver's Markdown report (``| VM | From | To | …``), its status."""
    placement: dict[str, str] = {}
    in_table = False
    for line in text.splitlines():
        if line.startswith("#### "):
            in_table = line == "#### Migrations"
        elif in_table and line.startswith("| ") and not line.startswith("| VM "):
            vm, _source, target = (cell.strip() for cell in line.strip("|").split("|")[:3])
            placement[vm] = target
    status = _STATUS.search(text)
    notes = [f"status {status.group(1) if status else 'unknown'}"]
    if "UNREACHABLE" in text:
        notes.append("no executable migration path")
    return placement, notes


def greedy_placement(text: str) -> tuple[dict[str, str], list[str]]:
    result = json.loads(text)
    return dict(result["placement"]), list(result["notes"])


Command = Callable[[Input, Path], tuple[list[str], bool]]
Reader = Callable[[str], tuple[dict[str, str], list[str]]]
#: Runner → (command, reader of its output).
RUNNERS: dict[str, tuple[Command, Reader]] = {
    OPENDRS: (opendrs_command, plan_placement),
    "proxlb-solver": (solver_command, solver_placement),
    "proxlb-greedy": (greedy_command, greedy_placement),
}


def why_not(peer: str, item: Input) -> str | None:
    """Why ``peer``, which reads files of ``item``'s form, is not run on it; None to run it."""
    if importlib.util.find_spec(PEER_PACKAGES[peer]) is None:
        return f"{peer} (not installed: `make bench` installs the bench extra)"
    largest = PEER_MAX_SIZE[peer]
    order = list(SIZES)
    if order.index(item.size) > order.index(largest):
        return f"{peer} (runs up to {largest})"
    return None


def run_one(runner: str, item: Input, folder: Path, timeout: float) -> tuple[Row, Path]:
    """``runner`` on ``item`` in a fresh process; its row (measured) and its output file."""
    command, _reader = RUNNERS[runner]
    out = folder / f"{item.path.stem}-{item.form}-{runner.replace(' ', '-')}.out"
    cmd, to_stdout = command(item, out)
    err = out.with_suffix(".err")
    with (
        open(out if to_stdout else out.with_suffix(".stdout"), "w", encoding="utf-8") as stdout,
        open(err, "w", encoding="utf-8") as stderr,
    ):
        done = measure(
            cmd, timeout=timeout, cwd=ROOT, env=checkout_env(), stdout=stdout, stderr=stderr
        )
    row = Row(runner, done)
    if done.killed_after is not None:
        row.error = f"killed after {done.killed_after:g} s"
    elif not out.exists() or not out.stat().st_size:
        lines = [ln for ln in err.read_text(encoding="utf-8").splitlines() if ln.strip()]
        row.error = f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    elif done.returncode != 0:
        row.notes.append(f"exit status {done.returncode}")
    return row, out


def evaluate(result: Result, outputs: dict[str, Path]) -> None:
    """Every finished row's placement measured on the cluster read from the file."""
    from bench.peers.greedy_file import read_cluster

    evaluator = Evaluator(read_cluster(str(result.input.path)))
    result.before = evaluator.before
    for row in result.rows:
        if row.error is not None:
            continue
        try:
            placement, notes = RUNNERS[row.runner][1](outputs[row.runner].read_text("utf-8"))
            row.evaluation = evaluator.evaluate(placement)
        except (ValueError, KeyError) as exc:
            row.error = f"unreadable output: {exc}"
            continue
        row.notes.extend(notes)


def run_input(item: Input, peers: Sequence[str], timeout: float, folder: Path) -> Result:
    """Every runner that applies on one file, then their placements evaluated."""
    result = Result(item, item.path.stat().st_size / 1e6)
    outputs: dict[str, Path] = {}
    runners = [OPENDRS, *(p for p in peers if item.form in PEER_FORMS[p])]
    for runner in runners:
        reason = None if runner == OPENDRS else why_not(runner, item)
        if reason is not None:
            result.skipped.append(reason)
            continue
        _progress(f"[end to end] {item.label}: {runner} …")
        row, outputs[runner] = run_one(runner, item, folder, timeout)
        result.rows.append(row)
        _progress(f"[end to end] {item.label}: {runner}: {_done(row)}")
    evaluate(result, outputs)
    return result


def _done(row: Row) -> str:
    m = row.measured
    return row.error or (f"{m.wall:.1f} s" if m else "not run")


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(
    generators: Sequence[str],
    sizes: Sequence[str],
    *,
    seed: int = 1,
    forms: Sequence[str] = FORMS,
    peers: Sequence[str] = tuple(PEER_MAX_SIZE),
    timeout: float = 900.0,
    keep: Path | None = None,
    rules: Sequence[bool] = (False,),
) -> list[Result]:
    """Write the inputs of every ``(generator, size, rules)``; run the runners on those of
    ``forms``."""
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="opendrs-endtoend-") as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for generator, size, with_rules in (
            (g, s, r) for g in generators for s in sizes for r in rules
        ):
            _progress(f"[end to end] writing {generator} {size} into {folder} …")
            for item in write_inputs(folder, generator, size, seed, with_rules, forms):
                results.append(run_input(item, peers, timeout, folder))
    return results


def _names(
    text: str, known: Sequence[str], what: str, parser: argparse.ArgumentParser
) -> list[str]:
    """A comma-separated list of ``known`` names ('none' for none)."""
    names = [] if text == "none" else [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        parser.error(f"unknown {what} {bad[0]!r} (known: {', '.join(known)})")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.endtoend",
        description="Measure `opendrs plan FILE` end to end beside proxlb-solver and ProxLB.",
    )
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES))
    parser.add_argument(
        "--generator",
        default="both",
        metavar="NAME,…",
        help=f"a comma list of {', '.join([*GENERATORS, *GROUPS])} (default both: basic, skewed)",
    )
    parser.add_argument("--rules", choices=tuple(RULES), default="without")
    parser.add_argument("--forms", default=",".join(FORMS), help="snapshot, scenario or both")
    parser.add_argument("--peers", default=",".join(PEER_MAX_SIZE), help="'none' for none")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, metavar="SECONDS")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE")
    return parser


def main(argv: list[str] | None = None) -> int:
    from bench.endtoend_report import section

    parser = build_parser()
    args = parser.parse_args(argv)
    sizes = _names(args.sizes, list(SIZES), "size", parser)
    forms = _names(args.forms, FORMS, "form", parser)
    peers = _names(args.peers, list(PEER_MAX_SIZE), "peer", parser)
    try:
        generators = generator_names(args.generator)
    except ValueError as exc:
        parser.error(f"--generator: {exc}")
    results = run(
        generators,
        sizes,
        seed=args.seed,
        forms=forms,
        peers=peers,
        timeout=args.timeout,
        keep=args.keep,
        rules=RULES[args.rules],
    )
    emit(section(results), args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
