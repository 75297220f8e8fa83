"""What ``opendrs run`` tells Prometheus and a health check, updated as the daemon goes.

:class:`DaemonMetrics` is fed by the controller's hooks — ``on_cycle`` after each cycle,
``on_event`` for each migration event — in the daemon's thread, and read by the HTTP server's
threads (:mod:`opendrs.controller.http_server`). Its metrics live in a registry of their own (not
the client library's global one), so that two daemons in one process, or tests, never share them.
``docs/operations.md`` lists the metrics and suggests alert rules.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from opendrs.controller.executor import Event
from opendrs.controller.loop import Controller, Cycle
from opendrs.controller.views import FailoverWatch, stuck_rows
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster

__all__ = ["DaemonMetrics"]

#: The migration events counted by outcome (``started`` is counted apart).
OUTCOMES: Final = ("done", "failed", "lost")
#: Buckets of the cycle duration, in seconds (a cycle of a large cluster takes seconds).
_CYCLE_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _NodeLoads(Collector):
    """``opendrs_node_load``: each node's load per resource in the last observation decided on,
    as a fraction of its capacity less reserves — only the nodes of that observation."""

    def __init__(self) -> None:
        self.loads: tuple[tuple[str, str, float], ...] = ()

    def update(self, cluster: Cluster) -> None:
        fractions = LoadModel.build(cluster).fractions()
        self.loads = tuple(
            (node.name, resource, float(fractions[i, k]))
            for i, node in enumerate(cluster.nodes)
            for k, resource in enumerate(RESOURCES)
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "opendrs_node_load",
            "Load of a node per resource, as a fraction of its capacity less reserves, in the "
            "last observation the daemon decided on",
            labels=("node", "resource"),
        )
        for node, resource, value in self.loads:
            family.add_metric((node, resource), value)
        yield family


class DaemonMetrics:
    """The daemon's metrics and health, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.node_loads = _NodeLoads()
        r.register(self.node_loads)
        self.spread = Gauge(
            "opendrs_spread", "The policy metric's value in the last decision", registry=r
        )
        self.threshold = Gauge(
            "opendrs_threshold", "The policy's threshold: the spread it acts above", registry=r
        )
        self.decisions = Counter(
            "opendrs_decisions", "Decisions made, by code", ("code",), registry=r
        )
        self.migrations = Counter(
            "opendrs_migrations", "Migrations ended, by outcome", ("outcome",), registry=r
        )
        for outcome in OUTCOMES:
            self.migrations.labels(outcome)
        self.started = Counter("opendrs_migrations_started", "Migrations started", registry=r)
        self.in_flight = Gauge("opendrs_migrations_in_flight", "Migrations in flight", registry=r)
        self.cycle_seconds = Histogram(
            "opendrs_cycle_duration_seconds",
            "Wall time of a cycle: observe, decide, hand the plan over",
            buckets=_CYCLE_BUCKETS,
            registry=r,
        )
        self.observation_errors = Counter(
            "opendrs_observation_errors", "Observations of the cluster that failed", registry=r
        )
        self.platform_balancer = Gauge(
            "opendrs_platform_balancer",
            "1 while Proxmox VE balances its HA guests itself (ha-auto-rebalance), which opendrs "
            "then leaves to it; 0 otherwise",
            registry=r,
        )
        self.stuck = Gauge(
            "opendrs_stuck_guests",
            "Guests the last decision leaves breaking a hard constraint: on a node in "
            "maintenance, or a repair that cannot be made (each named at WARNING)",
            registry=r,
        )
        self.left_in_maintenance = Gauge(
            "opendrs_maintenance_stuck_guests",
            "Of opendrs_stuck_guests, those on a node in maintenance: they may not move, or no "
            "node can take them",
            registry=r,
        )
        self.failover = Gauge(
            "opendrs_failover_headroom",
            "1 while every HA guest can restart if any node fails (any keep_failover nodes), 0 "
            "when some cannot",
            registry=r,
        )
        self.unrestartable = Gauge(
            "opendrs_failover_unrestartable_guests",
            "HA guests that could not restart on the nodes left in the worst node failure",
            registry=r,
        )
        self._failover = FailoverWatch()
        self.last_observation = Gauge(
            "opendrs_last_observation_timestamp_seconds",
            "Unix time of the last successful observation",
            registry=r,
        )
        self.standby = Gauge(
            "opendrs_standby",
            "1 while this instance stands by (leader_only: another node leads), else 0",
            registry=r,
        )
        self._controller: Controller | None = None
        #: When the last cycle succeeded, on the backend clock's ``monotonic`` time (a step of
        #: the wall clock makes the daemon no less healthy), and the last cycle's error.
        self._last_success: float | None = None
        self._last_error: str | None = None

    def follow(self, controller: Controller) -> None:
        """Read the threshold, the interval, the clock and the migrations of ``controller``."""
        self._controller = controller
        self.threshold.set(controller.policy.threshold)

    # -- the daemon's hooks (its thread) ---------------------------------------------------------

    def cycle(self, cycle: Cycle) -> None:
        """``Controller.on_cycle``."""
        self.cycle_seconds.observe(cycle.seconds)
        self._last_error = cycle.error
        if cycle.error is not None:
            self.observation_errors.inc()
            return
        if self._controller is not None:
            self._last_success = self._controller.clock.monotonic()
        self.last_observation.set(time.time())
        if cycle.cluster is not None:
            self.platform_balancer.set(1 if cycle.cluster.ha_auto_rebalance else 0)
            self._failover_headroom(cycle)
        if cycle.decision is not None and cycle.cluster is not None:
            self.node_loads.update(cycle.cluster)
            self.spread.set(cycle.decision.metric)
            self.decisions.labels(cycle.decision.code).inc()
            rows = stuck_rows(cycle.cluster, cycle.stuck)
            self.stuck.set(len(rows))
            self.left_in_maintenance.set(sum(1 for row in rows if row["maintenance"]))
        if self._controller is not None:
            self.threshold.set(self._controller.policy.threshold)
            self.in_flight.set(len(self._controller.executor.in_flight))
            self.standby.set(self._controller.standing_by is not None)

    def _failover_headroom(self, cycle: Cycle) -> None:
        assert cycle.cluster is not None
        policy = self._controller.policy if self._controller is not None else None
        keep = policy.keep_failover if policy is not None else 0
        recovery = policy.failover_recovery if policy is not None else "auto"
        decided = cycle.decision.state.failover if cycle.decision is not None else None
        check = self._failover.update(cycle.cluster, cycle.at, keep, decided, recovery)
        if check is not None:
            self.failover.set(1 if check.ok else 0)
            self.unrestartable.set(check.unrestartable)

    def event(self, event: Event) -> None:
        """``Executor.on_event``."""
        if event.kind == "started":
            self.started.inc()
        elif event.kind in OUTCOMES:
            self.migrations.labels(event.kind).inc()
        if self._controller is not None and event.kind in ("started", *OUTCOMES):
            self.in_flight.set(len(self._controller.executor.in_flight))

    # -- read by the HTTP server (its threads) ---------------------------------------------------

    def health(self) -> str | None:
        """``None`` when the last successful cycle is at most two intervals old (on the
        backend clock's monotonic time), else why not, in one line."""
        controller = self._controller
        if controller is None or self._last_success is None:
            error = self._last_error
            return f"no successful cycle yet{f': {error}' if error else ''}"
        interval = controller.policy.interval
        age = controller.clock.monotonic() - self._last_success
        if age <= 2 * interval:
            return None
        why = f"the last cycle failed: {self._last_error}" if self._last_error else "no cycle since"
        return f"no successful cycle for {age:.0f} s (interval {interval:g} s): {why}"
