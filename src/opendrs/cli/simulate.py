"""``opendrs simulate``: the controller against the simulator, one run per policy, side by side.

Every policy runs the same controller code (:class:`~opendrs.controller.loop.Controller`, in
active mode, with a history in memory) against a fresh :class:`~opendrs.backends.sim.Simulator`
of the same scenario and seed, so the runs differ only by the policy. The peers' behaviour is
emulated by their presets (:data:`opendrs.engine.policy.PRESETS`).

The stability report of a run:

* ``migrations`` / ``migrations_per_day`` — migrations the controller started (recoveries after a
  node failure are the simulated HA manager's, not counted); ``repair_migrations`` of them were
  started by a repair decision — the evacuation of a node in maintenance, the return of its guests
  when the policy brings them back, a guest moved off a node over capacity or away from a broken
  hard rule — and ``balancing_migrations`` by a balancing plan, the policy's own choice;
* ``ping_pongs`` — migrations that took a guest back to a node it had left, by a finished
  migration, less than 24 hours before;
* ``pct_time_above_threshold`` — share of the simulated steps whose imbalance (the largest spread
  of the weighted resources over the usable nodes, on node loads averaged over the simulator's
  window, 30 minutes) is above the report's threshold — the same yardstick for every policy;
* ``capacity_violations`` — (node, step) pairs over a hard capacity limit, and
  ``capacity_violations_by`` whose they are (:mod:`opendrs.backends.sim.violations`): ``moves``
  (the controller's migrations in flight: must be 0), ``platform`` (HA recovery and failback),
  ``placement`` (over a configured limit with no move in flight) and ``load`` (the guests'
  measured use over the node's capacity, no move involved);
* ``failed_migrations`` and how they were handled — ``failures_moved_later`` guests that reached
  another node afterwards, ``failures_left`` those that stayed;
* ``restart_migrations`` — migrations that were restart moves (a running container on an Incus
  scenario: stopped, moved, started again), and ``restart_downtime_minutes``, the time they kept
  their guests stopped;
* ``recoveries`` — guests the simulated HA manager restarted elsewhere after a node failure;
  ``ha_unrestartable`` — HA guests of a failed node it could not restart elsewhere when it first
  tried (no node with room, or the rules keeping them off every one), once each time their node
  fails (what ``policy.keep_failover`` keeps at 0); ``ha_held`` — HA guests of a failed node
  that may not restart elsewhere at all (local disks or devices, HA state ``ignored``; opendrs's
  ignore rules do not hold a restart), which wait for their node;
* ``failover`` (with ``--failover-check MODES``, else None) — every simulated hour each online
  node fails in turn, on a copy of the cluster, and its HA guests restart in each mode: as
  Proxmox VE's HA manager recovers them in its ``basic`` or ``static`` scheduler mode, or as the
  failover headroom check places them (``opendrs``)
  (:mod:`opendrs.backends.sim.failover_probe`): ``checks`` (hours checked), ``skipped`` (hours
  with a node down or in maintenance, not checked) and for each mode
  ``cases`` (node failures tried), ``short_cases`` (those that left an HA guest down),
  ``stranded`` (the HA guests they left down, summed), ``worst`` (the most one failure left
  down) and ``held`` (HA guests that may not start elsewhere at all, summed);
* ``max_node_load`` — the highest cpu or memory fraction of any node at any step;
* hot spots, on each online node's load — the higher of its cpu and memory fractions of capacity
  net of reserves, averaged over 5 minutes: ``hot_node_minutes``, the node-minutes above the
  report's ``hot`` level (0.85 by default), and ``max_hot_minutes_per_node``, those of the node
  with the most; ``p95_node_load``, the 95th percentile over time of the most loaded node's load.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from opendrs.backends.sim import HOT, Scenario, Simulator
from opendrs.backends.sim.failover_probe import FailoverProbe
from opendrs.controller.config import BackendConfig, Config
from opendrs.controller.executor import ExecutorConfig
from opendrs.controller.history import History
from opendrs.controller.loop import Controller
from opendrs.engine.policy import PolicyConfig
from opendrs.engine.policy.windows import Schedule

__all__ = ["PolicyTrace", "StabilityReport", "ping_pongs", "run_policy"]

DAY = 86_400.0
PING_PONG_WINDOW = DAY


@dataclass(frozen=True)
class StabilityReport:
    """How one policy behaved over a simulated period."""

    policy: str
    strategy: str
    days: float
    threshold: float
    migrations: int
    migrations_per_day: float
    repair_migrations: int
    balancing_migrations: int
    ping_pongs: int
    pct_time_above_threshold: float
    mean_imbalance: float
    capacity_violations: int
    capacity_violations_by: dict[str, int]
    failed_migrations: int
    failures_moved_later: int
    failures_left: int
    restart_migrations: int
    restart_downtime_minutes: float
    max_node_load: float
    hot: float
    hot_node_minutes: float
    max_hot_minutes_per_node: float
    p95_node_load: float
    recoveries: int
    ha_unrestartable: int
    ha_held: int
    decisions: int
    wall_seconds: float
    #: The policy's migration windows and blackouts in words (None: migrations start at any
    #: time), and when each balancing migration started (simulated seconds; the simulated
    #: clock's 0 is read as 1970-01-01 00:00 UTC), with how many of them the windows refused.
    windows: str | None = None
    balancing_starts: tuple[float, ...] = ()
    balancing_outside_windows: int = 0
    #: What the hourly node failures of ``--failover-check`` left down
    #: (:meth:`FailoverProbe.as_dict`), None without it.
    failover: dict[str, object] | None = None

    @property
    def capacity_violations_shown(self) -> str:
        """The capacity violations with whose they are: ``0``, ``2 (load 2)``, ``5 (moves 1,
        load 4)``."""
        if not self.capacity_violations:
            return "0"
        causes = ", ".join(f"{k} {v}" for k, v in self.capacity_violations_by.items() if v)
        return f"{self.capacity_violations} ({causes})"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 6)
        return out


@dataclass(frozen=True)
class PolicyTrace:
    """What one policy's run looked like over time, for the simulation's report: the imbalance
    yardstick of every simulated step, and when the controller's migrations started."""

    policy: str
    #: Seconds between two steps; ``spreads[k]`` is the yardstick at ``k * step``.
    step: float
    spreads: tuple[float, ...]
    #: Start times of the migrations the controller started, and of those that failed.
    migrations: tuple[float, ...]
    failed: tuple[float, ...]
    #: When the policy's migration windows let balancing start migrations, as (from, to)
    #: simulated seconds, each step of the run read (None: the policy has no windows).
    open_spans: tuple[tuple[float, float], ...] | None = None


