"""The ``opendrs`` command line."""

from __future__ import annotations

import argparse
import io
import json
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from opendrs import __version__
from opendrs.cli.commands import add_demo_parser, add_run_parser, add_simulate_parser, parse_number
from opendrs.cli.history_command import add_history_parser
from opendrs.cli.maintenance_command import add_maintenance_parser
from opendrs.cli.plan_report import plan_document
from opendrs.cli.planning import PlanResult, make_plan
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, UsageError
from opendrs.cli.report_command import report_of_history, write_report
from opendrs.cli.snapshot_command import add_snapshot_parser
from opendrs.cli.status_command import add_status_parser
from opendrs.compat.proxlb import (
    Scenario,
    check_paths,
    is_proxlb_scenario,
    junit_xml,
    scenario_files,
    scenario_from_dict,
)
from opendrs.controller.history import HistoryError
from opendrs.controller.views import stuck_rows
from opendrs.engine.breaks import rule_breaks
from opendrs.engine.constraints import Constraints, movability, platform_balancer
from opendrs.engine.placement import Evacuation, evacuate, place_guest, place_new
from opendrs.engine.planner import Plan
from opendrs.engine.policy import (
    repair,
    strategy_problem,
    stuck_now,
    warn_stuck,
)
from opendrs.engine.strategies import DEFAULT_STRATEGY, REGISTRY, get_strategy
from opendrs.engine.strategies.base import (
    cluster_imbalance,
    imbalance_by_arch,
    typed_option,
)
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import GUEST_KINDS, Cluster, Guest, Move
from opendrs.model.document import one_line
from opendrs.model.snapshot import (
    MAX_BYTES,
    MAX_CORES,
    SnapshotError,
    from_dict,
    load_demo,
    parse,
    read_file,
)
from opendrs.model.units import UnitError, parse_bytes
from opendrs.report.data import json_text
from opendrs.report.render import FORMATS as REPORT_FORMATS
from opendrs.report.text import (
    Report,
    show_bounds,
    show_cluster,
    show_evacuation,
    show_placement,
    show_plan,
    show_proposal,
    show_stuck,
)


def _dump_json(data: Any) -> None:
    sys.stdout.write(json_text(data))


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _load_any(path: str) -> tuple[Cluster, Scenario | None]:
    """A snapshot, or a proxlb-solver scenario (detected from its keys), or the demo cluster."""
    if path == "demo":
        return load_demo(), None
    filename, data = read_file(path)
    document = parse(data, filename=filename)
    del data  # the bytes are not kept while the cluster is built
    if is_proxlb_scenario(document):
        scenario = scenario_from_dict(document, filename=filename)
        return scenario.cluster, scenario
    return from_dict(document, filename=filename), None


def _load(path: str) -> Cluster:
    return _load_any(path)[0]


