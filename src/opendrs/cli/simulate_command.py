"""``opendrs simulate``: the controller against the simulator, one run per policy, side by side,
printed (and drawn with ``--report``)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from opendrs.backends.generated import (
    DEFAULT_GUESTS,
    DEFAULT_NODES,
    DRAWN_FILL,
    FILL_RANGE,
    GUESTS_RANGE,
    NODES_RANGE,
    generated_scenario,
    shape_of,
)
from opendrs.backends.sim import HOT, Scenario, builtin_scenario, load_scenario
from opendrs.backends.sim.failover_probe import MODES as FAILOVER_MODES
from opendrs.cli.arguments import Subcommands, share, simulated_days
from opendrs.cli.process import (
    EXIT_OK,
    UsageError,
)
from opendrs.engine.policy import PRESETS, PolicyConfig, parse_policy
from opendrs.engine.policy.config import (
    BUDGET_WINDOW_RANGE,
    budget_problem,
    budget_window_problem,
    parse_budget,
)
from opendrs.json_data import json_text
from opendrs.model.document import Reader, parse, read_file
from opendrs.model.units import UnitError, format_duration, parse_duration, parse_fraction
from opendrs.report.text import Report

if TYPE_CHECKING:
    from rich.progress import TaskID

    from opendrs.cli.simulate import PolicyTrace, StabilityReport

DEFAULT_POLICIES = "opendrs,proxmox,incus,proxlb"


def _policies(spec: Sequence[str]) -> list[tuple[PolicyConfig, frozenset[str]]]:
    """Policies from preset names (comma-separated) or YAML files holding a policy mapping, each
    with the keys its file sets (a preset sets none: as ``policy: {preset: NAME}`` in a
    configuration, it takes the platform's own defaults)."""
    out: list[tuple[PolicyConfig, frozenset[str]]] = []
    for item in spec:
        for name in (p.strip() for p in item.split(",")):
            if not name:
                continue
            if name in PRESETS:
                out.append((PRESETS[name], frozenset()))
                continue
            if not Path(name).exists():
                known = ", ".join(sorted(PRESETS))
                raise UsageError(f"--policy: no preset or file {name!r} (presets: {known})")
            filename, data = read_file(name)
            document = parse(data, filename=filename)
            reader = Reader(filename)
            mapping = reader.mapping(document, ())
            value = mapping.get("policy", mapping)
            path: tuple[str, ...] = ("policy",) if "policy" in mapping else ()
            policy = parse_policy(reader, value, path)
            keys = frozenset(str(k) for k in reader.mapping(value, path))
            if policy.name == PolicyConfig().name and "name" not in keys:
                policy = replace(policy, name=Path(name).stem)
            out.append((policy, keys))
    if not out:
        raise UsageError("--policy: no policy given")
    return out


#: The emulated peers' presets: ``simulate --budget`` leaves them as they are.
PEERS: frozenset[str] = frozenset(PRESETS) - {PolicyConfig().name}


def with_budget(
    policies: list[PolicyConfig],
    budget: float | None,
    window: int | None = None,
    spend: bool = False,
) -> list[PolicyConfig]:
    """``policies`` with ``max_migrations_per_day`` set to ``budget``,
    ``migration_budget_window`` to ``window`` and ``spend_budget`` on when ``spend`` (a policy
    file's own ``spend_budget: true`` is kept) on opendrs's own (every policy not named after an
    emulated peer); ``budget`` None: unchanged."""
    if budget is None:
        return policies
    return [
        p
        if p.name in PEERS
        else replace(
            p,
            max_migrations_per_day=budget,
            migration_budget_window=window,
            spend_budget=spend or p.spend_budget,
        )
        for p in policies
    ]


def _scenario(args: argparse.Namespace) -> Scenario:
    """The scenario the command line names: a file, ``builtin:NAME`` or ``--generate SEED``."""
    sized = [
        f
        for f, v in (("--nodes", args.nodes), ("--guests", args.guests), ("--fill", args.fill))
        if v is not None
    ]
    if args.generate is None:
        if sized:
            raise UsageError(f"{sized[0]}: only with --generate SEED")
        return _named_scenario(args.scenario)
    if args.scenario is not None:
        raise UsageError(f"--generate: makes its own scenario, not with {args.scenario!r}")
    try:
        return generated_scenario(
            args.generate,
            DEFAULT_NODES if args.nodes is None else args.nodes,
            DEFAULT_GUESTS if args.guests is None else args.guests,
            args.fill,
        )
    except ValueError as exc:
        raise UsageError(f"--generate {args.generate}: {exc}") from None


def _named_scenario(arg: str | None) -> Scenario:
    if arg is None:
        return builtin_scenario("month")
    if arg.startswith("builtin:"):
        try:
            return builtin_scenario(arg.removeprefix("builtin:"))
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
    return load_scenario(arg)


def quiet_logs(silent: bool = False) -> None:
    """Simulated faults are expected: their warnings would only drown the report; the simulated
    controller's errors (``cannot observe the cluster (3 in a row): simulated API error…``) are
    still said, unless ``silent`` (``--no-progress``: nothing on standard error)."""
    logging.getLogger("opendrs").setLevel(logging.CRITICAL + 1 if silent else logging.ERROR)


def _check_budget_args(args: argparse.Namespace) -> None:
    """``--budget-window`` and ``--spend-budget`` only with a ``--budget`` they fit."""
    if args.budget is None:
        if args.budget_window is not None:
            raise UsageError("--budget-window: only with --budget N")
        if args.spend_budget:
            raise UsageError("--spend-budget: only with --budget N")
        return
    if args.budget_window is not None:
        problem = budget_window_problem(args.budget, args.budget_window)
        if problem:
            raise UsageError(f"--budget-window: {problem}")


def cmd_simulate(args: argparse.Namespace) -> int:
    # imported when the simulation runs: the controller and rich's progress bar are large
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from opendrs.backends.sim.failover_probe import FailoverProbe
    from opendrs.cli.simulate import run_policy

    quiet_logs(silent=args.no_progress)
    scenario = _scenario(args)
    chosen = _policies(args.policy or [DEFAULT_POLICIES])
    _check_budget_args(args)
    if args.report is not None:
        from opendrs.cli.report_command import check_writable

        check_writable(args.report, "--report")
    policies = with_budget(
        [policy for policy, _ in chosen], args.budget, args.budget_window, args.spend_budget
    )
    console = Console(stderr=True)
    show_progress = not args.no_progress and console.is_terminal
    lines = None if args.no_progress or console.is_terminal else ProgressLines(console)
    reports: list[StabilityReport] = []
    traces: list[PolicyTrace] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        disable=not show_progress,
        transient=True,
    ) as progress:
        for policy, (_, keys) in zip(policies, chosen, strict=True):
            task = progress.add_task(f"{policy.name:10}", total=1.0)

            def update(
                now: float, end: float, task: TaskID = task, name: str = policy.name
            ) -> None:
                progress.update(task, completed=now / end if end > 0 else 1.0)
                if lines is not None:
                    lines.running(name, now, end)

            reports.append(
                run_policy(
                    scenario,
                    policy,
                    days=args.days,
                    threshold=args.threshold,
                    hot=args.hot,
                    progress=update,
                    policy_keys=keys,
                    traces=traces if args.report is not None else None,
                    failover=None
                    if args.failover_check is None
                    else FailoverProbe(args.failover_check),
                )
            )
            progress.update(task, completed=1.0)
            if not args.no_progress:  # each policy's first figures as soon as it is done
                said = finished_line(reports[-1])
                console.print(said, markup=False, highlight=False, soft_wrap=True)
    if args.report is not None:
        runs = list(zip(reports, traces, strict=True))
        _write_simulation_report(args.report, scenario_name(args, scenario), runs)
    if args.format == "json":
        sys.stdout.write(json_text([r.as_dict() for r in reports], sort_keys=False))
        return EXIT_OK
    report = Report(Console(highlight=False, soft_wrap=False))
    show_stability(report, reports, scenario_name(args, scenario))
    return EXIT_OK


