"""``opendrs run``: the daemon's command — configuration, lock, history, signals, logging."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TypeVar

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from opendrs.backends.base import BackendError
from opendrs.backends.generated import (
    DEFAULT_GUESTS,
    DEFAULT_NODES,
    GUESTS_RANGE,
    NODES_RANGE,
    generated_scenario,
    shape_of,
)
from opendrs.backends.sim import HOT, Scenario, Simulator, builtin_scenario, load_scenario
from opendrs.cli.process import (
    EXIT_LASTING,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    UsageError,
    setup_logging,
)
from opendrs.cli.simulate import (
    PolicyTrace,
    StabilityReport,
    report_from,
    run_policy,
    simulated_config,
)
from opendrs.controller.config import (
    BackendConfig,
    Config,
    HttpConfig,
    load_config,
    parse_listen,
)
from opendrs.controller.dashboard import Dashboard
from opendrs.controller.decision_log import DecisionLog, DecisionLogError
from opendrs.controller.executor import Event
from opendrs.controller.history import History, HistoryError
from opendrs.controller.http_server import HttpError, start_server
from opendrs.controller.loop import Controller, Cycle, InstanceLock, LockError
from opendrs.controller.metrics import DaemonMetrics
from opendrs.engine.policy import PRESETS, PolicyConfig, parse_policy
from opendrs.engine.policy.config import (
    BUDGET_WINDOW_RANGE,
    budget_problem,
    budget_window_problem,
    parse_budget,
)
from opendrs.model.document import DocumentError, Reader, parse, read_file
from opendrs.model.units import UnitError, format_duration, parse_duration
from opendrs.report.data import json_text
from opendrs.report.text import Report, bar

log = logging.getLogger("opendrs")

T = TypeVar("T")


def each(*hooks: Callable[[T], None] | None) -> Callable[[T], None]:
    """One hook that calls each of ``hooks`` in turn (``None`` ones left out)."""
    called = [hook for hook in hooks if hook is not None]

    def call(value: T) -> None:
        for hook in called:
            hook(value)

    return call


class _Signals:
    """SIGTERM/SIGINT ask to stop after the current step; SIGHUP asks to reload."""

    def __init__(self, config_path: str) -> None:
        self.config_path = config_path
        self.stop = False
        self.reload = False
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig, handler in (
            (signal.SIGTERM, self._on_stop),
            (signal.SIGINT, self._on_stop),
            (signal.SIGHUP, self._on_hup),
        ):
            self._previous[sig] = signal.signal(sig, handler)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self.reload = True

    def holding(self) -> str | None:
        """Why no migration may start now: a stop or a reload was asked for and not yet done."""
        if self.stop:
            return "opendrs is stopping"
        if self.reload:
            return "the configuration is being reloaded"
        return None

    def take_reload(self) -> Config | None:
        if not self.reload:
            return None
        self.reload = False
        try:
            config = load_config(self.config_path)
        except DocumentError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            return None
        setup_logging(config.log_level)
        return config


def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    setup_logging("debug" if args.verbose else config.log_level)
    signals = _Signals(args.config)
    try:
        lock = InstanceLock(config.lock, config.history)
        lock.acquire()
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LASTING if exc.lasting else EXIT_PROBLEM
    try:
        decisions = DecisionLog(config.decision_log)
    except DecisionLogError as exc:
        lock.release()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        history = History(config.history)
    except HistoryError as exc:
        decisions.close()
        lock.release()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM if exc.passing else EXIT_LASTING
    history.listen(decisions.record)
    metrics = DaemonMetrics()
    dashboard = Dashboard(config) if config.http is not None else None
    try:
        server = start_server(config.http, metrics, dashboard) if config.http is not None else None
    except HttpError as exc:
        history.close()
        decisions.close()
        lock.release()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.usage else EXIT_PROBLEM

    def take_reload() -> Config | None:
        fresh = signals.take_reload()
        if fresh is not None:
            try:  # a rotated log is opened again; a renamed one, or none, follows the file
                decisions.reopen(fresh.decision_log)
            except DecisionLogError as exc:
                log.error("%s; the decision log stays %s", exc, decisions.path)
            if server is not None and fresh.http != server.config:
                log.warning(
                    "the http section changed: it takes effect at the next restart "
                    "(still serving on http://%s)",
                    server.address,
                )
            elif server is None and fresh.http is not None:
                log.warning("the http section is new: it takes effect at the next restart")
        return fresh

    backend = None
    signals.install()
    try:
        backend, clock = config.make_backend(should_stop=lambda: signals.stop)
        controller = Controller(
            config,
            backend,
            clock,
            history,
            force_shadow=args.shadow,
            # Between a signal and its handling nothing starts (the file may say shadow now), not
            # even a start whose request is about to be sent: its reads are given up on.
            hold_starts=signals.holding,
            on_event=each(metrics.event, dashboard and dashboard.event),
            on_cycle=each(metrics.cycle, dashboard and dashboard.cycle),
        )
        metrics.follow(controller)
        if dashboard is not None:
            dashboard.follow(controller)
        log.info(
            "opendrs %s: %s backend, %s mode, policy %s (strategy %s)%s",
            "one cycle" if args.once else "started",
            backend.name,
            controller.config.mode,
            config.policy.name,
            config.policy.strategy,
            "" if controller.config.active else " — nothing will be migrated",
        )
        until = backend.end if isinstance(backend, Simulator) else None
        controller.run(
            once=args.once,
            until=until,
            should_stop=lambda: signals.stop,
            take_reload=take_reload,
            reload_pending=lambda: signals.reload,
        )
        if signals.stop:
            log.info("stopping: state recorded; migrations in flight are followed after restart")
        elif args.once and controller.cycles and controller.cycles[-1].error is not None:
            print(
                f"error: cannot observe the cluster: {controller.cycles[-1].error}",
                file=sys.stderr,
            )
            return EXIT_PROBLEM
        return EXIT_OK
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    except HistoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM if exc.passing else EXIT_LASTING
    finally:
        signals.restore()
        if server is not None:
            server.stop()
        if backend is not None:
            backend.close()
        history.close()
        decisions.close()
        lock.release()


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="the daemon: observe, decide and (in active mode) migrate, every interval",
        description="Run the controller with a configuration file (see docs/configuration.md). "
        "Shadow mode, the default, only records and logs what it would do; migrations happen "
        "only with 'mode: active' in the file. SIGHUP reloads the file (and opens the decision "
        "log again), SIGTERM stops cleanly. Exit status: 0 stopped, 1 a problem that may pass "
        "(retry), 2 bad configuration (or a decision log that cannot be opened), 3 a problem a "
        "restart cannot cure (corrupt or foreign history).",
    )
    p.add_argument("--config", required=True, metavar="FILE", help="the configuration (YAML)")
    p.add_argument(
        "--once",
        action="store_true",
        help="one cycle (no hold), then follow its migrations to the end and exit; exit status 1 "
        "when the cluster could not be observed",
    )
    p.add_argument(
        "--shadow",
        action="store_true",
        help="never migrate, whatever the file says, through every reload",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_run)


# --------------------------------------------------------------------------------------------
# opendrs simulate


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
    sized = [f for f, v in (("--nodes", args.nodes), ("--guests", args.guests)) if v is not None]
    if args.generate is None:
        if sized:
            raise UsageError(f"{sized[0]}: only with --generate SEED")
        return _named_scenario(args.scenario)
    if args.scenario is not None:
        raise UsageError(f"--generate: makes its own scenario, not with {args.scenario!r}")
    return generated_scenario(
        args.generate,
        DEFAULT_NODES if args.nodes is None else args.nodes,
        DEFAULT_GUESTS if args.guests is None else args.guests,
    )


def _named_scenario(arg: str | None) -> Scenario:
    if arg is None:
        return builtin_scenario("month")
    if arg.startswith("builtin:"):
        try:
            return builtin_scenario(arg.removeprefix("builtin:"))
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
    return load_scenario(arg)


def _quiet() -> None:
    """Simulated faults are expected: their warnings would only drown the report."""
    logging.getLogger("opendrs").setLevel(logging.ERROR)


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
    _quiet()
    scenario = _scenario(args)
    chosen = _policies(args.policy or [DEFAULT_POLICIES])
    _check_budget_args(args)
    policies = with_budget(
        [policy for policy, _ in chosen], args.budget, args.budget_window, args.spend_budget
    )
    console = Console(stderr=True)
    show_progress = not args.no_progress and console.is_terminal
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

            def update(now: float, end: float, task: TaskID = task) -> None:
                progress.update(task, completed=now / end if end > 0 else 1.0)

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
                )
            )
            progress.update(task, completed=1.0)
    if args.report is not None:
        runs = list(zip(reports, traces, strict=True))
        _write_simulation_report(args.report, scenario_name(args, scenario), runs)
    if args.format == "json":
        sys.stdout.write(json_text([r.as_dict() for r in reports], sort_keys=False))
        return EXIT_OK
    report = Report(Console(highlight=False, soft_wrap=False))
    show_stability(report, reports, scenario_name(args, scenario))
    return EXIT_OK


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
        return (
            f"generated:{args.generate} ({len(cluster.nodes)} nodes, {len(cluster.guests)} "
            f"guests: {shape_of(args.generate).describe()})"
        )
    return "builtin:month" if args.scenario is None else args.scenario


def show_stability(report: Report, reports: Sequence[StabilityReport], name: str) -> None:
    first = reports[0]
    report.heading(
        f"Stability over {first.days:g} simulated days of {name} "
        f"(threshold: spread above {100 * first.threshold:g} pp; hot: a node above "
        f"{100 * first.hot:g} %)"
    )
    rows = [
        [
            r.policy,
            r.strategy,
            str(r.migrations),
            str(r.repair_migrations),
            f"{r.migrations_per_day:.1f}",
            str(r.ping_pongs),
            f"{r.pct_time_above_threshold:.1f} %",
            f"{100 * r.mean_imbalance:.1f} pp",
            str(r.capacity_violations),
            f"{r.failed_migrations} ({r.failures_moved_later} moved later)",
            f"{100 * r.max_node_load:.0f} %",
            f"{r.hot_node_minutes:,.0f}",
            f"{r.max_hot_minutes_per_node:,.0f}",
            f"{100 * r.p95_node_load:.0f} %",
            f"{r.wall_seconds:.1f} s",
        ]
        for r in reports
    ]
    header = [
        "policy",
        "strategy",
        "migrations",
        "repairs",
        "per day",
        "ping-pongs",
        "above threshold",
        "mean spread",
        "capacity violations",
        "failed",
        "max node load",
        "hot node-min",
        "hot min, worst node",
        "p95 node load",
        "wall time",
    ]
    right = [2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14]
    if any(r.restart_migrations for r in reports):
        # Restart moves (containers on an Incus scenario), after "failed".
        header.insert(10, "restarts (down)")
        right = [i + (i >= 10) for i in right] + [10]
        for row, r in zip(rows, reports, strict=True):
            row.insert(10, f"{r.restart_migrations} ({r.restart_downtime_minutes:,.1f} min)")
    report.table(header, rows, right=tuple(sorted(right)))


def add_simulate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="run the controller against the simulator, one run per policy, side by side",
        description="Run the controller (active mode, history in memory) against a simulated "
        "cluster (see docs/scenarios.md), once per policy, and print a stability report. "
        "Policies are presets (opendrs, proxmox, incus, proxlb: the peers' behaviour emulated) "
        "or YAML files with a policy section (see docs/configuration.md).",
    )
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
        "the start, workload mix and faults drawn from it (see docs/scenarios.md)",
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
    p.add_argument("--days", type=_days, help="simulated days (default: the scenario's)")
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAMES|FILE",
        help=f"policies to compare, comma-separated (default {DEFAULT_POLICIES}); repeatable",
    )
    p.add_argument(
        "--threshold",
        type=_fraction,
        default=PolicyConfig().threshold,
        help="imbalance yardstick of the report: spread as a fraction "
        f"(default {PolicyConfig().threshold:g})",
    )
    p.add_argument(
        "--hot",
        type=_hot,
        default=HOT,
        help="a node runs hot above this load (cpu or memory, a fraction of capacity net of "
        f"reserves, 5-minute average; default {HOT:g})",
    )
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
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also write the policies side by side, with the spread over time and the "
        "migrations per day of each on one chart: a self-contained HTML file, or Markdown when "
        "FILE ends in .md",
    )
    p.set_defaults(func=cmd_simulate)


def parse_number(text: str) -> float:
    """An argparse number: a clear message for what is not one."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _hot(text: str) -> float:
    value = parse_number(text)
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError("must be a load fraction more than 0 and at most 10")
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