# --------------------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    cluster = _load(args.snapshot)
    cons = Constraints.build(cluster)
    # A rule ignored in favour of one of an earlier origin is a warning; a dropped one an error.
    problems = [str(p) for p in cons.problems if not p.ignored]
    warnings = [str(p) for p in cons.problems if p.ignored]
    if args.format == "json":
        _dump_json(
            {
                "file": args.snapshot,
                "valid": not problems,
                "nodes": len(cluster.nodes),
                "guests": len(cluster.guests),
                "problems": problems,
                "warnings": warnings,
            }
        )
    else:
        for warning in warnings:
            print(f"{args.snapshot}: rules: warning: {warning}", file=sys.stderr)
        for problem in problems:
            print(f"{args.snapshot}: rules: {problem}", file=sys.stderr)
        if not problems:
            n_rules = len(cluster.rules.node_affinity) + len(cluster.rules.guest_affinity)
            ignored = f"; {len(warnings)} ignored" if warnings else ""
            print(
                f"{args.snapshot}: valid ({len(cluster.nodes)} nodes, "
                f"{len(cluster.guests)} guests, {n_rules} rules{ignored})"
            )
    return EXIT_USAGE if problems else EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    cluster = _load(args.snapshot)
    stuck = stuck_now(cluster)
    if args.format == "json":
        loads = LoadModel.build(cluster)
        fractions = loads.fractions()
        _dump_json(
            {
                "name": cluster.name,
                "mode": cluster.settings.mode,
                "balance_source": cluster.settings.balance_source,
                "nodes": [
                    {
                        "name": n.name,
                        "online": n.online,
                        "maintenance": n.maintenance,
                        "load": {"cpu": float(fractions[i, 0]), "memory": float(fractions[i, 1])},
                        "guests": [g.id for g in cluster.guests_on(n.name)],
                    }
                    for i, n in enumerate(cluster.nodes)
                ],
                "imbalance": cluster_imbalance(cluster).as_dict(),
                "imbalance_by_arch": {
                    arch: imbalance.as_dict()
                    for arch, imbalance in imbalance_by_arch(cluster).items()
                },
                "problems": [str(p) for p in Constraints.build(cluster).problems],
                "rule_breaks": [b.as_dict() for b in rule_breaks(cluster)],
                "platform_balancer": platform_balancer(cluster),
                "stuck": stuck_rows(cluster, stuck),
            }
        )
        return EXIT_OK
    report = Report(_console())
    show_cluster(report, cluster, guests=not args.no_guests)
    show_stuck(report, stuck)
    return EXIT_OK


