"""``opendrs demo``: the controller in active mode against the built-in demo scenario, live on the
terminal and on the dashboard."""

from __future__ import annotations

import argparse
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opendrs.cli.arguments import Subcommands, parse_number, simulated_days
from opendrs.cli.process import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    end_without_waiting_for,
)

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

    from opendrs.backends.sim import Simulator
    from opendrs.cli.simulate import StabilityReport
    from opendrs.controller.config import HttpConfig
    from opendrs.controller.executor import Event
    from opendrs.controller.http_server import MetricsServer
    from opendrs.controller.loop import Controller, Cycle
    from opendrs.report.text import Report


def cmd_demo(args: argparse.Namespace) -> int:
    """The controller in active mode against the built-in demo scenario, live — and on the
    dashboard while it runs."""
    # imported when the demo runs: the simulator, the controller, its server and rich are large,
    # and every other command would pay for them when the parser is built
    from rich.console import Console

    from opendrs.backends.sim import Simulator, builtin_scenario
    from opendrs.cli.daemon import each
    from opendrs.cli.simulate import report_from, simulated_config
    from opendrs.cli.simulate_command import quiet_logs
    from opendrs.controller.config import BackendConfig
    from opendrs.controller.dashboard import Dashboard
    from opendrs.controller.history import History
    from opendrs.controller.http_server import HttpError, start_server
    from opendrs.controller.loop import Controller
    from opendrs.controller.metrics import DaemonMetrics
    from opendrs.engine.policy import PRESETS
    from opendrs.report.text import Report

    quiet_logs()  # the live view prints every migration and failure itself
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
        end_without_waiting_for(server.computing)
        _show_address(report, server.address, args.listen.loopback, pace)
    try:
        _run(controller, sim.end, live, server)
        summary = report_from(sim, policy, policy.threshold, history, live.elapsed())
    finally:
        history.close()
    show_summary(report, summary)
    return EXIT_OK


def _run(controller: Controller, end: float, live: LiveView, server: MetricsServer | None) -> None:
    """The controller up to the simulated time ``end``, live; the dashboard's server stopped
    after it."""
    live.start()
    try:
        controller.run(until=end)
    finally:
        live.stop()
        if server is not None:
            _stop_serving(server)


def _stop_serving(server: MetricsServer) -> None:
    """Stop the dashboard's server, a Ctrl-C meanwhile held until it has stopped: one raised in
    its wait for a request would leave that request's thread looking ended while it still draws
    (the exit would not know to leave it). A request still computing after the stop is left:
    the process ends without waiting for it
    (:func:`~opendrs.cli.process.end_without_waiting_for`)."""
    if threading.current_thread() is not threading.main_thread():
        server.stop()  # signals reach the main thread alone: nothing to hold
        return
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, _frame: interrupted.append(number))
    try:
        server.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted and callable(previous):
        previous(signal.SIGINT, None)  # Python's own handler: KeyboardInterrupt, now


def show_summary(report: Report, r: StabilityReport) -> None:
    """The demo's run in a few lines, each figure with what it means (``simulate`` compares
    policies in a table; one policy reads better as sentences)."""
    days = f"{r.days:g} simulated day{'' if r.days == 1 else 's'}"
    report.heading(f"What opendrs did over {days} of the demo cluster")
    spread = f"{100 * r.threshold:g} pp"
    failed = f"{r.failed_migrations} failed (simulated failures)"
    lines = [
        f"{r.migrations} migrations ({r.repair_migrations} of them repairs), {failed}, "
        f"{r.failures_moved_later} of those guests moved later",
        f"{r.ping_pongs} ping-pongs: guests taken back to a node they left less than 24 h before",
        f"the spread (busiest node's load less the idlest's) averaged {100 * r.mean_imbalance:.1f} "
        f"pp, and was above the {spread} threshold {r.pct_time_above_threshold:.1f} % of the time "
        "(the cluster starts packed onto a few nodes)",
        f"the busiest node peaked at {100 * r.max_node_load:.0f} % (95 % of the time at most "
        f"{100 * r.p95_node_load:.0f} %); {r.hot_node_minutes:,.0f} node-minutes above "
        f"{100 * r.hot:g} %",
        f"{r.capacity_violations} capacity violations: no node was ever over a hard limit"
        if r.capacity_violations == 0
        else f"{r.capacity_violations_shown} capacity violations (node-steps over a hard "
        "limit, by whose they are: opendrs's moves, the platform's HA, the placement, the "
        "guests' own load)",
        f"{r.wall_seconds:.1f} s of wall time; 'opendrs simulate' compares policies over a month",
    ]
    width = max(40, report.console.width)
    for line in lines:
        report.line(textwrap.fill(line, width, initial_indent="  ", subsequent_indent="    "))


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
            from rich.live import Live  # imported when the demo runs, as in cmd_demo

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
        from rich.table import Table  # imported when the demo runs, as in cmd_demo

        from opendrs.report.text import bar

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
        spread = (
            f"t={self.sim.now() / 3600:5.1f} h  spread cpu {100 * _spread(cpu):.1f} pp, "
            f"memory {100 * _spread(memory):.1f} pp"
        )
        loads = "memory: " + "  ".join(
            f"{n} {100 * m:.0f}%" for n, m in zip(names, memory, strict=True)
        )
        if len(spread) + 3 + len(loads) <= self.report.console.width:
            self.report.line(f"{spread} | {loads}")
        else:  # the nodes' loads on a line of their own: the console is narrower
            self.report.line(spread)
            self.report.line(f"{'':11}{loads}")

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
        line = f"{stamp}  {event.describe(self.sim.scenario.cluster.guest_label)}"
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False)
        else:
            self.report.line(line)


def _spread(values: Sequence[float]) -> float:
    return (max(values) - min(values)) if len(values) > 1 else 0.0


def add_demo_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "demo",
        help="the controller in active mode against a simulated cluster, live (built-in scenario)",
        description="Run the controller in active mode against the built-in demo cluster (8 "
        "nodes, 80 guests packed onto a few of them, a day of office-hours load, 2 % of "
        "migrations failing): on a terminal a live table of node loads converges while the "
        "migrations print, paced to about eight seconds; elsewhere as fast as it computes. A "
        "summary ends it. Nothing real is touched.",
    )
    p.add_argument("--days", type=simulated_days, help="simulated days (default: the scenario's)")
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
    from opendrs.controller.config import parse_listen  # imported when the option is read

    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
