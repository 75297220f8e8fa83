"""``opendrs status --config FILE``: the cluster now, and what the daemon knows and is doing.

Four parts, each read without disturbing a running daemon:

- the cluster, observed once through the configured backend as the daemon observes it
  (:func:`opendrs.cli.snapshot_command.observe_once`): each node's load per resource, and
  the spread per CPU architecture where the usable nodes have several; the rules it drops or
  ignores (also a ``warning: rules:`` line each on standard error); its failover headroom
  (:mod:`opendrs.engine.headroom`, for ``policy.keep_failover`` nodes failing, one when off)
  with each failure that leaves HA guests unable to restart; and what a repair of it
  leaves breaking a hard constraint (:func:`opendrs.engine.policy.stuck_now`) — every guest
  left on a node in maintenance that may not move or that no node can take;
- the daemon: whether another process holds its lock (:meth:`InstanceLock.probe`, which never
  keeps the lock);
- from the history, opened read-only: the last decision with its code and reason, the migrations
  in flight, the guests in cooldown and the targets guests are kept off, with until when.

A part that cannot be read is said in one line and the others are still shown. Times are the
backend's clock; *now* is the wall clock, or for the simulator the latest time in the history
(:func:`opendrs.cli.history_command.history_now`).

Exit status: 0 everything read; 1 the cluster could not be observed, or the history or the lock
could not be read (the rest is shown); 2 a bad configuration or option.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console

from opendrs.backends.base import Backend, BackendError, Standby
from opendrs.cli.arguments import Subcommands
from opendrs.cli.config_file import add_config_option
from opendrs.cli.history_command import history_now, open_history
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, setup_logging
from opendrs.cli.snapshot_command import observe_once
from opendrs.controller.history_file import HistoryError
from opendrs.engine.constraints import check_rules
from opendrs.engine.headroom import Headroom, failover_headroom
from opendrs.engine.policy import stuck_now
from opendrs.engine.policy.config import metric_text
from opendrs.engine.policy.failover import recovery_for
from opendrs.engine.policy.windows import schedule_now
from opendrs.engine.usage import RESOURCES
from opendrs.json_data import iso_time, json_text
from opendrs.model.cluster import Cluster, guest_label
from opendrs.model.units import format_duration
from opendrs.records import Avoid, Cooldown, decision_object, migration_now
from opendrs.report.headroom import case_line
from opendrs.report.text import BAR_WIDTH, Report, bar, show_stuck

if TYPE_CHECKING:
    from opendrs.controller.config import Config


__all__ = [
    "Status",
    "add_status_parser",
    "cmd_status",
    "read_status",
]


@dataclass
class Status:
    """What ``opendrs status`` found; each part ``None`` with its ``*_error`` when unreadable."""

    config: Config
    cluster: Cluster | None = None
    observe_error: str | None = None
    #: What a repair of the observed cluster leaves breaking a hard constraint, with why.
    stuck: tuple[tuple[str, str], ...] = ()
    now: float | None = None
    history_error: str | None = None
    #: The history file does not exist yet (the daemon never ran): not an error.
    no_history: bool = False
    last_decision: dict[str, Any] | None = None
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    #: Manual mode's proposals waiting for approval (their ids).
    proposals: list[str] = field(default_factory=list)
    cooldowns: list[Cooldown] = field(default_factory=list)
    avoid: list[Avoid] = field(default_factory=list)
    lock_held: bool | None = None
    lock_pid: int | None = None
    #: Another process holds the history file but not this lock file: a daemon that runs on
    #: this history with another configuration's lock.
    history_held: bool = False
    lock_error: str | None = None
    #: Why a daemon here stands by (``leader_only``: another node leads), as the backend says.
    standby: str | None = None
    #: The failover headroom of the observed cluster, for ``policy.keep_failover`` nodes failing
    #: (one when off); None when it has too few online nodes.
    failover: Headroom | None = None
    #: The guests' names the history recorded (the observed cluster's, where it has them).
    names: dict[str, str] = field(default_factory=dict)

    def label(self, guest: str) -> str:
        """A guest as the operator knows it: ``name (id)``."""
        if self.cluster is not None and guest in self.cluster.guest_index:
            return self.cluster.guest_label(guest)
        return guest_label(guest, self.names.get(guest, ""))

    @property
    def problem(self) -> bool:
        return any((self.observe_error, self.history_error, self.lock_error))


def read_status(config: Config) -> Status:
    """Observe the cluster, read the history (read-only) and probe the lock."""
    # imported when the command runs: the controller is large
    from opendrs.controller.loop import InstanceLock, LockError

    status = Status(config)
    try:
        status.cluster = observe_once(config, then=lambda backend: _standby(status, backend))
    except BackendError as exc:
        status.observe_error = str(exc)
    else:
        status.stuck = stuck_now(status.cluster)
        failures = max(config.policy.keep_failover, 1)
        if failures < sum(1 for n in status.cluster.nodes if n.online):
            recovery = recovery_for(config.policy.failover_recovery, status.cluster)
            status.failover = failover_headroom(status.cluster, failures, recovery)
    _read_history(status)
    try:
        lock = InstanceLock(config.lock, config.history)
        status.lock_held, status.lock_pid = lock.probe()
        status.history_held = not status.lock_held and lock.history_held()
    except LockError as exc:
        status.lock_error = str(exc)
    return status


def _standby(status: Status, backend: Backend) -> None:
    """Why a daemon with this configuration stands by now (the backend's ``standby``)."""
    status.standby = backend.standby() if isinstance(backend, Standby) else None


def _read_history(status: Status) -> None:
    config = status.config
    if not os.path.lexists(config.history):
        status.no_history = True
        return
    try:
        history = open_history(config)
    except HistoryError as exc:
        status.history_error = str(exc)
        return
    try:
        with history:
            status.names = history.guest_names()
            now = history_now(config, history)
            last = history.decisions(limit=1)
            status.last_decision = decision_object(last[0]) if last else None
            status.in_flight = [migration_now(m) for m in history.in_flight()]
            status.proposals = [p.id for p in history.proposals("open")]
            status.cooldowns = history.cooldown_entries(now)
            status.avoid = history.avoid_entries(now)
            status.now = now
    except HistoryError as exc:
        status.history_error = str(exc)


def _until(entry: Cooldown | Avoid) -> dict[str, Any]:
    data: dict[str, Any] = {"guest": entry.guest}
    if isinstance(entry, Avoid):
        data["node"] = entry.node
    data.update(until=entry.until, time=iso_time(entry.until), reason=entry.reason)
    return data


def status_data(status: Status) -> dict[str, Any]:
    """The JSON document of ``opendrs status --format json``."""
    # imported when the command runs: the controller is large
    from opendrs.controller.views import (
        arch_spreads,
        cluster_summary,
        node_loads,
        policy_summary,
        stuck_rows,
    )

    cluster = status.cluster
    config = status.config
    return {
        "cluster": None
        if cluster is None
        else {
            **cluster_summary(cluster),
            "mode": cluster.settings.mode,
            "nodes": node_loads(cluster),
            "spread": arch_spreads(cluster),
            "stuck": stuck_rows(cluster, status.stuck),
            "rules": [{"problem": str(p), "ignored": p.ignored} for p in check_rules(cluster)[1]],
            "failover": None if status.failover is None else status.failover.brief(),
        },
        "observation": {"ok": cluster is not None, "error": status.observe_error},
        "policy": policy_summary(config),
        # The windows at the history's time (the simulator's clock), else the wall clock.
        "windows": schedule_now(
            config.policy.schedule, time.time() if status.now is None else status.now
        ),
        "daemon": {
            "lock": config.lock,
            "running": status.lock_held or status.history_held
            if status.lock_held is not None
            else None,
            "pid": status.lock_pid,
            "error": status.lock_error,
            "standby": status.standby,
        },
        "history": {
            "path": config.history,
            "exists": not status.no_history,
            "error": status.history_error,
            "now": status.now,
            "last_decision": status.last_decision,
            "in_flight": status.in_flight,
            "proposals": status.proposals,
            "cooldowns": [_until(c) for c in status.cooldowns],
            "avoid": [_until(a) for a in status.avoid],
        },
    }


def show_status(report: Report, status: Status) -> None:
    """The four parts as text: cluster, daemon, last decision, migrations and holds."""
    data = status_data(status)
    _show_cluster(report, status)
    show_stuck(report, status.stuck)
    policy = data["policy"]
    when = (
        "the strategy judges when to act"
        if policy["metric"] == "none"
        else f"acts when the {policy['metric']} is above "
        f"{metric_text(policy['threshold'], policy['metric'])}"
    )
    report.line(
        f"policy {policy['name']}, {policy['mode']} mode in the file: every "
        f"{format_duration(policy['interval'])}, {when} (strategy {policy['strategy']}, "
        f"target {metric_text(policy['target'], 'spread')})"
    )
    _show_windows(report, data["windows"])
    report.heading("Daemon")
    daemon = data["daemon"]
    if daemon["error"] is not None:
        report.line(f"cannot tell whether it runs: {daemon['error']}", "red")
    elif daemon["running"] and status.history_held:
        report.line(
            f"running: a daemon holds the history {status.config.history} (with another lock file "
            f"than {daemon['lock']})",
            "green",
        )
    elif daemon["running"]:
        who = f" (pid {daemon['pid']})" if daemon["pid"] is not None else ""
        report.line(f"running{who}: it holds {daemon['lock']}", "green")
    else:
        report.line(f"not running: nothing holds {daemon['lock']}", "yellow")
    if daemon["standby"] is not None:
        report.line(f"standing by: {daemon['standby']}", "yellow")
    _show_history(report, status, data["history"])


def _show_windows(report: Report, windows: dict[str, Any] | None) -> None:
    """The migration windows, and whether each activity they apply to may start one now."""
    if windows is None:
        return
    report.line(f"windows: {windows['summary']}")
    for activity, now in windows["now"].items():
        if now["open"]:
            report.line(f"  {activity}: open now", "green")
            continue
        opens = now["opens_text"] or "not within a year"
        report.line(f"  {activity}: closed now ({now['closed']}); next opens {opens}", "yellow")


def _show_cluster(report: Report, status: Status) -> None:
    # imported when the command runs: the controller is large
    from opendrs.controller.views import arch_spreads, cluster_summary, node_loads

    cluster = status.cluster
    if cluster is None:
        report.line(f"cannot observe the cluster: {status.observe_error}", "red")
        return
    report.line(
        f"Cluster {cluster.name}: {len(cluster.nodes)} nodes, {len(cluster.guests)} guests, "
        f"{cluster.settings.mode} load (as a share of capacity less reserves), observed through "
        f"the {status.config.backend.type} backend",
        "bold",
    )
    balancer = cluster_summary(cluster)["platform_balancer"]
    if balancer is not None:
        report.line(balancer, "yellow")
    loads = node_loads(cluster)
    bar_w = _bar_width(loads, report.console.width)
    rows = [
        [
            n["name"],
            n["state"],
            n["arch"],
            str(n["guests"]),
            *(bar(n["load"][r], bar_w) for r in RESOURCES),
        ]
        for n in loads
    ]
    report.table(("node", "state", "arch", "guests", *RESOURCES), rows, right=(3,))
    for arch, spread in arch_spreads(cluster).items():
        where = "usable nodes" if arch == "all" else f"{arch} nodes"
        report.line(
            f"spread of the {where}: "
            + ", ".join(f"{r} {100 * spread[r]:.1f} pp" for r in RESOURCES)
        )
    for problem in check_rules(cluster)[1]:
        report.wrapped(f"rules: {problem}", "yellow")
    headroom = status.failover
    if headroom is not None:
        report.line(headroom.summary(), "green" if headroom.ok else "red")
        for case in headroom.cases:
            if not case.covered:
                report.wrapped(f"  {case_line(cluster, case)}", "red")


def _bar_width(loads: list[dict[str, Any]], width: int) -> int:
    """The load bars' width in a table of ``width`` columns: what the node, state, arch and guests
    columns, the bars' percents and a rich table's " │ " between columns leave, shared by the
    resources (from 5 to :data:`BAR_WIDTH` characters each)."""
    fixed = sum(
        max([len(heading)] + [cell_len(str(n[key])) for n in loads])
        for key, heading in (("name", "node"), ("state", "state"), ("arch", "arch"))
    )
    fixed += len("guests") + len(RESOURCES) * 7 + (3 + len(RESOURCES)) * 3 + 1
    return max(5, min(BAR_WIDTH, (width - fixed) // len(RESOURCES)))


def _show_history(report: Report, status: Status, history: dict[str, Any]) -> None:
    report.heading(f"History {history['path']}")
    if status.no_history:
        report.line("no history yet: the daemon has not recorded anything", "yellow")
        return
    if history["error"] is not None:
        report.line(f"cannot read the history: {history['error']}", "red")
        return
    last = history["last_decision"]
    if last is None:
        report.line("no decision recorded yet")
    else:
        count = len(last["moves"])
        moves = f", {count} move{'' if count == 1 else 's'}" if count else ""
        report.line(
            f"last decision {last['time']} ({last['mode']}, {last['code'] or last['action']}"
            f"{moves}): {last['reason']}"
        )
    if history["proposals"]:
        ids = ", ".join(history["proposals"])
        report.line(f"waiting for approval: {ids} (opendrs proposals shows them)", "yellow")
    report.heading(f"Migrations in flight ({len(history['in_flight'])})")
    if history["in_flight"]:
        report.table(
            ("started", "guest", "from", "to", "task", "decision"),
            [
                [
                    m["time"],
                    status.label(m["guest"]),
                    m["source"],
                    m["target"],
                    m["handle"],
                    "" if m["decision"] is None else str(m["decision"]),
                ]
                for m in history["in_flight"]
            ],
        )
    report.heading(f"In cooldown ({len(history['cooldowns'])})")
    if history["cooldowns"]:
        report.table(
            ("guest", "until", "reason"),
            [[status.label(c["guest"]), c["time"], c["reason"]] for c in history["cooldowns"]],
        )
    report.heading(f"Kept off a target ({len(history['avoid'])})")
    if history["avoid"]:
        report.table(
            ("guest", "node", "until", "reason"),
            [
                [status.label(a["guest"]), a["node"], a["time"], a["reason"]]
                for a in history["avoid"]
            ],
        )


def cmd_status(args: argparse.Namespace) -> int:
    # imported when the command runs: the controller is large
    from opendrs.controller.config import load_config

    config = load_config(args.config)
    setup_logging(config.log_level)
    status = read_status(config)
    if args.format == "json":
        sys.stdout.write(json_text(status_data(status)))
    else:
        show_status(Report(Console(highlight=False, soft_wrap=False)), status)
    for problem, what in (
        (status.observe_error, "cannot observe the cluster"),
        (status.history_error, "cannot read the history"),
        (status.lock_error, "cannot tell whether the daemon runs"),
    ):
        if problem is not None:
            print(f"error: {what}: {problem}", file=sys.stderr)
    if status.cluster is not None:
        for rule_problem in check_rules(status.cluster)[1]:
            print(f"warning: rules: {rule_problem}", file=sys.stderr)
    return EXIT_PROBLEM if status.problem else EXIT_OK


def add_status_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "status",
        help="the cluster now, whether the daemon runs, its last decision, migrations in "
        "flight, cooldowns",
        description="Observe the cluster of a configuration file once, as 'opendrs run' would, "
        "and show each node's load per resource (the spread per CPU architecture where there "
        "are several); whether a daemon holds the configuration's lock (tested without keeping "
        "it); and from the history, read-only, the last decision with its code and reason, the "
        "migrations in flight, the guests in cooldown and the targets guests are kept off, with "
        "until when. Safe beside a running daemon. Exit status: 0 everything read, 1 the "
        "cluster could not be observed or the history or lock could not be read (the rest is "
        "shown), 2 a bad configuration or option.",
    )
    add_config_option(p)
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    p.set_defaults(func=cmd_status)