def _parse_new(spec: str) -> Guest:
    """``cpu=4,memory=8GiB[,kind=ct][,arch=aarch64][,name=web9][,id=900]`` -> Guest."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise UsageError(f"--new: {part!r} is not key=value (example: cpu=4,memory=8GiB)")
        key, value = (s.strip() for s in part.split("=", 1))
        fields[key] = value
    allowed = {"cpu", "memory", "kind", "arch", "name", "id", "cpu_used", "memory_used", "priority"}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise UsageError(f"--new: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})")
    if "memory" not in fields:
        raise UsageError("--new: memory is required (example: cpu=4,memory=8GiB)")

    def number(key: str, default: str) -> float:
        text = fields.get(key, default)
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"--new: {key}: {text!r} is not a number") from None
        if not 0 <= value < float("inf"):
            raise UsageError(f"--new: {key}: must be a finite number ≥ 0")
        return value

    def size(key: str) -> int | None:
        if key not in fields:
            return None
        try:
            value = parse_bytes(fields[key])
        except UnitError as exc:
            raise UsageError(f"--new: {key}: {exc}") from None
        if value > MAX_BYTES:
            raise UsageError(f"--new: {key}: size too large (at most 8 PiB)")
        return value

    cpu = number("cpu", "1")
    if not 0 < cpu <= 100_000:
        raise UsageError("--new: cpu: must be a positive number of vCPUs, at most 100000")
    memory = size("memory") or 0
    if memory <= 0:
        raise UsageError("--new: memory: must be greater than 0")
    cpu_used = number("cpu_used", "0") if "cpu_used" in fields else None
    if cpu_used is not None and cpu_used > MAX_CORES:
        raise UsageError(f"--new: cpu_used: must be at most {MAX_CORES} cores")
    memory_used = size("memory_used")
    priority = fields.get("priority", "2")
    if priority not in ("1", "2", "3"):
        raise UsageError("--new: priority: must be 1, 2 or 3")
    kind = fields.get("kind", "vm")
    if kind not in GUEST_KINDS:
        raise UsageError(f"--new: kind must be one of {', '.join(GUEST_KINDS)}")
    return Guest(
        id=fields.get("id", "new"),
        node="",
        kind=kind,  # type: ignore[arg-type]
        name=fields.get("name", ""),
        cpu=cpu,
        memory=memory,
        cpu_used=cpu_used,
        memory_used=memory_used,
        arch=fields.get("arch"),
        priority=int(priority),
    )


def cmd_place(args: argparse.Namespace) -> int:
    cluster = _load(args.snapshot)
    report = Report(_console())
    if args.evacuate is not None:
        if args.evacuate not in cluster.node_index:
            raise UsageError(f"--evacuate: no node {args.evacuate!r} in {args.snapshot}")
        result = evacuate(cluster, args.evacuate, "recover" if args.failed else "evacuate")
        plan = None
        if result.stuck and not args.failed:
            result, plan = _evacuation_repair(cluster, result)
        if args.format == "json":
            data = result.as_dict()
            if plan is not None:
                data["plan"] = plan.as_dict()
            _dump_json(data)
        else:
            show_evacuation(report, result)
            if plan is not None:
                show_plan(report, plan)
        return EXIT_PROBLEM if result.stuck else EXIT_OK
    if args.guest is not None:
        if args.guest not in cluster.guest_index:
            raise UsageError(f"--guest: no guest {args.guest!r} in {args.snapshot}")
        placement = place_guest(cluster, args.guest, "recover" if args.failed else "balance")
    else:
        if args.failed:
            raise UsageError("--failed goes with --guest or --evacuate, not --new")
        placement = place_new(cluster, _parse_new(args.new))
    if args.format == "json":
        _dump_json(placement.as_dict())
    else:
        show_placement(report, placement)
    return EXIT_OK if placement.ranking else EXIT_PROBLEM


def _evacuation_repair(cluster: Cluster, greedy: Evacuation) -> tuple[Evacuation, Plan | None]:
    """When placing the guests one by one leaves some behind: the daemon's repair of the
    cluster with the node in maintenance — other guests moved to make room (the exact model),
    ordered in steps with parking moves. Kept when it leaves fewer guests on the node."""
    node = greedy.node
    nodes = tuple(replace(n, maintenance=True) if n.name == node else n for n in cluster.nodes)
    drained = replace(cluster, nodes=nodes)
    fixed = repair(drained)
    on_node = [g for g in drained.guests if g.node == node]
    stuck = dict(fixed.stuck)
    warn_stuck(tuple((g.id, stuck[g.id]) for g in on_node if g.id in stuck))
    if fixed.plan is None:
        return greedy, None
    final = {m.guest: m.target for m in fixed.plan.moves}
    left = [g for g in on_node if final.get(g.id, node) == node]
    if len(left) >= len(greedy.stuck):
        return greedy, None
    reasons = tuple(
        (g.id, stuck.get(g.id) or str(movability(g, drained, "balance") or "the repair leaves it"))
        for g in left
    )
    moves = tuple(Move(m.guest, m.source, m.target) for m in fixed.plan.moves)
    return Evacuation(node, moves, reasons), fixed.plan


def _planned(args: argparse.Namespace) -> PlanResult:
    """The plan of ``opendrs plan`` (and ``opendrs report SNAPSHOT``) for the snapshot and the
    strategy options on the command line."""
    cluster, scenario = _load_any(args.snapshot)
    try:
        strategy = get_strategy(args.strategy)
    except KeyError as exc:
        raise UsageError(f"--strategy: {exc.args[0]}") from None
    defaults = strategy.options.defaults()
    options: dict[str, Any] = {}
    if scenario is not None and strategy.name == "optimal":
        options.update(scenario.options)
    for name in ("threshold", "margin", "max_moves", "target_spread", "time_limit"):
        value = getattr(args, name)
        if value is None:
            continue
        if name not in defaults:
            raise UsageError(
                f"--{name.replace('_', '-')}: strategy {strategy.name} has no such option"
            )
        options[name] = value
    for item in args.option:
        name, value = _strategy_option(item, strategy.name, defaults)
        options[name] = value
    if options:
        # The CLI checked the types, the strategy checks the values: an option it refuses is a
        # usage error, found before the real run — whose errors are the strategy's own (a bug).
        refused = strategy_problem(strategy.name, options)
        if refused is not None:
            raise UsageError(refused[1])
    typed = strategy.options.parse(strategy.name, options)
    return make_plan(
        cluster,
        strategy,
        typed,
        max_parallel=args.max_parallel,
        max_node_inflow=args.max_node_inflow,
    )


def cmd_plan(args: argparse.Namespace) -> int:
    result = _planned(args)
    if args.format == "json":
        _dump_json(result.as_dict())
    else:
        report = Report(_console())
        show_proposal(report, result.proposal, result.by_arch)
        show_plan(report, result.plan)
        for _guest, reason in result.stuck:
            report.line(f"Repair stuck: {reason}", "red")
        show_bounds(report, result.proposal, result.bounds, result.achieved)
    return EXIT_OK if result.ok else EXIT_PROBLEM


#: The options of ``plan`` and ``report SNAPSHOT`` besides ``--strategy``.
_PLAN_OPTIONS = (
    "target_spread",
    "threshold",
    "margin",
    "max_moves",
    "time_limit",
    "option",
    "max_parallel",
    "max_node_inflow",
)


def cmd_report(args: argparse.Namespace) -> int:
    if (args.snapshot is None) == (args.config is None):
        raise UsageError("report: give a SNAPSHOT or --config FILE (one of them)")
    if args.config is not None:
        given = [name for name in _PLAN_OPTIONS if getattr(args, name) not in (None, [])]
        if args.strategy != DEFAULT_STRATEGY or given:
            option = "--" + (given[0] if given else "strategy").replace("_", "-")
            raise UsageError(f"report: {option} is for a SNAPSHOT's plan, not with --config")
        try:
            document = report_of_history(args.config)
        except HistoryError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_PROBLEM
    else:
        document = plan_document(_planned(args), args.snapshot)
    write_report(document, args.format, args.output)
    return EXIT_OK


def _strategy_option(item: str, strategy: str, defaults: Mapping[str, object]) -> tuple[str, Any]:
    """``NAME=VALUE`` for a strategy option: VALUE read as JSON (number, true/false, list, …),
    or as plain text when it is not JSON; checked against the type of the option's default."""
    if "=" not in item:
        raise UsageError(f"-o: {item!r} is not NAME=VALUE")
    name, text = (part.strip() for part in item.split("=", 1))
    if len(text) > 4000:  # no option needs more; a longer text would fill the error line
        raise UsageError(f"-o {name}: the value is longer than 4000 characters")
    name = name.replace("-", "_")
    if name not in defaults:
        known = ", ".join(sorted(defaults))
        raise UsageError(f"-o {name}: strategy {strategy} has no such option (options: {known})")

    def no_constants(constant: str) -> Any:
        raise UsageError(f"-o {name}: {constant} is not a finite number")

    try:
        value = json.loads(text, parse_constant=no_constants)
    except ValueError:
        value = text
    try:  # as in a policy's options: the type of the default, a number no strategy means
        return name, typed_option(value, defaults[name], repr(text))
    except ValueError as exc:
        raise UsageError(f"-o {name}: {exc}") from None


