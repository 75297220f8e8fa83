"""Benchmark opendrs's strategies against ProxLB's greedy balancer and proxlb-solver, in one run.

``python -m bench [--sizes S,M,L] [--strategies A,B] [--peers proxlb-greedy,proxlb-solver]
[--rules both|with|without] [--time-limit S] [--seed N] [--generator NAME,…|both|all]
[--no-yardstick] [--yardstick-time-limit S] [--methods memory] [--method-seeds 1,2,3]
[--no-reading] [--no-endtoend] [--endtoend-sizes L,XL,XXL] [--no-growth]
[--growth-sizes S,M,L,XL,XXL] [--no-startup] [--startup-repeats N] [--no-hot-months]
[--hot-seeds 1,89,97] [--hot-store FILE] [--markdown FILE] [--json FILE]``

For every generator (:data:`bench.clusters.GENERATORS`: :mod:`bench.generate`'s ``basic``,
:mod:`bench.skewed`'s ``skewed`` and :mod:`bench.realistic`'s production-like ``new-node``,
``hot-rack`` and ``mixed``, all by default), size and rules case the same seeded cluster
goes to every runner. Each runner runs once, in a fresh subprocess (:mod:`bench.worker`), which
reports its wall time and its peak RSS; the placement it returns is evaluated here with
opendrs's code (:mod:`bench.metrics`), whoever produced it. One table per case goes to stdout,
and with ``--markdown`` into a Markdown file; ratios compare each row with the peers measured in
the same run (see ``docs/performance.md``).

Default runners: every registered opendrs strategy and both peers, each up to the largest size it
is fast enough for (:data:`DEFAULT_MAX_SIZE`); a runner named in ``--strategies`` or ``--peers``
runs at every size asked for. On the production-like generators the default strategy and the
peers alone run unless ``--strategies`` names others, and their cases make one table
(:mod:`bench.realistic_report`): per cluster and runner the moves against the memory-only lower
bound and, up to L, against the fewest moves the exact search (:mod:`bench.yardstick`) finds for
the default strategy's memory spread, and for its memory and vCPU spreads, the cost, the time and
the peak memory.

Then the **method cases**: for every size, rules variant, ``--methods`` entry (default ``memory``)
and ``--method-seeds`` seed (default 1, 2, 3), the generated cluster is written as a proxlb-solver
scenario with that ``balancing.method`` and imported as ``opendrs plan scenario.yaml`` imports it
(:mod:`bench.scenario`); the default strategy (``--method-strategies``) runs on it, and its result
is measured against the lower bound for the method's resource alone (the target: at L, memory
spread ≤ 1 pp with migrations ≤ 1.25× the memory-only bound).

Then **reading** (``--no-reading`` skips it): the XXL snapshot as YAML and as JSON and a
100,000-VM proxlb-solver scenario, each read in fresh interpreters as ``opendrs plan`` reads it,
with the time and the peak RSS (:mod:`bench.reading`).

Last, **end to end** (``--no-endtoend`` skips it): for every generator and ``--endtoend-sizes``
size (L, XL, XXL by default) the cluster written as a YAML snapshot and as a proxlb-solver
scenario, and on each file, each in a fresh process from start to exit, ``opendrs plan FILE
--format json``, proxlb-solver's own CLI (scenarios, up to L) and ProxLB's greedy steps on the
file (up to XL), with wall and CPU time, peak RSS and the placement evaluated, against the #15
targets at 100,000 guests (:mod:`bench.endtoend`); the earlier generators only. On the
production-like ones, **growth** (``--no-growth`` skips it): ``opendrs plan SNAPSHOT`` alone, with
and without rules, at ``--growth-sizes`` (S to XXL), and the exponent of its time in the guests.

And **start-up** (``--no-startup`` skips it): ``opendrs plan`` on the three-node
``examples/small.yaml`` and on the L snapshot, each ``--startup-repeats`` times in a fresh
process, beside the interpreter's own start, with the median wall and CPU time and the peak RSS
(:mod:`bench.startup`).

And **hot months** (``--no-hot-months`` skips it), issue #30's item 5: on the built-in month and the
generated months of ``--hot-seeds`` (1, 89 and 97 by default), opendrs's default policy and every
emulated peer, one simulation at a time, with each policy's hot node-minutes and ping-pongs and
whether opendrs's are the fewest with none (:mod:`bench.hotspots`); with ``--hot-store`` each run is
kept as it ends and reused by the next run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.clusters import EARLIER, GENERATORS, REALISTIC, generated, generator_names
from bench.endtoend import DEFAULT_SIZES as ENDTOEND_SIZES
from bench.endtoend import Result as EndToEnd
from bench.endtoend import run as run_endtoend
from bench.endtoend_report import growth_section
from bench.endtoend_report import section as endtoend_section
from bench.generate import SIZES
from bench.hotspots import SEEDS as HOT_SEEDS
from bench.hotspots import HotMonth
from bench.hotspots import run as run_hot
from bench.hotspots import section as hot_section
from bench.incus import section as incus_section
from bench.metrics import Evaluator
from bench.pareto import checked_inputs
from bench.pareto import scenarios as pareto_scenarios
from bench.peers import PEERS
from bench.process import checkout_env, measure
from bench.reading import Reading
from bench.reading import run as run_reading
from bench.reading import section as reading_section
from bench.realistic_report import RealisticCase
from bench.realistic_report import measure as measure_realistic
from bench.realistic_report import section as realistic_section
from bench.report import Case, MethodCase, Row, method_section, section
from bench.startup import Startup
from bench.startup import run as run_startup
from bench.startup import section as startup_section
from bench.worker import RunnerKind, Spec

ROOT = Path(__file__).resolve().parent.parent
SIZE_ORDER: tuple[str, ...] = tuple(SIZES)
#: Sizes of the growth runs on the production-like generators (the exponent's fit).
GROWTH_SIZES: tuple[str, ...] = tuple(SIZES)
#: Balancing methods the method cases run (those opendrs's strategies balance exactly).
METHODS: tuple[str, ...] = ("memory", "cpu")

#: Largest size each runner runs at by default, with why; strategies not listed run at every size.
DEFAULT_MAX_SIZE: dict[str, tuple[str, str]] = {
    "proxlb-solver": ("L", "its model has a boolean per guest and node (2.6 M at XL)"),
    "proxlb-greedy": ("XL", "it is O(guests × nodes) in pydantic objects (10⁸ steps at XXL)"),
    "pve-bruteforce": ("L", "it re-scores every guest × node per move (~130 s at L, hours at XL)"),
    "pve-topsis": ("L", "it re-scores every guest × node per move (~75 s at L, hours at XL)"),
    "optimal": ("M", "an exact model: beyond M it only runs into its time limit"),
}
#: Options the benchmark gives strategies, beyond a time limit (``--option`` overrides).
#: Proxmox's defaults (threshold 0.3, margin 10 %, 10 moves per trigger) stop after a few moves,
#: or before the first; the benchmark runs its best-move rule until no move improves, over every
#: guest (the generated clusters carry no HA resources, which alone Proxmox would move).
_CONVERGE = {"threshold": 0.0, "margin": 0.0, "max_moves": 1_000_000, "scope": "all"}
STRATEGY_OPTIONS: dict[str, dict[str, Any]] = {
    "pve-bruteforce": dict(_CONVERGE),
    "pve-topsis": dict(_CONVERGE),
}
#: Keyword names under which a strategy may take a time limit in seconds.
TIME_LIMIT_PARAMS: tuple[str, ...] = ("time_limit", "time_limit_s")
#: Time limit (s) per size for proxlb-solver and time-limited strategies (reference baseline).
TIME_LIMITS: dict[str, float] = {"S": 5.0, "M": 60.0, "L": 180.0}
#: Time limit for sizes the reference has none for.
FALLBACK_TIME_LIMIT = 180.0


@dataclass(frozen=True)
class Runner:
    """A strategy or peer to run, with its options; ``explicit`` when named on the command line
    (then it runs at every size, skip rules notwithstanding)."""

    kind: RunnerKind
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    explicit: bool = False

    @property
    def time_limit(self) -> float | None:
        for key in ("time_limit_s", *TIME_LIMIT_PARAMS):
            if key in self.options:
                return float(self.options[key])
        return None


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_option(text: str) -> tuple[str, str, Any]:
    """``NAME.KEY=VALUE`` → (name, key, value); the value is JSON when it parses as JSON."""
    target, sep, raw = text.partition("=")
    name, dot, key = target.rpartition(".")
    if not sep or not dot or not name or not key:
        raise argparse.ArgumentTypeError(f"expected NAME.KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return name, key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark opendrs's strategies against ProxLB and proxlb-solver.",
    )
    parser.add_argument(
        "--sizes",
        default="S,M,L",
        help=f"comma-separated sizes ({', '.join(SIZES)}); 'none' for no cases (the other "
        "sections alone)",
    )
    parser.add_argument(
        "--strategies",
        default=None,
        help="comma-separated opendrs strategies (default: every registered one, "
        "each up to the largest size it is fast enough for); 'none' for peers only",
    )
    parser.add_argument(
        "--peers",
        default=None,
        help=f"comma-separated peers ({', '.join(PEERS)}; default both); 'none' for none",
    )
    parser.add_argument("--rules", choices=("both", "with", "without"), default="both")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="cap on the per-size time limits (S 5, M 60, L 180 s) of proxlb-solver "
        "and of strategies that take one",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--generator",
        default="all",
        metavar="NAME,…",
        help=f"cluster generators, a comma list of {', '.join(GENERATORS)}, or both (the earlier "
        "two: basic, skewed) or all (default); the production-like ones run the default "
        "strategy and the peers unless --strategies names others, the method cases and the "
        "reading use the basic one",
    )
    parser.add_argument(
        "--yardstick",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on the production-like clusters up to L, the exact search for the fewest moves "
        "that reach the default strategy's memory spread, then its memory and vCPU spreads "
        "(bench/yardstick.py; default on)",
    )
    parser.add_argument(
        "--yardstick-time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="cap on the exact search's time limits (S 10, M 30, L 60 s)",
    )
    parser.add_argument(
        "--solver-balanciness", type=int, default=4, help="proxlb-solver level 1–5 (default 4)"
    )
    parser.add_argument(
        "--greedy-mode",
        choices=("assigned", "used"),
        default="assigned",
        help="ProxLB balancing mode (default: assigned)",
    )
    parser.add_argument(
        "--greedy-balanciness", type=int, default=5, help="ProxLB balanciness in pp (default 5)"
    )
    parser.add_argument(
        "--option",
        action="append",
        type=_parse_option,
        default=[],
        metavar="NAME.KEY=VALUE",
        help="extra option for a strategy or peer (JSON value), repeatable",
    )
    parser.add_argument(
        "--case-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="kill a case after this long (time-limited runs get 2× their limit + 300 s)",
    )
    parser.add_argument(
        "--methods",
        default="memory",
        help=f"proxlb-solver balancing methods to run as scenarios ({', '.join(METHODS)}; "
        "default memory); 'none' for none",
    )
    parser.add_argument(
        "--method-seeds",
        default="1,2,3",
        metavar="N,N,…",
        help="generator seeds of the method cases (default 1,2,3)",
    )
    parser.add_argument(
        "--method-strategies",
        default=None,
        help="opendrs strategies run on the method cases (default: the default strategy)",
    )
    parser.add_argument(
        "--incus",
        default="50x5000",
        metavar="MEMBERSxINSTANCES",
        help="the Incus backend's observation at this scale (bench/incus.py); 'none' to skip",
    )
    _add_repeated(
        parser,
        "reading",
        "measure reading the XXL snapshot (YAML, JSON) and a 100,000-VM proxlb-solver "
        "scenario (bench/reading.py; default on)",
        3,
        "readings per input (3)",
    )
    parser.add_argument(
        "--endtoend",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure `opendrs plan FILE` end to end beside proxlb-solver's CLI and ProxLB, "
        "each a fresh process (bench/endtoend.py; default on)",
    )
    parser.add_argument(
        "--endtoend-sizes",
        default=",".join(ENDTOEND_SIZES),
        help=f"sizes of the end-to-end runs (default {','.join(ENDTOEND_SIZES)}; the peers run "
        "up to the largest they finish: proxlb-solver L, ProxLB XL)",
    )
    parser.add_argument(
        "--growth",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on the production-like generators, `opendrs plan SNAPSHOT` end to end with and "
        "without rules at --growth-sizes, and the exponent of its wall time in the guests "
        "(default on)",
    )
    parser.add_argument(
        "--growth-sizes",
        default=",".join(GROWTH_SIZES),
        help=f"sizes of the growth runs (default {','.join(GROWTH_SIZES)})",
    )
    parser.add_argument(
        "--endtoend-timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="kill an end-to-end run after this long (900)",
    )
    _add_repeated(
        parser,
        "startup",
        "measure `opendrs plan` on a three-node snapshot and on L, each run a fresh process "
        "(bench/startup.py; default on)",
        10,
        "runs per command (10)",
    )
    _add_hot_months(parser)
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    return parser


def _add_hot_months(parser: argparse.ArgumentParser) -> None:
    """``--hot-months`` / ``--no-hot-months``, ``--hot-seeds`` and ``--hot-store``."""
    parser.add_argument(
        "--hot-months",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="issue #30's item 5: opendrs's default policy and every emulated peer over the "
        "built-in month and generated months, hot node-minutes and ping-pongs "
        "(bench/hotspots.py; default on)",
    )
    parser.add_argument(
        "--hot-seeds",
        default=",".join(map(str, HOT_SEEDS)),
        metavar="N,N,…",
        help="seeds of the generated months beside the built-in one (default "
        f"{','.join(map(str, HOT_SEEDS))}; more: 1,89,97,2,…; 'none': the built-in month alone)",
    )
    parser.add_argument(
        "--hot-store",
        type=Path,
        default=None,
        metavar="FILE",
        help="write each hot-months run's report here as it ends, and reuse the runs already "
        "there (delete it after changing opendrs)",
    )


def _add_repeated(
    parser: argparse.ArgumentParser, name: str, about: str, repeats: int, repeats_about: str
) -> None:
    """``--NAME`` / ``--no-NAME`` (on by default) and ``--NAME-repeats N``."""
    on_off = argparse.BooleanOptionalAction
    parser.add_argument(f"--{name}", action=on_off, default=True, help=about)
    parser.add_argument(
        f"--{name}-repeats", type=int, default=repeats, metavar="N", help=repeats_about
    )


def time_limit(size: str, cap: float | None) -> float:
    """The time limit for ``size``: the reference's, capped by ``--time-limit``."""
    limit = TIME_LIMITS.get(size, FALLBACK_TIME_LIMIT)
    return limit if cap is None else min(limit, cap)