def _days(text: str) -> float:
    value = parse_number(text)
    if not 0 < value <= 3660:
        raise argparse.ArgumentTypeError("must be more than 0 and at most 3660")
    return value


def _fraction(text: str) -> float:
    value = parse_number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be a fraction from 0 to 1")
    return value


# --------------------------------------------------------------------------------------------
# opendrs demo


def cmd_demo(args: argparse.Namespace) -> int:
    """The controller in active mode against the built-in demo scenario, live — and on the
    dashboard while it runs."""
    _quiet()  # the live view prints every migration and failure itself
    scenario = builtin_scenario("demo")
    policy = PRESETS["opendrs"]
    console = Console(highlight=False, soft_wrap=False)
    report = Report(console)
    sim = Simulator(scenario, days=args.days, threshold=policy.threshold)
    config = simulated_config(
        policy, "<demo>", BackendConfig("sim", builtin="demo", days=args.days)
    )
    history = History(":memory:")
    pace = args.seconds if args.seconds is not None else 0.0
    if args.seconds is None and not args.fast and console.is_terminal:
        pace = DEMO_PACE
    live = LiveView(report, sim, pace=pace)
    metrics = DaemonMetrics()
    dashboard = None if args.no_dashboard else Dashboard(config, command="opendrs demo")
    controller = Controller(
        config,
        sim,
        sim,
        history,
        on_event=each(live.event, metrics.event, dashboard and dashboard.event),
        on_cycle=each(metrics.cycle, dashboard and dashboard.cycle, live.cycle),
    )
    metrics.follow(controller)
    start = scenario.cluster
    report.heading(
        f"opendrs demo: {len(start.nodes)} nodes, {len(start.guests)} guests, "
        f"{sim.end / 3600:g} simulated hours, active mode against the simulator"
    )
    server = None
    if dashboard is not None:
        dashboard.follow(controller)
        try:
            server = start_server(args.listen, metrics, dashboard)
        except HttpError as exc:
            history.close()
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE if exc.usage else EXIT_PROBLEM
        _show_address(report, server.address, args.listen.loopback, pace)
    live.start()
    try:
        controller.run(until=sim.end)
    finally:
        live.stop()
        if server is not None:
            server.stop()
    try:
        summary = report_from(sim, policy, policy.threshold, history, live.elapsed())
    finally:
        history.close()
    show_stability(report, [summary], "builtin:demo")
    return EXIT_OK


