"""``opendrs plan``, ``report`` and ``strategies``: a snapshot's plan by a strategy with its
options, printed or drawn (or a daemon's history drawn), and the strategies there are."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from opendrs.cli.arguments import (
    Subcommands,
    at_least_one,
    number_or_percentage,
    positive_seconds,
    whole_number,
)
from opendrs.cli.cluster_command import read_snapshot
from opendrs.cli.output import add_format_option, add_verbose_option, dump_json, new_console
from opendrs.cli.planning import PlanResult, make_plan
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, UsageError
from opendrs.engine.policy import strategy_problem
from opendrs.engine.strategies import DEFAULT_STRATEGY, REGISTRY, get_strategy
from opendrs.engine.strategies.base import StrategyOptions, option_value
from opendrs.report import FORMATS as REPORT_FORMATS
from opendrs.report.text import Report, show_bounds, show_plan, show_plan_breaks, show_proposal

__all__ = ["add_plan_options", "add_plan_parsers", "planned"]


def planned(args: argparse.Namespace) -> PlanResult:
    """The plan of ``opendrs plan`` (and ``opendrs report SNAPSHOT``) for the snapshot and the
    strategy options on the command line."""
    cluster, scenario = read_snapshot(args.snapshot)
    try:
        strategy = get_strategy(args.strategy)
    except KeyError as exc:
        raise UsageError(f"--strategy: {exc.args[0]}") from None
    options: dict[str, Any] = {}
    if scenario is not None and strategy.name == "optimal":
        options.update(scenario.options)
    options.update(_command_line_options(args, strategy.name, strategy.options))
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


def _command_line_options(
    args: argparse.Namespace, strategy: str, known: type[StrategyOptions]
) -> dict[str, Any]:
    """The strategy options the command line sets: its flags (``--target-spread``…) and each
    ``-O NAME=VALUE``. An option set twice (``--max-moves 1 -O max_moves=3``, or two ``-O`` of
    one name) is refused: which one was meant is not for opendrs to guess."""
    options: dict[str, Any] = {}
    given: dict[str, str] = {}
    for name in ("threshold", "margin", "max_moves", "target_spread", "time_limit"):
        value = getattr(args, name)
        if value is None:
            continue
        flag = f"--{name.replace('_', '-')}"
        if name not in known.names():
            raise UsageError(f"{flag}: strategy {strategy} has no such option")
        try:
            options[name] = option_value(known, name, value, repr(value))
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
        given[name] = flag
    if any("=" not in item for item in args.old_option):  # -o FILE, as report and snapshot
        raise UsageError(
            "-o: plan writes to standard output (redirect it: > FILE; 'opendrs report' writes a "
            "file with -o FILE); a strategy option is -O NAME=VALUE"
        )
    if args.old_option:
        instead = " ".join(f"-O {item}" for item in args.old_option)
        print(
            f"warning: plan -o NAME=VALUE is now -O NAME=VALUE (--option): write {instead}",
            file=sys.stderr,
        )
    for item in [*args.old_option, *args.option]:
        name, value = _strategy_option(item, strategy, known)
        if name in given:
            raise UsageError(f"-O {item}: {name} is already set by {given[name]}: give it once")
        options[name] = value
        given[name] = f"-O {item}"
    return options


def cmd_plan(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    result = planned(args)
    if args.verbose:  # measured: on standard error, never in the plan (same input, same bytes)
        elapsed = time.perf_counter() - started
        print(f"plan: planned in {elapsed * 1000:.0f} ms of wall time", file=sys.stderr)
    if args.format == "json":
        dump_json(result.as_dict())
    else:
        report = Report(new_console())
        show_proposal(
            report, result.proposal, result.by_arch, cluster=result.cluster, verbose=args.verbose
        )
        show_plan(report, result.plan, result.cluster)
        show_plan_breaks(report, result.cluster, result.placed, result.constraints.rules)
        for _guest, reason in result.stuck:
            report.wrapped(f"Repair stuck: {reason}", "red")
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
    # Imported here: the reports' modules (charts, templates) are not the plan's.
    from opendrs.cli.plan_report import plan_document
    from opendrs.cli.report_command import report_of_history, write_report
    from opendrs.controller.history_file import HistoryError

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
        document = plan_document(planned(args), args.snapshot)
    write_report(document, args.format, args.output)
    return EXIT_OK


def _strategy_option(item: str, strategy: str, options: type[StrategyOptions]) -> tuple[str, Any]:
    """``NAME=VALUE`` for a strategy option: VALUE read as JSON (number, true/false, list, …),
    or as plain text when it is not JSON (``15%``); checked as a policy's options are
    (:func:`option_value`: a share as a fraction or a percentage, the type of the default)."""
    if "=" not in item:
        raise UsageError(f"-O: {item!r} is not NAME=VALUE")
    name, text = (part.strip() for part in item.split("=", 1))
    if not name:
        raise UsageError(f"-O: {item!r} is not NAME=VALUE")
    if len(text) > 4000:  # no option needs more; a longer text would fill the error line
        raise UsageError(f"-O {name}: the value is longer than 4000 characters")
    name = name.replace("-", "_")
    if name not in options.names():
        known = ", ".join(sorted(options.names()))
        raise UsageError(f"-O {name}: strategy {strategy} has no such option (options: {known})")

    def no_constants(constant: str) -> Any:
        raise UsageError(f"-O {name}: {constant} is not a finite number")

    try:
        value = json.loads(text, parse_constant=no_constants)
    except ValueError:
        value = text
    try:  # as in a policy's options: a number no strategy means, a share above 100 %
        return name, option_value(options, name, value, repr(text))
    except ValueError as exc:
        raise UsageError(f"-O {name}: {exc}") from None


def cmd_strategies(args: argparse.Namespace) -> int:
    for name in sorted(REGISTRY):
        print(f"{name:16} {REGISTRY.summary(name)}")
    return EXIT_OK


def add_plan_options(p: argparse.ArgumentParser, *option_flags: str) -> None:
    """The strategy and its options, and the planner's limits (``plan`` and ``report``);
    ``option_flags``: the flags of any other strategy option."""
    p.add_argument(
        "--strategy",
        default=DEFAULT_STRATEGY,
        help=f"rebalancing strategy (default {DEFAULT_STRATEGY}; see 'opendrs strategies')",
    )
    p.add_argument(
        "--target-spread",
        type=number_or_percentage,
        help="balance: stop when every spread is within this (0.05 or 5%%: 5 points)",
    )
    p.add_argument(
        "--threshold",
        type=number_or_percentage,
        help="pve-*: act only above this imbalance (0.3 or 30%%: the CV ÷ √(N−1)); incus: above "
        "this gap in percent (20 or 20%%)",
    )
    p.add_argument(
        "--margin",
        type=number_or_percentage,
        help="minimum improvement a move must bring (pve-*: 0.1 or 10%%; balance: points of σ "
        "per %% of the cluster's migration cost)",
    )
    p.add_argument("--max-moves", type=whole_number, help="at most this many migrations")
    p.add_argument(
        "--time-limit", type=positive_seconds, help="optimal: solver time limit in seconds"
    )
    p.add_argument(
        *option_flags,
        dest="option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other strategy option (each strategy's options: 'man opendrs'), e.g. "
        f"{option_flags[0]} balanciness=4; a share as 0.15 or 15%%",
    )
    p.set_defaults(old_option=[])
    p.add_argument(
        "--max-parallel", type=at_least_one, help="migrations at once (default: the snapshot's)"
    )
    p.add_argument(
        "--max-node-inflow",
        type=at_least_one,
        help="migrations at once into one node (default: the snapshot's)",
    )


def add_plan_parsers(sub: Subcommands) -> None:
    """``plan``, ``report`` and ``strategies``."""
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
    add_plan_options(p, "-O", "--option")
    # -o NAME=VALUE before -O: kept for one release, with a warning (-o is --output elsewhere).
    p.add_argument("-o", dest="old_option", action="append", default=[], help=argparse.SUPPRESS)
    add_format_option(p)
    add_verbose_option(p, "; and, on standard error, the planning's wall time")
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
    add_plan_options(p, "-O", "--option")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "strategies",
        help="list the rebalancing strategies",
        description="List the strategies 'plan --strategy' and a policy's strategy take, one "
        "line each: its name and what it does.",
    )
    p.set_defaults(func=cmd_strategies)