def too_large(name: str, size: str) -> str | None:
    """Why ``name`` is not run at ``size`` by default, or None."""
    if name not in DEFAULT_MAX_SIZE:
        return None
    largest, why = DEFAULT_MAX_SIZE[name]
    if SIZE_ORDER.index(size) <= SIZE_ORDER.index(largest):
        return None
    return f"{name} (runs up to {largest} by default: {why}; name it to run it)"


def peer_missing(name: str) -> str | None:
    """Why peer ``name`` cannot run here (its package is not installed), or None."""
    module = importlib.import_module(PEERS[name])
    package = str(module.ENTRY_MODULE).split(".", 1)[0]
    if importlib.util.find_spec(package) is None:
        return f"{name} (not installed: `make bench` installs the bench extra)"
    return None


def strategy_options(name: str, size: str, cap: float | None) -> dict[str, Any]:
    """Options for strategy ``name`` at ``size``: benchmark defaults plus a time limit."""
    from opendrs.engine.strategies import get_strategy

    options = dict(STRATEGY_OPTIONS.get(name, {}))
    names = get_strategy(name).options.names()
    for key in TIME_LIMIT_PARAMS:
        if key in names:
            options[key] = time_limit(size, cap)
            break
    return options


def peer_options(name: str, size: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "proxlb-solver":
        return {
            "time_limit_s": time_limit(size, args.time_limit),
            "balanciness": args.solver_balanciness,
        }
    return {"mode": args.greedy_mode, "balanciness": args.greedy_balanciness}


def run_worker(spec: Spec, timeout: float) -> dict[str, Any]:
    """Run one case in a fresh interpreter; its result, or ``{"error": …, "rss_peak": …}``.

    While the worker runs its peak RSS is sampled, so a case killed at its timeout (or one that
    fails) still reports the peak it reached.
    """
    with tempfile.TemporaryDirectory(prefix="opendrs-bench-") as tmp:
        out = Path(tmp) / "result.json"
        err = Path(tmp) / "stderr.txt"
        cmd = [sys.executable, "-m", "bench.worker", spec.to_json(), str(out)]
        with open(err, "w", encoding="utf-8") as err_file:
            done = measure(cmd, timeout=timeout, cwd=ROOT, env=checkout_env(), stderr=err_file)
        if done.killed_after is not None:
            return {"error": f"timeout after {timeout:g} s", "rss_peak": done.rss_peak}
        if done.returncode != 0 or not out.exists():
            lines = [ln for ln in err.read_text(encoding="utf-8").splitlines() if ln.strip()]
            reason = lines[-1] if lines else "no output"
            return {"error": f"exit {done.returncode}: {reason}", "rss_peak": done.rss_peak}
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        return result


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_case(
    size: str, rules: bool, runners: Sequence[Runner], args: argparse.Namespace, generator: str
) -> Case:
    """Every runner on one cluster of ``generator``, each in its own worker process."""
    cluster = generated(generator, size, seed=args.seed, rules=rules)
    evaluator = Evaluator(cluster)
    case = Case(
        size=size,
        nodes=len(cluster.nodes),
        guests=len(cluster.guests),
        rules=rules,
        before=evaluator.before,
        lb_spread=evaluator.lb_spread,
        bounds_available=evaluator.bounds_available,
        generator=generator,
    )
    for runner in runners:
        reason = None if runner.explicit else too_large(runner.name, size)
        if runner.kind == "peer":
            reason = peer_missing(runner.name) or reason
        if reason:
            case.skipped.append(reason)
            continue
        spec = Spec(
            size, args.seed, rules, runner.kind, runner.name, runner.options, generator=generator
        )
        limit = runner.time_limit
        timeout = args.case_timeout if limit is None else max(args.case_timeout, 2 * limit + 300)
        label = f"[{case.title}] {runner.name}" + (f" (limit {limit:g} s)" if limit else "")
        _progress(f"{label} …")
        started = time.perf_counter()
        row = _row(runner, run_worker(spec, timeout), evaluator)
        if row.seconds is None:
            _progress(f"{label}: {row.error}")
        else:
            _progress(f"{label}: {row.seconds:.2f} s ({time.perf_counter() - started:.1f} s)")
        case.rows.append(row)
    return case


def _row(runner: Runner, result: dict[str, Any], evaluator: Evaluator) -> Row:
    """One runner's row from its worker's ``result``, its placement evaluated."""
    row = Row(runner=runner.name, kind=runner.kind)
    if "error" in result:
        row.error = str(result["error"])
        row.rss_peak = result.get("rss_peak")
        return row
    row.seconds = float(result["seconds"])
    row.rss_peak = int(result["rss_peak"])
    row.rss_setup = int(result["rss_setup"])
    row.info = result.get("info", {})
    row.notes = tuple(result.get("notes", ()))
    row.placement = dict(result["placement"])
    try:
        row.evaluation = evaluator.evaluate(result["placement"])
    except ValueError as exc:
        row.error = f"bad placement: {exc}"
    return row


def run_method_case(
    size: str, rules: bool, method: str, seed: int, runners: Sequence[Runner], timeout: float
) -> MethodCase:
    """The default strategy (or ``runners``) on the generated cluster imported as a ``method``
    scenario, each in its own worker process."""
    from bench.scenario import scenario_cluster

    cluster = scenario_cluster(size, seed=seed, rules=rules, method=method)
    evaluator = Evaluator(cluster)
    case = MethodCase(
        size=size,
        nodes=len(cluster.nodes),
        guests=len(cluster.guests),
        rules=rules,
        method=method,
        seed=seed,
        before=evaluator.before,
    )
    for runner in runners:
        spec = Spec(size, seed, rules, runner.kind, runner.name, runner.options, method=method)
        rules_text = "with rules" if rules else "without rules"
        label = f"[{size} {rules_text}, method {method}, seed {seed}] {runner.name}"
        _progress(f"{label} …")
        row = _row(runner, run_worker(spec, timeout), evaluator)
        _progress(f"{label}: {row.error or f'{row.seconds:.2f} s'}")
        case.rows.append(row)
    return case


def _realistic(case: Case, args: argparse.Namespace, reference: str) -> RealisticCase:
    """A production-like case's bounds and, with ``--yardstick``, its exact search."""
    cluster = generated(case.generator, case.size, seed=args.seed, rules=case.rules)
    if args.yardstick:
        _progress(f"[{case.title}] exact search …")
    measured = measure_realistic(
        case, cluster, args.seed, reference, args.yardstick_time_limit, search=args.yardstick
    )
    for what, ys in (("memory", measured.yardstick), ("memory and vCPUs", measured.both)):
        if ys is not None:
            _progress(f"[{case.title}] exact search, {what}: {ys.summary} ({ys.seconds:.1f} s)")
    return measured


def machine() -> str:
    """One line on the machine and the versions in this run."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = []
    for dist in ("numpy", "ortools", "proxlb", "proxlb-solver"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} not installed")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
        + ", ".join(versions)
        + (f", opendrs at {commit} (plus uncommitted work)" if commit else "")
    )


def _limits_line(cases: Sequence[Case], args: argparse.Namespace) -> str:
    """The peers' settings in this run, with the solver's time limits as actually used."""
    limits = {
        case.size: row.info.get("time_limit_s")
        for case in cases
        for row in case.rows
        if row.runner == "proxlb-solver" and row.info.get("time_limit_s") is not None
    }
    solver = (
        "proxlb-solver time limits: "
        + ", ".join(f"{size} {limit:g} s" for size, limit in limits.items())
        + f"; level {args.solver_balanciness}."
        if limits
        else "proxlb-solver: not run."
    )
    return (
        f"{solver} ProxLB greedy: mode {args.greedy_mode}, "
        f"balanciness {args.greedy_balanciness} pp."
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes = [] if args.sizes == "none" else _sizes(parser, "--sizes", args.sizes)

    from opendrs.engine.strategies import DEFAULT_STRATEGY, REGISTRY

    def chosen(value: str | None, known: list[str], what: str) -> tuple[list[str], bool]:
        """(names, named explicitly): all known by default, none for 'none'."""
        if value is None:
            return known, False
        names = [] if value == "none" else _split(value)
        bad = [n for n in names if n not in known]
        if bad:
            parser.error(f"unknown {what} {bad[0]!r} (known: {', '.join(known)})")
        return names, True

    strategies, strategies_explicit = chosen(args.strategies, sorted(REGISTRY), "strategy")
    peers, peers_explicit = chosen(args.peers, list(PEERS), "peer")
    extra: dict[str, dict[str, Any]] = {}
    for name, key, value in args.option:
        if name not in REGISTRY and name not in PEERS:
            parser.error(f"--option for unknown strategy or peer {name!r}")
        extra.setdefault(name, {})[key] = value
    variants = {"both": (False, True), "with": (True,), "without": (False,)}[args.rules]
    methods = [] if args.methods == "none" else _split(args.methods)
    bad_method = [m for m in methods if m not in METHODS]
    if bad_method:
        parser.error(f"unknown method {bad_method[0]!r} (known: {', '.join(METHODS)})")
    try:
        method_seeds = [int(s) for s in _split(args.method_seeds)]
    except ValueError:
        parser.error(f"--method-seeds: expected whole numbers, got {args.method_seeds!r}")
    method_names, _explicit = chosen(
        args.method_strategies or DEFAULT_STRATEGY, sorted(REGISTRY), "strategy"
    )
    if not method_names or not method_seeds:
        methods = []
    if args.reading_repeats < 1:
        parser.error("--reading-repeats: expected at least 1")
    if args.startup_repeats < 1:
        parser.error("--startup-repeats: expected at least 1")
    endtoend_sizes = _sizes(parser, "--endtoend-sizes", args.endtoend_sizes)
    growth_sizes = _sizes(parser, "--growth-sizes", args.growth_sizes)
    hot_seeds, hot_stored = _hot_inputs(parser, args)

    try:
        generators = generator_names(args.generator)
    except ValueError as exc:
        parser.error(f"--generator: {exc}")
    started = datetime.now(UTC)
    cases: list[Case] = []
    sections: list[str] = []
    realistic: list[RealisticCase] = []
    for generator, size in ((g, s) for g in generators for s in sizes):
        named = strategies if strategies_explicit or generator in EARLIER else [DEFAULT_STRATEGY]
        runners: list[Runner] = []
        for name in peers:
            options = {**peer_options(name, size, args), **extra.get(name, {})}
            runners.append(Runner("peer", name, options, peers_explicit))
        for name in named:
            options = {**strategy_options(name, size, args.time_limit), **extra.get(name, {})}
            runners.append(Runner("strategy", name, options, strategies_explicit))
        for rules in variants:
            case = run_case(size, rules, runners, args, generator)
            cases.append(case)
            if generator in REALISTIC:
                realistic.append(_realistic(case, args, DEFAULT_STRATEGY))
                continue
            sections.append(section(case))
            print(sections[-1], flush=True)
    if realistic:
        sections.append(realistic_section(realistic))
        print(sections[-1], flush=True)

    method_cases: list[MethodCase] = []
    for method in methods:
        by_method: list[MethodCase] = []
        for size in sizes:
            runners = [
                Runner(
                    "strategy",
                    name,
                    {**strategy_options(name, size, args.time_limit), **extra.get(name, {})},
                    True,
                )
                for name in method_names
            ]
            for rules in variants:
                for seed in method_seeds:
                    by_method.append(
                        run_method_case(size, rules, method, seed, runners, args.case_timeout)
                    )
        method_cases += by_method
        text = method_section(by_method)
        if text:
            sections.append(text)
            print(text, flush=True)

    if args.incus != "none":  # bench/incus.py: one observation of 50 members, 5,000 instances
        sections.append(incus_section(*_scale(parser, args.incus))[0])
        print(sections[-1], flush=True)

    readings: list[Reading] = []
    if args.reading:
        readings = run_reading(args.seed, args.reading_repeats)
        text = reading_section(readings)
        sections.append(text)
        print(text, flush=True)

    endtoend: list[EndToEnd] = []
    earlier = [g for g in generators if g in EARLIER]
    if args.endtoend and endtoend_sizes and earlier:
        endtoend = run_endtoend(
            earlier, endtoend_sizes, seed=args.seed, peers=peers, timeout=args.endtoend_timeout
        )
        sections.append(endtoend_section(endtoend))
        print(sections[-1], flush=True)
    growth: list[EndToEnd] = []
    production = [g for g in generators if g in REALISTIC]
    if args.growth and growth_sizes and production:
        growth = run_endtoend(
            production,
            growth_sizes,
            seed=args.seed,
            forms=("snapshot",),
            peers=(),
            timeout=args.endtoend_timeout,
            rules=(False, True),
        )
        sections.append(growth_section(growth))
        print(sections[-1], flush=True)

    startup: list[Startup] = []
    if args.startup:
        startup = run_startup(args.startup_repeats, args.seed)
        sections.append(startup_section(startup))
        print(sections[-1], flush=True)

    hot: list[HotMonth] = []
    if args.hot_months:
        hot = run_hot(pareto_scenarios(hot_seeds, True), hot_stored, args.hot_store)
        sections.append(hot_section(hot))
        print(sections[-1], flush=True)

    command = "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    seeds_text = f", method cases seeds {', '.join(map(str, method_seeds))}" if method_cases else ""
    header = [
        "## Results",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC: `{command.strip()}`, seed {args.seed}, "
        f"generators {', '.join(generators)}{seeds_text}.",
        f"Machine: {machine()}.",
        _limits_line(cases, args),
        "",
    ]
    if cases and not cases[0].bounds_available:
        header += [
            "Lower bounds: `opendrs.engine.bounds` is not available in this checkout, "
            "so the columns against them are left out.",
            "",
        ]
    if args.markdown:
        args.markdown.write_text("\n".join(header + sections), encoding="utf-8")
        _progress(f"wrote {args.markdown}")
    if args.json:
        payload = [
            {
                **{k: v for k, v in asdict(case).items() if k != "rows"},
                "rows": [asdict(row) for row in case.rows],
            }
            for case in [*cases, *method_cases]
        ]
        payload += [{"realistic": _realistic_json(item)} for item in realistic]
        payload += [{"reading": asdict(reading)} for reading in readings]
        payload += [{"endtoend": asdict(result)} for result in [*endtoend, *growth]]
        payload += [{"startup": asdict(result)} for result in startup]
        payload += [{"hot_months": month.as_json()} for month in hot]
        args.json.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
        _progress(f"wrote {args.json}")
    return 0


def _sizes(parser: argparse.ArgumentParser, option: str, text: str) -> list[str]:
    """A comma list of sizes (each in :data:`SIZES`)."""
    sizes = _split(text)
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"{option}: unknown size {unknown[0]!r} (known: {', '.join(SIZES)})")
    return sizes


def _hot_inputs(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[int], dict[str, dict[str, Any]]]:
    """``--hot-seeds`` as whole numbers and the runs ``--hot-store`` holds, checked before any
    run (none with ``--no-hot-months``)."""
    if not args.hot_months:
        return [], {}
    return checked_inputs(parser, ("--hot-seeds", args.hot_seeds), ("--hot-store", args.hot_store))


def _realistic_json(item: RealisticCase) -> dict[str, Any]:
    """A production-like case's bounds and search as JSON (its rows are in the cases')."""
    search = None if item.yardstick is None else asdict(item.yardstick)
    both = None if item.both is None else asdict(item.both)
    return {
        "generator": item.case.generator,
        "size": item.case.size,
        "rules": item.case.rules,
        "seed": item.seed,
        "memory_bound": item.memory_bound,
        "reference": item.reference,
        "yardstick": search,
        "yardstick_memory_and_vcpus": both,
        "skipped": item.skipped,
    }


def _scale(parser: argparse.ArgumentParser, text: str) -> tuple[int, int]:
    """``--incus MEMBERSxINSTANCES`` as two whole numbers."""
    members, _, instances = text.partition("x")
    if not (members.isdigit() and instances.isdigit() and int(members) > 0):
        parser.error(f"--incus: expected MEMBERSxINSTANCES (e.g. 50x5000) or none, got {text!r}")
    return int(members), int(instances)


if __name__ == "__main__":
    raise SystemExit(main())
