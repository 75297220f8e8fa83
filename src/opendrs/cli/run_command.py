"""``opendrs run``: the daemon's command — configuration, lock, history, signals, logging."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

from opendrs.backends.base import BackendError
from opendrs.backends.sim import Simulator
from opendrs.cli.arguments import Subcommands
from opendrs.cli.process import (
    EXIT_LASTING,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    setup_logging,
)
from opendrs.controller.config import (
    Config,
    load_config,
)
from opendrs.controller.dashboard import Dashboard
from opendrs.controller.decision_log import DecisionLog, DecisionLogError
from opendrs.controller.history import History
from opendrs.controller.history_file import HistoryError
from opendrs.controller.http_server import HttpError, start_server
from opendrs.controller.loop import Controller, InstanceLock, LockError
from opendrs.controller.metrics import DaemonMetrics
from opendrs.model.document import DocumentError

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


def add_run_parser(sub: Subcommands) -> None:
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