def failover_lines(policy: str, found: Mapping[str, Any] | None) -> list[str]:
    """``--failover-check``'s findings for one policy, a line a mode."""
    if found is None:
        return []
    lines = []
    for mode in FAILOVER_MODES:
        tally = found.get(mode)
        if tally is None:
            continue
        how = "the headroom check's" if mode == "opendrs" else f"Proxmox HA, {mode} mode"
        held = f"; {tally['held']} held (may not start elsewhere)" if tally["held"] else ""
        lines.append(
            f"{policy}: node failures tried hourly ({how} restarts): {tally['short_cases']} of "
            f"{tally['cases']} left HA guests down, {tally['stranded']} in all, at most "
            f"{tally['worst']} at once{held}"
        )
    if found.get("skipped"):
        lines.append(
            f"{policy}: {found['skipped']} hours not tried (a node down or in maintenance), "
            f"{found['checks']} tried"
        )
    return lines


class ProgressLines:
    """Progress as lines on standard error when it is not a terminal (a log, a pipe, CI): where
    each policy's run is, when it starts and then every :attr:`every` seconds of wall time."""

    every = 10.0

    def __init__(self, console: Console) -> None:
        self.console = console
        self.last = -float("inf")
        self.policy = ""

    def running(self, name: str, now: float, end: float) -> None:
        if name == self.policy and time.monotonic() - self.last < self.every:
            return
        self.policy = name
        self.last = time.monotonic()
        done = now / end if end > 0 else 1.0
        line = f"simulate: {name}: day {now / 86_400:.1f} of {end / 86_400:g} ({done:.0%})"
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


