"""The daemon of ``opendrs run`` — configuration, lock, history, signals, logging — run by
:mod:`.run_command`."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from opendrs.backends.base import Backend, BackendError, Clock, RenewsSecret
from opendrs.backends.sim import Simulator
from opendrs.cli.daemon_signals import DaemonSignals
from opendrs.cli.process import (
    EXIT_LASTING,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    setup_logging,
)
from opendrs.controller.config import (
    Config,
)
from opendrs.controller.dashboard import Dashboard
from opendrs.controller.decision_log import DecisionLog, DecisionLogError
from opendrs.controller.history import History
from opendrs.controller.history_file import HistoryError
from opendrs.controller.http_server import HttpError, MetricsServer, start_server
from opendrs.controller.http_write import DashboardWriter
from opendrs.controller.loop import Controller, InstanceLock, LockError
from opendrs.controller.metrics import DaemonMetrics
from opendrs.controller.place_api import PlaceView

log = logging.getLogger("opendrs")

T = TypeVar("T")


def each(*hooks: Callable[[T], None] | None) -> Callable[[T], None]:
    """One hook that calls each of ``hooks`` in turn (``None`` ones left out)."""
    called = [hook for hook in hooks if hook is not None]

    def call(value: T) -> None:
        for hook in called:
            hook(value)

    return call


class CannotStart(Exception):
    """The daemon cannot start: ``str()`` is the one-line error, ``status`` the exit status."""

    def __init__(self, reason: Exception, status: int) -> None:
        super().__init__(str(reason))
        self.status = status


@dataclass(frozen=True)
class DaemonFiles:
    """The files the daemon holds while it runs: the instance lock, the decision log and the
    history (whose decisions the log records)."""

    lock: InstanceLock
    decisions: DecisionLog
    history: History

    def close(self) -> None:
        """Close the history and the decision log, then release the lock."""
        self.history.close()
        self.decisions.close()
        self.lock.release()


def open_files(config: Config) -> DaemonFiles:
    """Take the instance lock, open the decision log, then the history; when one cannot be
    opened, those opened before it are closed and :class:`CannotStart` says why."""
    try:
        lock = InstanceLock(config.lock, config.history)
        lock.acquire()
    except LockError as exc:
        raise CannotStart(exc, EXIT_LASTING if exc.lasting else EXIT_PROBLEM) from None
    try:
        decisions = DecisionLog(config.decision_log)
    except DecisionLogError as exc:
        lock.release()
        raise CannotStart(exc, EXIT_USAGE) from None
    try:
        history = History(config.history)
    except HistoryError as exc:
        decisions.close()
        lock.release()
        raise CannotStart(exc, EXIT_PROBLEM if exc.passing else EXIT_LASTING) from None
    history.listen(decisions.record)
    return DaemonFiles(lock, decisions, history)


@dataclass(frozen=True)
class Published:
    """What the daemon shows of itself: its metrics, and with an http section the dashboard, the
    view ``POST /api/place`` answers from and the server serving them (``None`` without one)."""

    metrics: DaemonMetrics
    dashboard: Dashboard | None
    server: MetricsServer | None
    place: PlaceView | None = None


def start_serving(config: Config, files: DaemonFiles) -> Published:
    """The metrics and dashboard, served when the configuration has an http section; when the
    server cannot start, ``files`` are closed and :class:`CannotStart` says why."""
    metrics = DaemonMetrics()
    if config.http is None:
        return Published(metrics, None, None)
    dashboard = Dashboard(config)
    place = PlaceView()
    try:
        server = start_server(config.http, metrics, dashboard, place, dashboard_writer(config))
    except HttpError as exc:
        files.close()
        raise CannotStart(exc, EXIT_USAGE if exc.usage else EXIT_PROBLEM) from None
    return Published(metrics, dashboard, server, place)


@dataclass(frozen=True)
class DaemonRun:
    """One ``opendrs run``, its files open and its server started: ``once``, ``shadow`` and
    ``verbose`` are its ``--once``, ``--shadow`` and ``--verbose``."""

    config: Config
    signals: DaemonSignals
    files: DaemonFiles
    published: Published
    once: bool
    shadow: bool
    verbose: bool = False

    def run(self) -> int:
        """Make the backend and run the controller (the signals caught since the command began):
        the exit status. Whatever happens, the server is stopped (its requests answered or cut),
        the signals are given back and everything opened is closed."""
        backend = None
        try:
            backend, clock = self.config.make_backend(should_stop=lambda: self.signals.stop)
            return self.control(backend, clock)
        except BackendError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_PROBLEM
        except HistoryError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_PROBLEM if exc.passing else EXIT_LASTING
        finally:
            # The server first: its requests end while the signals are still caught (an
            # approval wakes the daemon with SIGUSR1, whose default would kill it); while a
            # request cut still computes, SIGHUP and SIGUSR1 stay ignored.
            server = self.published.server
            if server is not None:
                server.stop()
            self.signals.restore(ignore_wakes=server is not None and server.computing() > 0)
            if backend is not None:
                backend.close()
            self.files.close()

    def control(self, backend: Backend, clock: Clock) -> int:
        """Log the start, run the controller until it stops (or one cycle): the exit status."""
        controller = self.controller(backend, clock)
        log.info(
            "opendrs %s: %s backend, %s mode, policy %s (strategy %s)%s",
            "one cycle" if self.once else "started",
            backend.name,
            controller.config.mode,
            self.config.policy.name,
            self.config.policy.strategy,
            _what_migrates(controller.config),
        )
        until = backend.end if isinstance(backend, Simulator) else None
        controller.run(
            once=self.once,
            until=until,
            should_stop=lambda: self.signals.stop,
            take_reload=lambda: self.take_reload(backend),
            reload_pending=lambda: self.signals.reload,
            take_wake=self.signals.take_wake,
            wake_pending=lambda: self.signals.wake,
        )
        return self.exit_status(controller)

    def controller(self, backend: Backend, clock: Clock) -> Controller:
        """The controller on ``backend``, its events and cycles fed to the metrics and the
        dashboard, which follow it."""
        published = self.published
        dashboard = published.dashboard
        controller = Controller(
            self.config,
            backend,
            clock,
            self.files.history,
            force_shadow=self.shadow,
            # Between a signal and its handling nothing starts (the file may say shadow now), not
            # even a start whose request is about to be sent: its reads are given up on.
            hold_starts=self.signals.holding,
            on_event=each(published.metrics.event, dashboard and dashboard.event),
            on_cycle=each(
                published.metrics.cycle,
                dashboard and dashboard.cycle,
                published.place and published.place.cycle,
            ),
        )
        published.metrics.follow(controller)
        if dashboard is not None:
            dashboard.follow(controller)
        return controller

    def take_reload(self, backend: Backend) -> Config | None:
        """The configuration a SIGHUP asked for, if any: the backend's secret read again (a
        reload whose secret cannot be read is refused whole, as a file with an error is), the
        log's level set (debug still, with ``--verbose``), the decision log opened again with
        it, a change of the http section warned about (it waits for a restart), and last, once
        nothing can refuse the reload, the secret read taken into use."""
        fresh = self.signals.take_reload()
        if fresh is None:
            return None
        take_secret = self._secret_read(backend)
        if take_secret is None:
            return None
        setup_logging("debug" if self.verbose else fresh.log_level)
        decisions = self.files.decisions
        server = self.published.server
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
        take_secret()
        return fresh

    def _secret_read(self, backend: Backend) -> Callable[[], None] | None:
        """The backend's secret (a renewed API token) read again, where it has one: the
        function that takes it into use. A secret that cannot be read refuses the reload with
        one line naming the running configuration's file and setting (``None``); the one read
        before stays."""
        if not isinstance(backend, RenewsSecret):
            return lambda: None
        try:
            return backend.read_secret()
        except BackendError as exc:
            log.error(
                "reload refused, keeping the running configuration: %s: %s", self.config.file, exc
            )
            return None

    def exit_status(self, controller: Controller) -> int:
        """0 when stopped or done; with ``--once``, 1 (and why) when the cluster could not be
        observed."""
        if self.signals.stop:
            log.info("stopping: state recorded; migrations in flight are followed after restart")
        elif self.once and controller.cycles and controller.cycles[-1].error is not None:
            print(
                f"error: cannot observe the cluster: {controller.cycles[-1].error}",
                file=sys.stderr,
            )
            return EXIT_PROBLEM
        return EXIT_OK


def _what_migrates(config: Config) -> str:
    """What the start line adds about migrations: nothing in active mode."""
    if config.mode == "manual":
        return f" — {config.manual_words()}"
    return "" if config.active else " — nothing will be migrated"


def dashboard_writer(config: Config) -> DashboardWriter | None:
    """What the dashboard may change (``http.write``), or ``None``: it stays read-only."""
    if config.http is None or not config.http.write:
        return None
    return DashboardWriter(
        config.history, f"{config.http.token_name}@http", decision_log=config.decision_log
    )