#: Wall seconds a demo on a terminal is spread over (``--seconds``, ``--fast``).
DEMO_PACE = 8.0


def _show_address(report: Report, address: str, loopback: bool, pace: float) -> None:
    how_long = f"about {pace:g} s" if pace > 0 else "as fast as it computes"
    report.line(
        f"dashboard: http://{address}/ — served while the demo runs ({how_long}; "
        "--seconds 120 leaves time to watch it)"
    )
    if not loopback:
        report.line(
            f"warning: {address} is not a loopback address: other hosts may connect", "yellow"
        )


class LiveView:
    """Node loads as bars, refreshed as the simulation runs; migrations printed as they happen."""

    def __init__(self, report: Report, sim: Simulator, *, pace: float) -> None:
        self.report = report
        self.sim = sim
        self.pace = pace
        self._live: Live | None = None
        self._started = time.perf_counter()
        self._last_print = -1.0

    def elapsed(self) -> float:
        return time.perf_counter() - self._started

    def start(self) -> None:
        self._started = time.perf_counter()
        if self.report.rich:
            self._live = Live(self._table(), console=self.report.console, refresh_per_second=8)
            self._live.start()
        else:
            self._print_loads()

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.stop()
        else:
            self._print_loads()

    def _table(self) -> Table:
        now = self.sim.node_fractions()
        names, cpu, memory = now.names, now.cpu, now.memory
        hours = self.sim.now() / 3600
        table = Table(
            title=f"simulated time {hours:5.1f} h   spread: cpu "
            f"{100 * _spread(cpu):.1f} pp, memory {100 * _spread(memory):.1f} pp",
            show_edge=False,
            header_style="bold",
        )
        table.add_column("node")
        table.add_column("cpu", justify="left")
        table.add_column("", justify="right")
        table.add_column("memory", justify="left")
        table.add_column("", justify="right")
        for name, c, m in zip(names, cpu, memory, strict=True):
            table.add_row(name, bar(c), f"{100 * c:.0f} %", bar(m), f"{100 * m:.0f} %")
        return table

    def _print_loads(self) -> None:
        now = self.sim.node_fractions()
        names, cpu, memory = now.names, now.cpu, now.memory
        self.report.line(
            f"t={self.sim.now() / 3600:5.1f} h  spread cpu {100 * _spread(cpu):.1f} pp, "
            f"memory {100 * _spread(memory):.1f} pp  |  "
            + "  ".join(f"{n} {100 * m:.0f}%" for n, m in zip(names, memory, strict=True))
        )

    def cycle(self, cycle: Cycle) -> None:
        if self._live is not None:
            self._live.update(self._table())
        elif self.sim.now() - self._last_print >= 3 * 3600:
            self._last_print = self.sim.now()
            self._print_loads()
        if self.pace > 0:
            # Spread the run over about ``pace`` seconds so the convergence can be watched: the
            # pause comes after the cycle, with the migrations it started in flight.
            share = self.sim.now() / max(self.sim.end, 1.0)
            ahead = share * self.pace - self.elapsed()
            if ahead > 0:
                time.sleep(min(ahead, 1.0))

    def event(self, event: Event) -> None:
        if event.kind in ("started", "replanned"):
            return
        stamp = f"{event.at / 3600:5.1f} h"
        line = f"{stamp}  {event}"
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False)
        else:
            self.report.line(line)


def _spread(values: Sequence[float]) -> float:
    return (max(values) - min(values)) if len(values) > 1 else 0.0


def add_demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="the controller in active mode against a simulated cluster, live (built-in scenario)",
    )
    p.add_argument("--days", type=_days, help="simulated days (default: the scenario's)")
    p.add_argument(
        "--fast", action="store_true", help="do not pace the run (the default off a terminal)"
    )
    p.add_argument(
        "--seconds",
        type=_seconds,
        metavar="S",
        help=f"spread the run over about S seconds of wall time (default {DEMO_PACE:g} on a "
        "terminal, else as fast as it computes)",
    )
    p.add_argument(
        "--listen",
        type=_listen,
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where to serve the dashboard, /metrics and /healthz while the demo runs "
        "(default 127.0.0.1:0: a free loopback port; the address is printed)",
    )
    p.add_argument("--no-dashboard", action="store_true", help="serve no dashboard")
    p.set_defaults(func=cmd_demo)


def _seconds(text: str) -> float:
    value = parse_number(text)
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError("must be from 0 to 86400 seconds")
    return value


def _listen(text: str) -> HttpConfig:
    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