def finished_line(r: StabilityReport) -> str:
    """One policy's run in a line, as soon as it is done: its migrations, the share of the time
    its spread stayed above the threshold, its mean spread, and the wall time it took."""
    return (
        f"simulate: {r.policy} done in {r.wall_seconds:.0f} s: {r.migrations} migrations over "
        f"{r.days:g} days, spread above {100 * r.threshold:g} pp "
        f"{r.pct_time_above_threshold:.1f} % of the time, "
        f"{100 * r.mean_imbalance:.1f} pp on average"
    )


def _write_simulation_report(
    path: str, name: str, runs: Sequence[tuple[StabilityReport, PolicyTrace]]
) -> None:
    """``simulate --report FILE``: HTML, or Markdown for a ``.md`` file (imported here: only
    this option needs the templates and the charts)."""
    from opendrs.cli.report_command import file_format, write_report
    from opendrs.cli.simulation_report import simulation_document

    write_report(simulation_document(name, runs), file_format(path), path, "--report")


def scenario_name(args: argparse.Namespace, scenario: Scenario) -> str:
    if args.generate is not None:
        cluster = scenario.cluster
        fill = "" if args.fill is None else f", memory {100 * args.fill:g} % filled"
        return (
            f"generated:{args.generate} ({len(cluster.nodes)} nodes, {len(cluster.guests)} "
            f"guests{fill}: {shape_of(args.generate).describe()})"
        )
    return "builtin:month" if args.scenario is None else args.scenario


def show_stability(report: Report, reports: Sequence[StabilityReport], name: str) -> None:
    first = reports[0]
    report.line()
    report.wrapped(
        f"Stability over {first.days:g} simulated days of {name} "
        f"(threshold: spread above {100 * first.threshold:g} pp; hot: a node above "
        f"{100 * first.hot:g} %)",
        "bold",
    )
    metrics = _stability_metrics(reports)
    policies = [r.policy for r in reports]
    wide = [["policy", *(label for label, _ in metrics)]] + [
        [policy, *(cells[i] for _, cells in metrics)] for i, policy in enumerate(policies)
    ]
    if _table_width(wide) <= report.console.width:
        right = range(2, len(metrics) + 1)
        report.table(wide[0], wide[1:], right=tuple(right))
    else:
        _show_by_metric(report, metrics, policies)
    for r in reports:
        for line in failover_lines(r.policy, r.failover):
            report.wrapped(line)
    for r in reports:
        if r.windows is not None:
            report.wrapped(
                f"migration windows of {r.policy}: {r.windows}; balancing migrations started "
                f"outside them: {r.balancing_outside_windows}"
            )


def _stability_metrics(reports: Sequence[StabilityReport]) -> list[tuple[str, list[str]]]:
    """Each figure of the stability table, with its cell for each policy (in order), each
    number with its unit; restart moves (containers on an Incus scenario) only when any."""
    metrics: list[tuple[str, Callable[[StabilityReport], str]]] = [
        ("strategy", lambda r: r.strategy),
        ("migrations", lambda r: str(r.migrations)),
        ("repairs", lambda r: str(r.repair_migrations)),
        ("per day", lambda r: f"{r.migrations_per_day:.1f}/day"),
        ("ping-pongs", lambda r: str(r.ping_pongs)),
        ("above threshold", lambda r: f"{r.pct_time_above_threshold:.1f} %"),
        ("mean spread", lambda r: f"{100 * r.mean_imbalance:.1f} pp"),
        ("capacity violations", lambda r: r.capacity_violations_shown),
        ("failed", lambda r: f"{r.failed_migrations} ({r.failures_moved_later} moved later)"),
        ("max node load", lambda r: f"{100 * r.max_node_load:.0f} %"),
        ("hot node-min", lambda r: f"{r.hot_node_minutes:,.0f} min"),
        ("hot min, worst node", lambda r: f"{r.max_hot_minutes_per_node:,.0f} min"),
        ("p95 node load", lambda r: f"{100 * r.p95_node_load:.0f} %"),
        ("wall time", lambda r: f"{r.wall_seconds:.1f} s"),
    ]
    if any(r.restart_migrations for r in reports):
        metrics.insert(
            9,
            (
                "restarts (down)",
                lambda r: f"{r.restart_migrations} ({r.restart_downtime_minutes:,.1f} min)",
            ),
        )
    return [(label, [cell(r) for r in reports]) for label, cell in metrics]