def ping_pongs(records: Iterable[Any], window: float = PING_PONG_WINDOW) -> int:
    """Finished migrations that took a guest back to a node it left less than ``window`` ago.

    ``records`` need ``guest``, ``source``, ``target``, ``started``, ``ended`` and ``outcome``.
    """
    left: dict[str, list[tuple[str, float]]] = {}
    count = 0
    done = sorted((r for r in records if r.outcome == "done"), key=lambda r: (r.started, r.guest))
    for r in done:
        if any(node == r.target and r.started - at < window for node, at in left.get(r.guest, ())):
            count += 1
        left.setdefault(r.guest, []).append((r.source, r.ended))
    return count


def simulated_config(
    policy: PolicyConfig,
    label: str,
    backend: BackendConfig,
    policy_keys: frozenset[str] = frozenset(),
) -> Config:
    """The configuration of a simulated run: active mode, a history in memory, no lock;
    ``policy_keys`` the policy fields a policy file sets (the platform's defaults do not
    override them)."""
    return Config(
        file=label,
        backend=backend,
        history=":memory:",
        lock="",
        mode="active",
        policy=policy,
        executor=executor_config(policy),
        policy_keys=policy_keys,
    )


def executor_config(policy: PolicyConfig) -> ExecutorConfig:
    return ExecutorConfig(
        max_parallel=policy.max_parallel,
        max_node_inflow=policy.max_node_inflow,
        avoid_after_failure=policy.avoid_after_failure,
        cooldown=policy.cooldown,
    )


def run_policy(
    scenario: Scenario,
    policy: PolicyConfig,
    *,
    days: float | None = None,
    threshold: float = 0.15,
    hot: float = HOT,
    progress: Callable[[float, float], None] | None = None,
    policy_keys: frozenset[str] = frozenset(),
    traces: list[PolicyTrace] | None = None,
    failover: FailoverProbe | None = None,
) -> StabilityReport:
    """Run the controller with ``policy`` over the scenario; the stability report (the imbalance
    yardstick's ``threshold``, the ``hot`` level of a node's load). The platform's own settings
    (an Incus scenario's ``cluster.rebalance.*``) set the policy fields ``policy_keys`` leaves
    out, as they do in a real run. With ``traces``, the run's :class:`PolicyTrace` is appended
    to it. With ``failover``, the probe checks node failures every hour of the run (it is
    reported in the report's ``failover``)."""
    started = time.perf_counter()
    sim = Simulator(scenario, days=days, threshold=threshold, hot=hot)
    config = simulated_config(policy, "<simulate>", BackendConfig("sim"), policy_keys)
    history = History(":memory:")

    def on_cycle(_cycle: object) -> None:
        if failover is not None and failover.due(sim.now()):
            failover.check(sim.now(), sim.peek())
        if progress is not None:
            progress(sim.now(), sim.end)

    controller = Controller(config, sim, sim, history, on_cycle=on_cycle)
    try:
        controller.run(until=sim.end)
        report = report_from(sim, policy, threshold, history, time.perf_counter() - started)
        if failover is not None:
            report = replace(report, failover=failover.as_dict())
        if traces is not None:
            traces.append(trace_of(sim, policy))
        return report
    finally:
        history.close()
        sim.close()