def cmd_proxlb_check(args: argparse.Namespace) -> int:
    try:
        get_strategy(args.strategy)
    except KeyError as exc:
        raise UsageError(f"--strategy: {exc.args[0]}") from None
    files = scenario_files(args.paths)
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        raise UsageError(f"{missing[0]}: no such file or directory")
    if not files:
        raise UsageError(f"{', '.join(args.paths)}: no scenario files (*.yaml)")
    results = check_paths(files, strategy=args.strategy, time_limit=args.time_limit)
    if args.junit:
        try:
            Path(args.junit).write_text(junit_xml(results), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--junit: cannot write {args.junit}: {exc.strerror or exc}") from None
    if args.format == "json":
        _dump_json([r.as_dict() for r in results])
    else:
        report = Report(_console())
        for result in results:
            status = "PASS" if result.passed else "FAIL"
            report.line(
                f"{status}  {result.path}  ({result.migrations} migrations, "
                f"{result.duration * 1000:.0f} ms)",
                "green" if result.passed else "red",
            )
            for check in result.failures:
                report.line(f"      {check.name}: expected {check.expected}, {check.detail}", "red")
        passed = sum(r.passed for r in results)
        report.line(f"{passed} passed, {len(results) - passed} failed")
    return EXIT_OK if all(r.passed for r in results) else EXIT_PROBLEM


def cmd_strategies(args: argparse.Namespace) -> int:
    for name in sorted(REGISTRY):
        print(f"{name:16} {REGISTRY[name].summary}")
    return EXIT_OK


def cmd_pve_decide(args: argparse.Namespace) -> int:
    from opendrs.compat.pve import serve

    stdin: Any = sys.stdin
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        # Bytes that are not UTF-8 reach serve() as lone surrogates: that line gets an error
        # answer, instead of a UnicodeDecodeError ending the stream.
        stdin = io.TextIOWrapper(buffer, encoding="utf-8", errors="surrogateescape")
    return serve(stdin, sys.stdout)


# --------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _at_least_one(text: str) -> int:
    value = _positive_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(text: str) -> float:
    value = _fraction(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def _fraction(text: str) -> float:
    value = parse_number(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError("must be a finite number ≥ 0")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see --help)\n")


def _add_plan_options(p: argparse.ArgumentParser, *option_flags: str) -> None:
    """The strategy and its options, and the planner's limits (``plan`` and ``report``);
    ``option_flags``: the flags of any other strategy option."""
    p.add_argument(
        "--strategy",
        default=DEFAULT_STRATEGY,
        help=f"rebalancing strategy (default {DEFAULT_STRATEGY}; see 'opendrs strategies')",
    )
    p.add_argument(
        "--target-spread", type=_fraction, help="balance: stop when every spread is within this"
    )
    p.add_argument(
        "--threshold",
        type=_fraction,
        help="pve-*: act only above this imbalance (0.3: the CV ÷ √(N−1), 30 %%)",
    )
    p.add_argument(
        "--margin",
        type=_fraction,
        help="minimum improvement a move must bring (meaning depends on the strategy)",
    )
    p.add_argument("--max-moves", type=_positive_int, help="at most this many migrations")
    p.add_argument("--time-limit", type=_seconds, help="optimal: solver time limit in seconds")
    p.add_argument(
        *option_flags,
        dest="option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other strategy option (see docs/strategies.md), e.g. "
        f"{option_flags[0]} balanciness=4",
    )
    p.add_argument(
        "--max-parallel", type=_at_least_one, help="migrations at once (default: the snapshot's)"
    )
    p.add_argument(
        "--max-node-inflow",
        type=_at_least_one,
        help="migrations at once into one node (default: the snapshot's)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="opendrs",
        description="An open Distributed Resource Scheduler for Proxmox VE and Incus clusters.",
        epilog="SNAPSHOT is a snapshot file (YAML or JSON; see docs/snapshot-format.md), "
        "or 'demo' for the built-in example cluster.",
    )
    parser.add_argument("--version", action="version", version=f"opendrs {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an internal error (a bug), print its traceback as well",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def with_format(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--format",
            choices=("text", "json"),
            default="text",
            help="output format (default text)",
        )

    p = sub.add_parser("validate", help="check a snapshot file and its rules")
    p.add_argument("snapshot", metavar="SNAPSHOT")
    with_format(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "show",
        help="nodes with load bars, guests per node, imbalance figures, rules broken now",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    p.add_argument("--no-guests", action="store_true", help="leave out the guest table")
    with_format(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "place",
        help="rank the nodes for a guest, a new guest, or every guest of a node to evacuate",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--guest", metavar="ID", help="an existing guest: where should it be?")
    what.add_argument(
        "--new",
        metavar="SPEC",
        help="a new guest: cpu=N,memory=SIZE[,kind=vm|ct][,arch=A][,name=N][,cpu_used=C]"
        "[,memory_used=SIZE][,priority=1-3]",
    )
    what.add_argument("--evacuate", metavar="NODE", help="place every guest of NODE elsewhere")
    p.add_argument(
        "--failed",
        action="store_true",
        help="the guest's node (or NODE) has failed: recovery rules (restart elsewhere)",
    )
    with_format(p)
    p.set_defaults(func=cmd_place)

    p = sub.add_parser(
        "plan",
        help="propose migrations that balance the cluster, ordered into safe steps",
        description="Propose migrations and order them into steps that never overload a node; "
        "guests that break a hard constraint are repaired first, whatever it costs and whatever "
        "the strategy, as the daemon does: a repair that moves anything is the plan, and the "
        "strategy is asked once nothing breaks. Guests left on a node in maintenance are named "
        "(they may not move, or no node takes them). SNAPSHOT may "
        "also be a proxlb-solver scenario file (its balancing.method is what every strategy "
        "balances; its other options apply to --strategy optimal). Exit status: 0 done, 1 the "
        "plan cannot reach everything safely, the strategy found no feasible placement, a "
        "repair has no solution or a guest is left on a node in maintenance; 2 bad input.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    _add_plan_options(p, "-o", "--option")
    with_format(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "report",
        help="a report to look at: one self-contained HTML file (or Markdown) of a snapshot's "
        "plan or of a daemon's history",
        description="SNAPSHOT: the nodes' loads before and after the plan 'opendrs plan' makes "
        "(the same strategy options), its steps as a timeline, each move with its reason, the "
        "lower bounds and the gap, the rules and their conflicts. --config FILE: the daemon's "
        "history, read-only — the spread over time, migrations per day, failures and what was "
        "done about them, the guests that moved most. HTML holds its styles and charts (inline "
        "SVG) and refers to nothing outside itself. Exit status: 0 written, 1 the history "
        "cannot be read, 2 bad input.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT", nargs="?", help="a snapshot, or 'demo'")
    p.add_argument("--config", metavar="FILE", help="a daemon's configuration: report its history")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write the report to FILE (default: standard output)"
    )
    p.add_argument(
        "--format", choices=REPORT_FORMATS, default="html", help="html (default) or md (Markdown)"
    )
    _add_plan_options(p, "--option")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("strategies", help="list the rebalancing strategies")
    p.set_defaults(func=cmd_strategies)

    add_run_parser(sub)
    add_status_parser(sub)
    add_history_parser(sub)
    add_snapshot_parser(sub)
    add_maintenance_parser(sub)
    add_simulate_parser(sub)
    add_demo_parser(sub)

    p = sub.add_parser("proxlb", help="proxlb-solver compatibility")
    proxlb_sub = p.add_subparsers(dest="proxlb_command", metavar="COMMAND", required=True)
    q = proxlb_sub.add_parser(
        "check",
        help="run proxlb-solver scenario files and check their expect blocks",
    )
    q.add_argument("paths", metavar="PATH", nargs="+", help="scenario files or folders of them")
    q.add_argument("--strategy", default="optimal", help="strategy to run (default optimal)")
    q.add_argument(
        "--time-limit", type=_seconds, default=5.0, help="solver time limit per scenario (s)"
    )
    q.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML")
    with_format(q)
    q.set_defaults(func=cmd_proxlb_check)

    p = sub.add_parser("pve", help="Proxmox VE compatibility")
    pve_sub = p.add_subparsers(dest="pve_command", metavar="COMMAND", required=True)
    q = pve_sub.add_parser(
        "decide",
        help="answer Proxmox CRS decision queries: JSON Lines on stdin, one answer per line",
    )
    q.set_defaults(func=cmd_pve_decide)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SnapshotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # not bad input: a bug, said as such (exit 1, not 2)
        return _internal_error(exc, verbose=args.debug or getattr(args, "verbose", False))


def _internal_error(exc: Exception, *, verbose: bool) -> int:
    """One line for an exception no input explains (``--debug``: its traceback first)."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    detail = one_line(" ".join(str(exc).split()))
    what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    hint = "" if verbose else " (opendrs --debug … shows the traceback)"
    print(
        f"error: internal error (a bug in opendrs, please report it): {what}{hint}",
        file=sys.stderr,
    )
    return EXIT_PROBLEM


if __name__ == "__main__":
    sys.exit(main())
