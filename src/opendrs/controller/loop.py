"""The daemon: observe every interval, apply the policy, plan, execute — for months.

One :class:`Controller` drives any backend (a snapshot file, the simulator, Proxmox VE) on the
backend's clock, so ``opendrs run`` against a real cluster and ``opendrs simulate`` run the same
code. Each cycle:

1. observe the cluster (a failed observation is logged and the cycle skipped);
2. smooth the measured usage over the policy's window (and, for the capacity checks, let a rise
   that lasts the hold count at once);
3. ask the policy (:func:`opendrs.engine.policy.decide`) whether to act — never while a plan is
   still executing;
4. record the decision in the history; in **shadow** mode (the default) log the migrations it
   would make, in **active** mode hand the plan to the :class:`Executor`, in **manual** mode
   store it as a proposal for an operator (:mod:`opendrs.controller.manual`) — or hand it on
   when its kind is ``automatic`` — and, before deciding, start the oldest approved proposal
   that still holds on the observation.

Between cycles the executor is ticked every ``poll_interval`` while it is busy or follows a
migration by where its guest is (in the background too): migrations start as soon as others finish,
and a watched migration is settled by what the next observation shows. At start-up the executor
reconciles the migrations the history lists as in flight, so a restart loses nothing and repeats
nothing. :class:`InstanceLock` keeps a second instance away from the same history.

A backend may tell more than the protocol asks (the Incus and Proxmox backends do):

* ``policy_defaults(strategy)`` — policy fields the platform's own settings set, taken where the
  configuration's ``policy`` section is silent (``config.with_platform_defaults``);
* ``standby()`` — why this instance must stay idle now (not the cluster's leader: Incus's
  database leader, Proxmox's HA manager master): the cycle then observes and decides nothing;
* ``last_moves()`` — when guests last moved, by any balancer: cooldowns, as for opendrs's moves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from opendrs.backends.base import (
    Backend,
    BackendError,
    Clock,
    LastMoves,
    PolicyDefaults,
    Standby,
    SystemClock,
)
from opendrs.backends.paced import PacedClock
from opendrs.controller.config import Config, with_platform_defaults
from opendrs.controller.executor import Event, Executor
from opendrs.controller.history import History
from opendrs.controller.history_file import HistoryError
from opendrs.controller.manual import ManualMode, decision_kind
from opendrs.engine.constraints import RuleCheck, check_rules, platform_balancer
from opendrs.engine.policy import (
    Decision,
    PastMigrations,
    PolicyConfig,
    PolicyState,
    UsageWindow,
    budget_window,
    decide,
    forbidden_placements,
    overload_span,
    warn_stuck,
)
from opendrs.engine.policy.profile import DailyProfile, profile_samples
from opendrs.engine.policy.trend import node_trend, with_trend
from opendrs.engine.strategies.exact_repair import repair_deadline
from opendrs.engine.usage import MeasuredUsage
from opendrs.model.cluster import Cluster
from opendrs.report.words import decision_words

log = logging.getLogger(__name__)

#: A decision not to act is recorded when its kind of reason changes, or after this long.
RECORD_EVERY = 3600.0

__all__ = ["Controller", "Cycle", "InstanceLock", "LockError", "observe_as_configured"]


class LockError(Exception):
    """The lock cannot be had; ``str()`` is one line.

    ``lasting`` is true when waiting will not help (the path is a symbolic link, not a file):
    a restart cannot cure it. Another instance holding the lock is not lasting.
    """

    def __init__(self, reason: str, *, lasting: bool = False) -> None:
        super().__init__(reason)
        self.lasting = lasting


class InstanceLock:
    """One instance per history: an exclusive ``flock`` on the lock file (``lock:``, beside the
    history by default) and one on the history file itself.

    The second follows the history's identity (its inode), not a name: two configurations that
    name different lock files for one history — or a hard or symbolic link to it — cannot both
    run. (SQLite locks with ``fcntl``, which ``flock`` does not touch on Linux; the history's
    descriptor is closed only after the history, so SQLite's own locks are never dropped.)
    """

    def __init__(self, path: str, history: str | None = None) -> None:
        self.path = path
        self.history = history
        self._fd: int | None = None
        self._history_fd: int | None = None

    def acquire(self) -> None:
        # Never through a symbolic link: whoever placed one would have its target truncated.
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LockError(
                    f"{self.path}: the lock file is a symbolic link: refused (remove it)",
                    lasting=True,
                ) from None
            raise LockError(f"{self.path}: cannot open the lock file: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LockError(f"{self.path}: the lock path is not a regular file", lasting=True)
        try:
            _lock_exclusive(fd)
        except OSError as exc:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                who = f" (pid {holder})" if holder.isdigit() else ""
                raise LockError(
                    f"{self.path}: another opendrs instance{who} is running for this cluster"
                ) from None
            raise LockError(f"{self.path}: cannot lock: {exc.strerror}") from None
        try:
            self._history_fd = self._lock_history()
        except BaseException:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _lock_history(self) -> int | None:
        """An exclusive ``flock`` on the history file (made, empty, when it does not exist: SQLite
        takes an empty file for a new database); ``None`` without a history file to lock (in
        memory, or its directory missing, which opening the history then reports)."""
        if self.history is None or self.history == ":memory:":
            return None
        try:
            fd = os.open(
                self.history, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o644
            )
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EISDIR):
                return None
            raise LockError(f"{self.history}: cannot open the history: {exc.strerror}") from None
        try:
            _lock_exclusive(fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise LockError(
                    f"{self.history}: another opendrs instance is running on this history "
                    f"(with another lock file than {self.path})"
                ) from None
            raise LockError(f"{self.history}: cannot lock the history: {exc.strerror}") from None
        return fd

    def probe(self) -> tuple[bool, int | None]:
        """Whether another process holds the lock now, and the pid it wrote — without keeping
        it: a shared lock is tried without waiting and let go at once, on a file opened read-only
        (never created, never through a symbolic link). A daemon that holds the lock is not
        disturbed, and one starting in that very instant tries again a moment later
        (:func:`_lock_exclusive`). Raises :class:`LockError` when the file cannot be opened."""
        return _probe(self.path, os.O_NOFOLLOW)

    def history_held(self) -> bool:
        """Whether another process holds the history file's lock (a daemon that runs on it,
        whatever its lock file), probed as :meth:`probe` does."""
        if self.history is None or self.history == ":memory:":
            return False
        return _probe(self.history, 0)[0]

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._history_fd is not None:
            os.close(self._history_fd)
            self._history_fd = None

    def __enter__(self) -> InstanceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _probe(path: str, flags: int) -> tuple[bool, int | None]:
    """Whether another process holds a ``flock`` on ``path``, and the pid written in it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | flags)
    except FileNotFoundError:
        return False, None
    except OSError as exc:
        raise LockError(f"{path}: cannot open the lock file: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise LockError(f"{path}: cannot test the lock: {exc.strerror}") from None
        holder = b""
        with contextlib.suppress(OSError):
            holder = os.pread(fd, 32, 0).strip()
        return True, int(holder) if holder.isdigit() else None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, None
    finally:
        os.close(fd)


#: Tries of the exclusive lock, and the pause between two: a probe holds it for microseconds.
_LOCK_TRIES = 3
_LOCK_PAUSE = 0.05


def _lock_exclusive(fd: int) -> None:
    """``flock(LOCK_EX)`` without waiting — tried again twice, 50 ms apart, so that a probe
    (:meth:`InstanceLock.probe`) in that instant is not taken for another instance."""
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            busy = exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
            if not busy or attempt == _LOCK_TRIES - 1:
                raise
        time.sleep(_LOCK_PAUSE)


@dataclass(frozen=True)
class Cycle:
    """What one cycle saw and decided."""

    at: float
    cluster: Cluster | None
    decision: Decision | None
    decision_id: int | None = None
    error: str | None = None
    #: Wall time the cycle took, in seconds.
    seconds: float = 0.0
    #: The guests the daemon leaves breaking a hard constraint, with why — those left on a node
    #: in maintenance among them: the last decision's :attr:`Decision.stuck` (a cycle while a
    #: plan executes decides nothing and keeps the one before).
    stuck: tuple[tuple[str, str], ...] = ()


#: What a reload cannot change: the fields of :class:`Config` the daemon opened at its start, and
#: how its warning names each.
RESTART_ONLY: dict[str, str] = {
    "backend": "backend section",
    "cluster": "cluster setting",
    "history": "history setting",
    "lock": "lock setting",
}


class Controller:
    """Observe → policy → plan → execute, on the backend's clock."""

    def __init__(
        self,
        config: Config,
        backend: Backend,
        clock: Clock,
        history: History,
        *,
        on_event: Callable[[Event], None] | None = None,
        on_cycle: Callable[[Cycle], None] | None = None,
        force_shadow: bool = False,
        hold_starts: Callable[[], str | None] | None = None,
    ) -> None:
        #: ``opendrs run --shadow``: shadow whatever the file says, through every reload.
        self.force_shadow = force_shadow
        config = self._overridden(config)
        self.config = config
        self.backend = backend
        self.clock = clock
        self.history = history
        self.on_cycle = on_cycle
        self.executor = Executor(backend, clock, history, config.executor, on_event=on_event)
        self.executor.active = config.migrates
        #: Manual mode's proposals (kept in the history, whatever the mode now).
        self.manual = ManualMode(history)
        if hold_starts is not None:
            self.executor.hold = hold_starts
        self.executor.closed = self._window_closed
        #: Observations that failed in a row (reported at ERROR from ``log.failed_observations``).
        self.failed_observations = 0
        # Guests evacuated for maintenance outlive a restart (``maintenance_return``), and so
        # do the nodes seen running hot (no plan refills them for a day after a restart either).
        self.state = PolicyState(evacuated=history.evacuated(), hot_seen=history.hot_seen())
        self.window = UsageWindow()
        #: Usage per hour of the day (``policy.daily_profile``), rebuilt after a restart.
        self.profile = DailyProfile()
        self.cycles: list[Cycle] = []
        self._last_none: tuple[Hashable, float] | None = None
        self._cluster_bound = False
        #: Whether the backend's policy defaults were asked for under this configuration.
        self._platform_asked = False
        #: Why the backend says this instance must stay idle (``leader_only``), if it does.
        self._standby: str | None = None
        #: Whether the last observation saw Proxmox VE balancing its HA guests itself.
        self._platform_balancer = False
        #: What the last decision (not ``busy``) leaves stuck (:attr:`Cycle.stuck`).
        self.stuck: tuple[tuple[str, str], ...] = ()
        #: Whether the daemon was asked to stop (:meth:`run`'s ``should_stop``): a cycle's exact
        #: repairs not yet started are then skipped (:func:`repair_deadline`).
        self.stop_asked: Callable[[], bool] = lambda: False
        #: The rule problems of the last observation, each logged once while it lasts.
        self._rule_problems: frozenset[str] = frozenset()

    @property
    def policy(self) -> PolicyConfig:
        return self.config.policy

    # -- configuration -------------------------------------------------------------------------

    def _overridden(self, config: Config) -> Config:
        if self.force_shadow and config.mode != "shadow":
            log.info("mode %s in %s: kept in shadow mode by --shadow", config.mode, config.file)
            return replace(config, mode="shadow")
        return config

    def reload(self, config: Config) -> None:
        """Take a new configuration (SIGHUP). What the daemon opened at its start (the backend,
        the cluster's name its history holds, the history and its lock) stays, with a warning
        when the file changed it; the rest follows the file.

        Leaving active mode stops starting migrations at once: the queue is dropped, the
        migrations in flight are followed to their end and recorded.
        """
        kept = {name: getattr(self.config, name) for name in RESTART_ONLY}
        for name, what in RESTART_ONLY.items():
            if getattr(config, name) != kept[name]:
                still = f" (still {kept[name]})" if isinstance(kept[name], str) else ""
                log.warning("the %s changed: it takes effect at the next restart%s", what, still)
        config = self._overridden(config)
        self.config = replace(config, **kept)
        self.executor.config = config.executor
        self._platform_asked = False
        self.executor.active = config.migrates
        log.info(
            "configuration reloaded from %s: mode %s, policy %s",
            config.file,
            config.mode,
            config.policy.name,
        )
        if not config.migrates:
            self.executor.halt(f"the configuration changed to {config.mode} mode")

    # -- one cycle -----------------------------------------------------------------------------

    def past_migrations(self, now: float, policy: PolicyConfig | None = None) -> PastMigrations:
        """What the history tells the policy: cooldowns, departures, failed targets, and (with a
        migration budget) the budgeted migrations of the last 24 hours."""
        departures = self.history.departures(now - self.policy.no_return)
        cooldowns = self.history.cooldowns(now)
        # Moves the platform records (Incus's volatile.rebalance.last_move), by any balancer.
        last_moves = self.backend.last_moves() if isinstance(self.backend, LastMoves) else {}
        for guest, moved in last_moves.items():
            until = moved + self.policy.cooldown
            if until > max(now, cooldowns.get(guest, now)):
                cooldowns[guest] = until
        chosen = policy or self.policy
        budget, window = chosen.max_migrations_per_day, chosen.migration_budget_window
        return PastMigrations(
            cooldown_until=cooldowns,
            departures={g: tuple(v) for g, v in departures.items()},
            avoid=self.history.avoided(now),
            budget_spent=(
                ()
                if budget is None
                else tuple(self.history.budget_spent(now - budget_window(budget, window)))
            ),
        )

    def observe(self) -> Cluster:
        cluster = observe_as_configured(self.backend, self.config)
        if not self._cluster_bound:
            self.history.bind(cluster.name)
            self._cluster_bound = True
        return cluster

    def platform_defaults(self) -> None:
        """Once per configuration: the policy defaults the platform sets (Incus's
        ``cluster.rebalance.*``) where the configuration's policy section does not."""
        if self._platform_asked or not isinstance(self.backend, PolicyDefaults):
            return
        try:
            fields, notes = self.backend.policy_defaults(self.policy.strategy)
        except BackendError as exc:
            log.warning("cannot read the platform's policy defaults (asked again later): %s", exc)
            return
        self._platform_asked = True
        for note in notes:
            log.warning("%s", note)
        self.config, taken = with_platform_defaults(self.config, fields)
        self.executor.config = self.config.executor
        for line in taken:
            log.info("from the platform's settings: %s", line)

    @property
    def standing_by(self) -> str | None:
        """Why this instance stood by at its last look (``leader_only``), or ``None``."""
        return self._standby

    def warn_rules(self, rule_check: RuleCheck) -> None:
        """Each rule the observation's rules drop or ignore (contradictions, a tag against a
        platform rule: ``rule_check``, :func:`check_rules` of it) at WARNING, once while it
        lasts."""
        problems = [str(p) for p in rule_check.problems]
        for problem in problems:
            if problem not in self._rule_problems:
                log.warning("rules: %s", problem)
        self._rule_problems = frozenset(problems)

    def standby(self) -> str | None:
        """Why this instance stays idle now (the backend's ``standby``: not the leader)."""
        reason = self.backend.standby() if isinstance(self.backend, Standby) else None
        if reason != self._standby:
            if reason is not None:
                log.info("standing by: %s", reason)
            else:
                log.info("acting again: this instance may act on the cluster")
            self._standby = reason
        return reason

    def _note_platform_balancer(self, cluster: Cluster) -> None:
        """One line when Proxmox VE starts or stops balancing its HA guests itself: while it
        does, the policy leaves them to it (``movability``'s ``platform-balancer``), so that
        two balancers never undo each other's moves."""
        on = cluster.ha_auto_rebalance
        if on == self._platform_balancer:
            return
        self._platform_balancer = on
        if on:
            level = logging.WARNING if self.config.active else logging.INFO
            log.log(level, "not balancing HA guests: %s", platform_balancer(cluster))
        else:
            log.info(
                "Proxmox VE no longer balances its HA guests itself (ha-auto-rebalance is off): "
                "opendrs balances them again"
            )

    def cycle(self, *, policy: PolicyConfig | None = None) -> Cycle:
        """Observe, decide and (in active mode) hand the plan to the executor."""
        started = time.monotonic()
        self.platform_defaults()
        policy = policy or self.policy
        now = self.clock.now()
        try:
            cluster = self.observe()
        except BackendError as exc:
            self.failed_observations += 1
            failures = self.failed_observations
            level = (
                logging.ERROR if failures >= self.config.failed_observations else logging.WARNING
            )
            count = f" ({failures} in a row)" if failures > 1 else ""
            log.log(level, "cannot observe the cluster%s: %s", count, exc)
            result = Cycle(now, None, None, error=exc.reason)
            self._done(result, started)
            return result
        if self.failed_observations:
            log.info("observing again after %d failed observations", self.failed_observations)
            self.failed_observations = 0
        # The rules are checked once per observation: for the warnings and the decision.
        rule_check = check_rules(cluster)
        self.warn_rules(rule_check)
        if self.executor.watching:
            self.executor.settle(cluster)
        if self.standby() is not None:
            result = Cycle(now, cluster, None)
            self._done(result, started)
            return result
        self._note_platform_balancer(cluster)
        self._approved(now, cluster, policy)
        with repair_deadline(stop=self.stop_asked):  # a stop skips its exact repairs left
            decision = self._decide(now, cluster, policy, rule_check)
        if decision.state.evacuated != self.state.evacuated:
            self.history.set_evacuated(decision.state.evacuated)
        if decision.state.hot_seen != self.state.hot_seen:
            self.history.set_hot_seen(decision.state.hot_seen)
        self.state = decision.state
        warn_stuck(decision.stuck, log)
        if decision.code != "busy":
            self.stuck = decision.stuck
        decision_id = self._record(now, cluster, decision, policy)
        if decision.act and decision.plan is not None and decision.plan.moves:
            self._hand_on(decision, decision_id, cluster, now)
        result = Cycle(now, cluster, decision, decision_id, stuck=self.stuck)
        self._done(result, started)
        return result

    def _decide(
        self, now: float, cluster: Cluster, policy: PolicyConfig, rule_check: RuleCheck
    ) -> Decision:
        """The policy's decision on ``cluster`` (its rules checked: ``rule_check``), with the
        usage the window (and, when on, the daily profile) has kept up to this observation."""
        self.window = self._window_at(now).add(now, cluster, policy.smoothing)
        # Capacity is checked on usage that rises after the hold, not after the whole window.
        span = overload_span(policy)
        recent: MeasuredUsage | None = None
        latest: MeasuredUsage | None = None
        if span < policy.smoothing:
            average, recent = self.window.usage(cluster, span)
            if policy.spend_budget:
                # The recent demand a migration budget may spend on (policy.spending).
                latest = self.window.latest(cluster, span)
        else:
            average = self.window.average(cluster)
        if policy.hot is not None:
            # A node whose load rises steadily is relieved before it runs hot (engine.policy.trend).
            trend = node_trend(self.window, cluster, policy.interval)
            if trend.rising:
                base = average if recent is None else recent
                recent = with_trend(base, cluster, trend, policy.hot)
        daily = None
        if policy.daily_profile:
            samples = profile_samples(policy.daily_profile, policy.interval)
            self.profile = self.profile.add(now, cluster, samples)
            if self.profile.covers_day(now):
                width = policy.daily_profile_window // 3600
                daily = self.profile.hours(cluster, average, width)
        return decide(
            cluster,
            now,
            policy,
            self.state,
            self.past_migrations(now, policy),
            busy=self.executor.busy,
            average=average,
            recent=recent,
            latest=latest,
            daily=daily,
            rule_check=rule_check,
        )

    def _window_at(self, now: float) -> UsageWindow:
        """The usage window, started again when the clock was stepped back behind its last
        observation (NTP correcting a clock that ran ahead): its samples would be in the future."""
        if len(self.window) and now < float(self.window.times[-1]):
            back = float(self.window.times[-1]) - now
            log.warning(
                "the clock went back %.0f s behind the last observation: the usage window "
                "starts again",
                back,
            )
            return UsageWindow()
        return self.window

    def _window_closed(self, activity: str) -> str | None:
        """Why the executor may start no more of a plan that does ``activity`` now (its window
        closed, a blackout began: ``policy.windows``), or None."""
        schedule = self.policy.schedule
        if schedule is None:
            return None
        reason = schedule.closed_reason(self.clock.now(), activity)
        return None if reason is None else f"{reason} now: no more of the plan starts"

    def _approved(self, now: float, cluster: Cluster, policy: PolicyConfig) -> None:
        """Manual mode's proposals on this observation: the stale ones expire and, when the
        executor is idle and migrations may start, the oldest approved one that still holds
        starts (:class:`ManualMode`)."""
        if not self.manual.pending():
            return
        forbidden = forbidden_placements(cluster, now, policy, self.past_migrations(now, policy))
        self.manual.expire_stale(cluster, forbidden, now, self.config.proposal_ttl)
        if not self.config.migrates or self.executor.busy:
            return
        taken = self.manual.take_approved(
            cluster, policy.metric, forbidden, policy.keep_failover, policy.failover_recovery
        )
        if taken is not None:
            proposal, plan = taken
            self.executor.submit(plan, proposal.decision, proposal.kind)
            self.executor.tick()

    def _hand_on(
        self, decision: Decision, decision_id: int | None, cluster: Cluster, now: float
    ) -> None:
        """``decision``'s plan to the executor when it acts alone (active mode, or an
        ``automatic`` kind in manual mode); in manual mode otherwise, a proposal; in shadow
        mode, each move it would make, logged."""
        plan = decision.plan
        assert plan is not None
        if self.config.acts_alone(decision_kind(decision)):
            self.executor.submit(plan, decision_id, decision.activity)
            self.executor.tick()
            return
        if self.config.mode == "manual" and decision_id is not None:
            self.manual.propose(decision, decision_id, cluster, now)
            return
        for move in plan.moves:
            log.info(
                "shadow: would migrate %s %s → %s (step %d)",
                cluster.guest_label(move.guest),
                move.source,
                move.target,
                move.step,
            )

    def _done(self, cycle: Cycle, started: float) -> None:
        cycle = replace(cycle, seconds=time.monotonic() - started)
        self.cycles.append(cycle)
        if len(self.cycles) > 1000:
            del self.cycles[:-500]
        if self.on_cycle is not None:
            self.on_cycle(cycle)

    def _record(
        self, now: float, cluster: Cluster, decision: Decision, policy: PolicyConfig
    ) -> int | None:
        """Record every decision to act; one not to act when its kind of reason changes, or
        hourly (a decision every few minutes saying "balanced" would only bury the others).

        Each recorded decision is logged at INFO with the reason it is recorded with — a
        decision not to act says why (which filter stopped it, with counts). Stuck repairs are
        logged at WARNING by :meth:`cycle`, once per decision (``decide`` stays pure), never here.
        """
        # The kind of reason: the decision's code and its facts with the numbers left out (the
        # same code can stop at different filters).
        category = decision.gist()
        if not decision.act:
            last = self._last_none
            if last is not None and last[0] == category and now - last[1] < RECORD_EVERY:
                return None
            self._last_none = (category, now)
        else:
            self._last_none = None
        reason = decision_words(decision, cluster.guest_label)
        log.info("decision (%s): %s", self.config.mode, reason)
        summary: dict[str, object] = {
            "code": decision.code.value,
            "budgeted": decision.budgeted,
            "nodes": len(cluster.nodes),
            "usable_nodes": sum(1 for n in cluster.nodes if n.usable),
            "guests": len(cluster.guests),
            "migrating": sum(1 for g in cluster.guests if g.migrating_to is not None),
            "metric": policy.metric,
            "strategy": policy.strategy,
        }
        if decision.stop is not None:
            summary["stop"] = decision.stop.as_dict()
        summary.update(decision.needs())
        # Each move with its guest's name: the history, status and the reports say it by name.
        moves = decision.plan.as_dict()["moves"] if decision.plan is not None else []
        plan = [{**m, "name": cluster.guest(m["guest"]).name} for m in moves]
        return self.history.record_decision(
            at=now,
            cluster=cluster.name,
            mode=self.config.mode,
            policy=policy.name,
            action=decision.kind,
            code=decision.code.value,
            reason=reason,
            imbalance=decision.metric,
            predicted=decision.predicted,
            summary=summary,
            plan=plan,  # type: ignore[arg-type]
        )

    # -- the loop ------------------------------------------------------------------------------

    def run(
        self,
        *,
        once: bool = False,
        until: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        take_reload: Callable[[], Config | None] = lambda: None,
        reload_pending: Callable[[], bool] = lambda: False,
        take_wake: Callable[[], bool] = lambda: False,
        wake_pending: Callable[[], bool] = lambda: False,
    ) -> None:
        """Run until ``should_stop()``, until the clock reaches ``until``, or one cycle (``once``).

        ``once`` makes one decision with ``hold`` 1 (a single observation cannot be held for
        several) and, in active mode, follows its plan to the end before returning.
        ``take_wake()`` true (SIGUSR1: ``opendrs approve``, ``balance-now``) runs a cycle at
        once; a request to balance now (:meth:`History.request_balance`) makes that cycle's
        decision, or the next one's, with ``hold`` 1, whatever the interval.
        """
        self.stop_asked = should_stop
        for event in self.executor.reconcile():
            log.info("reconciled: %s", event)
        self.platform_defaults()
        next_cycle = last_cycle = self.clock.now()
        decided = False
        while not should_stop():
            fresh = take_reload()
            if fresh is not None:
                self.reload(fresh)
                if decided:  # a new interval, shorter or longer, counts from the last decision
                    next_cycle = last_cycle + self.policy.interval
            now = self.clock.now()
            if until is not None and now >= until:
                break
            # Never more than an interval ahead: a clock stepped back does not hold decisions.
            next_cycle = min(next_cycle, now + self.policy.interval)
            if self.executor.busy or self.executor.watching:
                self.executor.tick()
            woken = take_wake()
            if (now >= next_cycle or woken) and not (once and decided):
                asked = self._balance_asked()
                if asked:  # the decision asked for is recorded, whatever it says
                    self._last_none = None
                held = once or asked
                policy = replace(self.policy, hold=min(self.policy.hold, 1)) if held else None
                self.cycle(policy=policy)
                decided = True
                last_cycle, next_cycle = now, now + self.policy.interval
            if once and decided and not self.executor.busy:
                break
            follow = self.executor.busy or self.executor.watching
            wait = self.config.executor.poll_interval if follow or once else next_cycle - now
            if until is not None:
                wait = min(wait, until - now)
            self._sleep(max(wait, 0.0), lambda: should_stop() or reload_pending() or wake_pending())

    def _balance_asked(self) -> bool:
        """Whether someone asked for a decision now (``opendrs balance-now``): taken, logged."""
        try:
            by = self.history.take_balance_request()
        except HistoryError as exc:
            log.warning("cannot read the requests to balance now: %s", exc)
            return False
        if by is not None:
            log.info("balance now, asked by %s: one decision, whatever the hold and interval", by)
        return by is not None

    def _sleep(self, seconds: float, wake: Callable[[], bool]) -> None:
        """Sleep on the clock; a real clock, or a simulation paced to wall time (``speed``), in
        slices of half a second of wall time so that a stop, a reload or a wake (``opendrs
        approve``, ``balance-now``) is seen soon; the simulator's own clock at once."""
        if isinstance(self.clock, SystemClock):
            piece = 0.5
        elif isinstance(self.clock, PacedClock):
            piece = 0.5 * self.clock.speed
        else:
            self.clock.sleep(seconds)
            return
        # measured on the monotonic clock: a step of the wall clock neither ends nor prolongs it
        end = self.clock.monotonic() + seconds
        while not wake():
            before = self.clock.monotonic()
            left = end - before
            if left <= 0:
                break
            self.clock.sleep(min(left, piece))
            if isinstance(self.clock, PacedClock) and self.clock.monotonic() <= before:
                break  # the simulation has ended: nothing more to wait for


def observe_as_configured(backend: Backend, config: Config) -> Cluster:
    """The cluster ``backend`` observes, with the configuration's ``settings`` and ``cluster``
    name applied, as every stage of the daemon sees it.

    Raises :class:`BackendError` when it cannot be observed, or when the settings' reserve
    leaves a node no capacity.
    """
    cluster = backend.observe()
    if config.settings is not None and cluster.settings != config.settings:
        cluster = replace(cluster, settings=config.settings)
    problem = _reserve_problem(cluster)
    if problem is not None:
        raise BackendError(problem, transient=False)
    if config.cluster is not None and cluster.name != config.cluster:
        cluster = replace(cluster, name=config.cluster)
    return cluster


def _reserve_problem(cluster: Cluster) -> str | None:
    """Why a node's reserve leaves it no capacity, or ``None``.

    A snapshot file with such a reserve is refused when read; the configuration's ``settings``
    meet the real nodes only here, so the cycle is refused instead of deciding on a node of
    capacity 0 (which every guest on it would seem to overload).
    """
    settings = cluster.settings
    for node in cluster.nodes:
        for what, own, default, capacity, unit in (
            ("cpu", node.reserve_cpu, settings.reserve_cpu, node.cpu, "cores"),
            ("memory", node.reserve_memory, settings.reserve_memory, node.memory, "bytes"),
        ):
            reserve = default if own is None else own
            if capacity > 0 and reserve >= capacity:
                return (
                    f"the {what} reserve ({reserve:g} {unit}) leaves node {node.name} no {what} "
                    f"capacity ({capacity:g} {unit}): lower settings.reserve.{what}"
                )
    return None