def trace_of(sim: Simulator, policy: PolicyConfig) -> PolicyTrace:
    """The trace of a finished run."""
    ours = [r for r in sim.migrations if r.cause == "controller"]
    return PolicyTrace(
        policy=policy.name,
        step=float(sim.scenario.step),
        spreads=tuple(sim.imbalance_series().tolist()),
        migrations=tuple(r.started for r in ours),
        failed=tuple(r.started for r in ours if r.outcome == "failed"),
        open_spans=_open_spans(policy, float(sim.scenario.step), sim.now()),
    )


def _open_spans(
    policy: PolicyConfig, step: float, end: float
) -> tuple[tuple[float, float], ...] | None:
    """When ``policy``'s windows let balancing start migrations over the run, read at each
    simulated step up to ``end``: (from, to) in simulated seconds (None without windows)."""
    schedule = policy.schedule
    if schedule is None or schedule.empty:
        return None
    spans: list[tuple[float, float]] = []
    at = 0.0
    while at < end:
        if schedule.open(at, "balance"):
            if spans and spans[-1][1] == at:
                spans[-1] = (spans[-1][0], at + step)
            else:
                spans.append((at, at + step))
        at += step
    return tuple(spans)


def report_from(
    sim: Simulator, policy: PolicyConfig, threshold: float, history: History, wall: float
) -> StabilityReport:
    """The stability report of a finished run: the simulator's record, the run's history."""
    stats = sim.stats()
    ours = [r for r in sim.migrations if r.cause == "controller"]
    decisions = history.decisions()
    action = {d.id: d.action for d in decisions}
    repairs = {m.handle for m in history.migrations() if action.get(m.decision) == "repair"}
    repaired = sum(1 for r in ours if r.handle in repairs)
    balancing = tuple(r.started for r in ours if r.handle not in repairs)
    schedule = policy.schedule or Schedule()
    days = max(stats.seconds / DAY, 1e-9)
    minutes = sim.scenario.step / 60.0
    failed = [r for r in ours if r.outcome == "failed"]
    moved_later = 0
    for f in failed:
        if any(r.guest == f.guest and r.outcome == "done" and r.started >= f.started for r in ours):
            moved_later += 1
    return StabilityReport(
        policy=policy.name,
        strategy=policy.strategy,
        days=stats.seconds / DAY,
        threshold=threshold,
        migrations=len(ours),
        migrations_per_day=len(ours) / days,
        repair_migrations=repaired,
        balancing_migrations=len(ours) - repaired,
        ping_pongs=ping_pongs(ours),
        pct_time_above_threshold=100.0 * stats.steps_above / max(stats.steps, 1),
        mean_imbalance=stats.mean_imbalance,
        capacity_violations=stats.capacity_violations,
        capacity_violations_by=stats.capacity_violations_by.as_dict(),
        failed_migrations=len(failed),
        failures_moved_later=moved_later,
        failures_left=len(failed) - moved_later,
        restart_migrations=stats.restart_migrations,
        restart_downtime_minutes=stats.restart_downtime / 60.0,
        max_node_load=stats.max_node_load,
        hot=stats.hot,
        hot_node_minutes=stats.hot_steps * minutes,
        max_hot_minutes_per_node=stats.max_hot_steps * minutes,
        p95_node_load=stats.p95_node_load,
        recoveries=sum(1 for r in sim.migrations if r.cause == "recovery"),
        ha_unrestartable=stats.unrestartable,
        ha_held=stats.held,
        decisions=len(decisions),
        wall_seconds=wall,
        windows=None if schedule.empty else schedule.summary(),
        balancing_starts=balancing,
        balancing_outside_windows=sum(1 for t in balancing if not schedule.open(t, "balance")),
    )