def _table_width(rows: Sequence[Sequence[str]]) -> int:
    """The columns a plain table of ``rows`` (the header first) takes, two spaces apart."""
    return sum(max(len(row[i]) for row in rows) for i in range(len(rows[0]))) + 2 * (
        len(rows[0]) - 1
    )


def _show_by_metric(
    report: Report, metrics: Sequence[tuple[str, Sequence[str]]], policies: Sequence[str]
) -> None:
    """The stability table turned for a narrow console: a row per figure, a column per policy;
    the policies in groups of as many as fit side by side, a table each."""
    groups: list[list[int]] = [[]]
    for i in range(len(policies)):
        rows = _by_metric_rows(metrics, policies, [*groups[-1], i])
        if groups[-1] and _table_width(rows) > report.console.width:
            groups.append([])
        groups[-1].append(i)
    for group in groups:
        rows = _by_metric_rows(metrics, policies, group)
        report.table(rows[0], rows[1:], right=range(1, len(group) + 1))
        if group is not groups[-1]:
            report.line()


def _by_metric_rows(
    metrics: Sequence[tuple[str, Sequence[str]]], policies: Sequence[str], group: Sequence[int]
) -> list[list[str]]:
    """The turned table of the policies ``group`` (indices): its header, then a row a figure."""
    header = ["policy", *(policies[i] for i in group)]
    return [header] + [[label, *(cells[i] for i in group)] for label, cells in metrics]


def add_simulate_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "simulate",
        help="run the controller against the simulator, one run per policy, side by side",
        description="Run the controller (active mode, history in memory) against a simulated "
        "cluster (scenarios: 'man opendrs'), once per policy, and print a stability report. "
        "Policies are presets (opendrs, proxmox, incus, proxlb: the peers' behaviour emulated) "
        "or YAML files with a policy section, as in a configuration file.",
    )
    add_scenario_arguments(p)
    add_policy_arguments(p)
    add_budget_arguments(p)
    add_output_arguments(p)
    p.set_defaults(func=cmd_simulate)


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    """``simulate``'s scenario: a file, ``builtin:NAME`` or a generated month, and its days."""
    p.add_argument(
        "scenario",
        metavar="SCENARIO",
        nargs="?",
        help="a scenario file, or builtin:NAME (default: builtin:month, 16 nodes, 400 guests)",
    )
    p.add_argument(
        "--generate",
        type=_seed,
        metavar="SEED",
        help="instead of SCENARIO, a 30-day month generated from SEED: node sizes, packing at "
        "the start, workload mix, faults and hot spots (lasting, alternating) drawn from it "
        "('man opendrs')",
    )
    p.add_argument(
        "--nodes",
        type=_whole(*NODES_RANGE),
        metavar="N",
        help=f"nodes of the generated month (default {DEFAULT_NODES})",
    )
    p.add_argument(
        "--guests",
        type=_whole(*GUESTS_RANGE),
        metavar="M",
        help=f"guests of the generated month (default {DEFAULT_GUESTS})",
    )
    p.add_argument(
        "--fill",
        type=_fill,
        metavar="SHARE",
        help="the share of the generated month's memory its guests' configured memory fills "
        f"({FILL_RANGE[0]:g} to {FILL_RANGE[1]:g}, or a percentage; default: drawn from "
        f"{DRAWN_FILL[0]:g} to {DRAWN_FILL[1]:g}); 0.8 and more leave little room to restart a "
        "failed node's HA guests",
    )
    p.add_argument("--days", type=simulated_days, help="simulated days (default: the scenario's)")


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """``simulate``'s policies to compare and the report's yardsticks (threshold, hot)."""
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAMES|FILE",
        help=f"policies to compare, comma-separated (default {DEFAULT_POLICIES}); repeatable",
    )
    p.add_argument(
        "--threshold",
        type=share,
        default=PolicyConfig().threshold,
        help="imbalance yardstick of the report: a spread, as a fraction or a percentage "
        f"(default {PolicyConfig().threshold:g}, {PolicyConfig().threshold * 100:g}%%)",
    )
    p.add_argument(
        "--hot",
        type=_hot,
        default=HOT,
        help="a node runs hot above this load (cpu or memory, a share of capacity net of "
        f"reserves, 5-minute average, as 0.85 or 85%%; default {HOT:g}; above 100%% as a "
        "percentage)",
    )
    p.add_argument(
        "--failover-check",
        type=_failover_modes,
        metavar="MODES",
        help="every simulated hour while every node is up, fail each in turn (on a copy: the "
        "run goes on), restart its HA guests in each of MODES (comma-separated) and report the "
        "failures that leave HA guests down and how many: basic, static — as Proxmox VE's HA "
        "manager in that scheduler mode (datacenter crs ha=...; basic is its default) —, "
        "opendrs — as the failover headroom check (policy.keep_failover) places them",
    )


def add_budget_arguments(p: argparse.ArgumentParser) -> None:
    """``simulate``'s migration budget for opendrs's own policies."""
    p.add_argument(
        "--budget",
        type=_budget,
        metavar="N",
        help="a migration budget: at most N balancing migrations in any 24 hours, or with a "
        "fraction below 1 (0.5, 1/3) one in any 1/N days (policy.max_migrations_per_day) for "
        "opendrs's own policies; the emulated peers' presets (proxmox, incus, proxlb) are left "
        "as they are",
    )
    p.add_argument(
        "--spend-budget",
        action="store_true",
        help="with --budget, spend what the budget leaves on a faster reaction "
        "(policy.spend_budget): above one migration per 6-hour smoothing window (4 a day), "
        "usage closer to the last half hour's and a shorter hold while much of it is left",
    )
    p.add_argument(
        "--budget-window",
        type=parse_budget_window,
        metavar="DURATION",
        help="with --budget, the budget's rolling window (policy.migration_budget_window): "
        "at most N × the window in days migrations (rounded down) in any such window, free to be "
        "spent together — --budget 0.5 --budget-window 14d: 7 in any 14 days",
    )


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """What ``simulate`` shows: progress, the output format and the ``--report`` file."""
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="nothing on standard error but a failure of the command: no progress bar or "
        "lines, no simulated errors",
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also write the policies side by side, with the spread over time and the "
        "migrations per day of each on one chart: a self-contained HTML file, or Markdown when "
        "FILE ends in .md",
    )


def _hot(text: str) -> float:
    """A load: a fraction above 0 and at most 1 (``0.85``), or a percentage up to 1000 %."""
    try:
        value = parse_fraction(text, maximum=10)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _failover_modes(text: str) -> tuple[str, ...]:
    """``--failover-check``'s modes: comma-separated, from :data:`FAILOVER_MODES`."""
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in modes if m not in FAILOVER_MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'no mode'}: the modes are {', '.join(FAILOVER_MODES)}"
        )
    return modes


def _fill(text: str) -> float:
    """A share of memory for ``--fill``: within :data:`FILL_RANGE`, a fraction or a percentage."""
    try:
        value = parse_fraction(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not FILL_RANGE[0] <= value <= FILL_RANGE[1]:
        raise argparse.ArgumentTypeError(
            f"must be from {FILL_RANGE[0]:g} to {FILL_RANGE[1]:g} ({100 * FILL_RANGE[0]:g}% to "
            f"{100 * FILL_RANGE[1]:g}%)"
        )
    return value


def _budget(text: str) -> int | float:
    value = parse_budget(text)
    problem = budget_problem(value, text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    assert isinstance(value, int | float)  # budget_problem refuses anything else
    return int(value) if isinstance(value, float) and value.is_integer() else value


def parse_budget_window(text: str) -> int:
    """An argparse duration for ``--budget-window``, from an hour to a year."""
    try:
        seconds = parse_duration(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    shortest, longest = BUDGET_WINDOW_RANGE
    if not shortest <= seconds <= longest:
        raise argparse.ArgumentTypeError(
            f"must be from {format_duration(shortest)} to {format_duration(longest)}, got {text!r}"
        )
    return seconds


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError("must be a whole number from 0 to 2^63 - 1")
    return value


def _whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}")
        return value

    return parse
