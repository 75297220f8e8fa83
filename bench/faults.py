"""The simulator's fault campaign: the daemon's promises under random fault mixes, at scale.

``python -m bench.faults [--seeds N] [--start S] [--days D] [--jobs J] [--json FILE] [--verbose]``

For every seed a fault mix (:func:`make_mix`) is drawn over the built-in ``demo`` scenario (8
nodes, 80 HA-managed VMs packed onto three of them; a seed takes its first 3 to 8 nodes and all,
three quarters or half of their guests, so that small clusters are tight): node failures (now and
then for good),
maintenance windows, API outages and random API errors, migrations that fail part-way, hang or
lose their answer (the simulator's ``migration-hang`` and ``api-lost-answer`` faults), restarts
of the daemon — between two loop iterations, or killed in the middle of a migration request,
before or after it reached the platform — reloads between active and shadow mode, and signals in
the window between the decision to start a migration and its request (the backend reading what
the start needs): a reload (SIGHUP; the file says shadow or still active) or a stop (SIGTERM; the
daemon exits cleanly and is started again). Hard
anti-affinity groups and strict node affinities (pins) are added to the cluster, and the policy
and executor settings vary too (how often and how eagerly the policy acts, timeouts, limits).

The controller (:class:`~opendrs.controller.loop.Controller`, the daemon's code) runs against the
simulator for ``days`` simulated days of faults; then the faults stop — every scheduled fault is
over, and the controller is reloaded into shadow mode: nothing new starts, so no migration can hang
or lose its answer any more (random API errors go on at their rate: they only delay) — and the run
goes on until everything settles: twice the executor's timeout, its stall timeout and four
intervals. Migrations still hanging then — the controller's request to stop one failed, or it
never learnt its handle — are cancelled by the "operator" (counted in the summary), and the run
settles again.

The invariants, checked independently of the engine's capacity code (:func:`breaches`):

1. **active mode** — no migration starts while the controller is not in active mode, nor while a
   reload or a stop request is pending: checked on every ``start_migration`` call, when the
   simulator accepted the request, and — while a signal that came in the window before a request
   is pending — at every check point, by counting the controller's migrations in the simulator
   (none may begin until the signal is handled).
2. **capacity and hard rules** — no state the controller causes is over a node's capacity or
   breaks a hard rule, a migrating guest counted on both nodes. Capacity is recomputed here from
   the observed guests as :class:`~opendrs.engine.usage.CapacityModel` defines it: per node,
   configured vCPUs ≤ cores × ``cpu_overcommit`` and configured memory ≤ memory ×
   ``memory_overcommit``; in dynamic mode the host's own load plus the measured use ≤ the physical
   cores and memory; local disks ≤ each storage pool — all net of reserves, counting running
   guests (and their target while they migrate). The hard rules are hard anti-affinity and strict
   node affinity. The simulator itself may overload a node — its HA manager restarts the guests of
   a failed node elsewhere, and the guests' own use grows and shrinks with their workloads — so
   what is checked is what the controller does:

   * at every migration the controller starts (right after the simulator accepted it, or lost its
     answer): the target, with the guest counted on it, within *every* limit, measured use
     included, and no hard rule of the guest broken there;
   * at every check point where the placement changed, for every guest in flight: its target
     within the limits on configured sizes and local disks (they do not move with the workloads:
     only an arrival can raise them) and no hard rule of the guest broken there. The measured use
     of a target may grow during a flight with the workloads; that is not checked (nobody can
     foresee it).

   A hard rule is in force as written: a hard anti-affinity rule is ineffective only when it names
   more guests than the cluster has nodes (Proxmox's own check, "even if all nodes are
   available"); the mixes never make one. Breaches that no flight explains (the simulator's HA
   recovery, which places with the engine, or a co-location the controller made that outlives its
   flight) are counted in the summary as a fact, not as violations: the start and the flight that
   made one were checked.
3. **the policy decides again** — whenever the executor is busy with nothing of its own in flight
   (:attr:`~opendrs.controller.executor.Executor.in_flight` leaves out migrations followed in the
   background), the policy makes a decision of its own — not "a plan is still executing" — within
   ``stall_timeout + 2 × interval + poll_interval``. A cycle whose observation failed (an API
   error) counts as a chance to decide: nobody can decide on a cluster they cannot see.
4. **the history tells the truth** — at the end, every migration the simulator performed for the
   controller (``Simulator.migrations``, cause ``controller``) has exactly one history row, with
   its real outcome (``done`` or ``failed``; ``lost`` is accepted for a failed one, when the guest
   was found elsewhere), nothing is in flight any more, and every other row is a request that never
   started a migration (refused, or the daemon was killed before it was sent), recorded
   ``failed`` (or ``lost``). A start given up on before its request because a reload or a stop
   came in its window leaves no row at all.
5. **no exception** — nothing escapes the controller's loop but the campaign's own kill: an
   exception would end the daemon. One is a violation; the daemon is started again after
   :data:`RESTART_DELAY`, as a service manager would, and the run goes on.

Check points: every executor event (``on_event``), every cycle (``on_cycle``) and every
``start_migration``; invariant 3 also at every simulator step (the controller's clock advances the
simulation one step at a time). The checker reads the truth with :meth:`Simulator.peek`, which
neither fails nor draws a random number: checking changes nothing in the run. Everything is
seeded: the same seed gives the same run and the same figures, byte for byte.

Exit status: 0 when no invariant was broken, 1 otherwise (each violation is printed with its seed),
2 for bad arguments. ``docs/performance.md`` has the figures of the full campaign (``make faults``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import random
import sys
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from opendrs.backends.base import BackendError, Handle, NotStarted, Progress, StartGate
from opendrs.backends.scenario import Fault, Scenario, builtin_scenario
from opendrs.backends.sim import Simulator
from opendrs.controller.config import BackendConfig, Config
from opendrs.controller.executor import Event, ExecutorConfig
from opendrs.controller.history import History
from opendrs.controller.loop import Controller, Cycle
from opendrs.engine.policy import PolicyConfig
from opendrs.model.cluster import Cluster, Guest, Move
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.records import PENDING
from opendrs.report.reasons import explain

DAY = 86_400.0
#: The faults of a mix, as the summary counts them.
FAULT_KINDS = (
    "node failures",
    "node failures for good",
    "maintenance windows",
    "API outages",
    "API calls refused",
    "migrations failed part-way",
    "migrations hung",
    "answers lost",
    "daemon restarts",
    "daemon killed mid-request",
    "reloads (mode changes)",
    "reloads before a request",
    "stops before a request",
)
INVARIANTS = ("active mode", "capacity and rules", "decides again", "history", "no exception")
#: Violations kept per seed and invariant (the others are counted).
KEEP = 10
#: The strategies the policy may use (``balance`` for half of the seeds; not the slow ``optimal``).
STRATEGIES = (
    *("balance",) * 6,
    "incus",
    "static-greedy",
    "pve-topsis",
    "pve-bruteforce",
    "proxlb-greedy",
    "drs-pressure",
)
#: Seconds before a daemon that died of an exception is started again.
RESTART_DELAY = 10.0
_TOLERANCE = 1e-9


class Crash(BaseException):
    """The daemon is killed (a ``BaseException``: nothing in the controller may catch it)."""


# --------------------------------------------------------------------------------------------
# The fault mix of a seed


@dataclass(frozen=True)
class Mix:
    """One seed's faults, rules and controller settings."""

    seed: int
    #: Simulated seconds of faults (the quiet follows).
    span: float
    #: The part of the base cluster simulated: its first nodes, and some of their guests.
    nodes: tuple[str, ...]
    guests: tuple[str, ...]
    #: (at, node, duration or None for good)
    node_failures: tuple[tuple[float, str, float | None], ...]
    maintenance: tuple[tuple[float, str, float], ...]
    #: (at, duration) of API outages; the per-call probability of a random API error.
    outages: tuple[tuple[float, float], ...]
    api_probability: float
    failure_rate: float
    scheduled_failures: tuple[float, ...]
    hang_probability: float
    scheduled_hangs: tuple[float, ...]
    lost_probability: float
    scheduled_lost: tuple[float, ...]
    #: Restarts between two loop iterations; the probability that the daemon is killed during a
    #: migration request (half of them before it is sent, half after).
    restarts: tuple[float, ...]
    crash_probability: float
    #: Reloads, each into the other mode.
    reloads: tuple[float, ...]
    #: The probability that a reload or a stop request comes between the decision to start a
    #: migration and its request (half of each).
    signal_probability: float
    anti_affinity: tuple[tuple[str, ...], ...]
    pins: tuple[tuple[str, tuple[str, ...]], ...]
    policy: PolicyConfig
    executor: ExecutorConfig

    def describe(self) -> str:
        return (
            f"seed {self.seed}: {len(self.nodes)} nodes, {len(self.guests)} guests, "
            f"{len(self.node_failures)} node failures, "
            f"{len(self.maintenance)} maintenance windows, {len(self.outages)} outages, "
            f"api errors {self.api_probability:g}, failures {self.failure_rate:g}, "
            f"hangs {self.hang_probability:g}, lost answers {self.lost_probability:g}, "
            f"{len(self.restarts)} restarts, kills {self.crash_probability:g}, "
            f"{len(self.reloads)} reloads, signals before a request "
            f"{self.signal_probability:g}, {len(self.anti_affinity)} anti-affinity groups, "
            f"{len(self.pins)} pins; policy {self.policy.strategy} interval "
            f"{self.policy.interval} hold {self.policy.hold}; executor timeout "
            f"{self.executor.timeout} stall {self.executor.stall_timeout}"
        )


def make_mix(seed: int, cluster: Cluster, days: float = 1.0) -> Mix:
    """The fault mix of ``seed`` over ``cluster``: ``days`` simulated days of faults.

    The cluster simulated is its first 3–8 nodes (all of them for a third of the seeds) with all,
    three quarters or half of their guests: the built-in demo packs its guests onto three nodes, so
    a small part of it is tight — a failure or a maintenance window leaves too little room, the
    executor must wait, re-plan, give up — and a whole one roomy.
    """
    rng = random.Random(seed)
    span = days * DAY
    count = rng.choice((3, 4, 5, 6, len(cluster.nodes), len(cluster.nodes)))
    nodes = [n.name for n in cluster.nodes[:count]]
    keep = rng.choice((0.5, 0.75, 1.0))
    kept = [g for g in cluster.guests if g.node in nodes and rng.random() < keep]

    def times(counts: Sequence[int], *, end: float = span) -> tuple[float, ...]:
        return tuple(sorted(round(rng.uniform(0, end)) for _ in range(rng.choice(counts))))

    def duration(low: float, high: float, at: float) -> float:
        """A duration that ends before the faults do."""
        return float(max(60, min(round(rng.uniform(low, high)), span - at - 60)))

    failures = []
    for at in times((0, 1, 1, 2, 3), end=0.9 * span):
        forever = rng.random() < 0.1
        failures.append(
            (float(at), rng.choice(nodes), None if forever else duration(300, 7200, at))
        )
    maintenance = tuple(
        (float(at), rng.choice(nodes), duration(600, 4 * 3600, at))
        for at in times((0, 1, 2, 3), end=0.9 * span)
    )
    outages = tuple(
        (float(at), duration(60, 1200, at)) for at in times((0, 1, 2, 4), end=0.95 * span)
    )
    guests = list(kept)
    rng.shuffle(guests)
    anti: list[tuple[str, ...]] = []
    used: set[str] = set()
    for _ in range(rng.choice((0, 1, 2, 3))):
        size = rng.choice((2, 2, 3))
        group: list[Guest] = []
        for g in guests:
            if g.id not in used and all(g.node != h.node for h in group):
                group.append(g)
                used.add(g.id)
                if len(group) == size:
                    break
        anti.append(tuple(sorted(g.id for g in group)))
    pins: list[tuple[str, tuple[str, ...]]] = []
    wanted = rng.choice((0, 1, 2, 3))
    for g in guests:
        if len(pins) >= wanted:
            break
        if g.id in used:
            continue
        used.add(g.id)
        others = [n for n in nodes if n != g.node]
        extra = rng.sample(others, min(rng.choice((1, 2, 3)), len(others)))
        pins.append((g.id, tuple(sorted({g.node, *extra}))))
    threshold = rng.choice((0.08, 0.1, 0.15))
    cooldown = rng.choice((0, 900, 3600))
    policy = PolicyConfig(
        name=f"faults-{seed}",
        interval=rng.choice((120, 300, 300)),
        hold=rng.choice((1, 2, 3)),
        threshold=threshold,
        target=threshold / 2,
        margin=rng.choice((0.0, 0.1, 0.25)),
        cooldown=cooldown,
        no_return=rng.choice((0, 3600)),
        smoothing=rng.choice((0, 900, 3600)),
        min_uptime=rng.choice((0, 300)),
        avoid_after_failure=rng.choice((600, 1800)),
        max_parallel=rng.choice((None, 1, 2, 4)),
        max_node_inflow=rng.choice((None, 1, 2)),
        maintenance_return=rng.random() < 0.3,
        # Half of the seeds balance with opendrs's own strategy, half with the peers' emulations:
        # other plans for the same executor.
        strategy=rng.choice(STRATEGIES),
    )
    executor = ExecutorConfig(
        max_parallel=policy.max_parallel,
        max_node_inflow=policy.max_node_inflow,
        timeout=rng.choice((300, 600, 1200)),
        poll_interval=rng.choice((5, 10, 30)),
        avoid_after_failure=policy.avoid_after_failure,
        cooldown=cooldown,
        stall_timeout=rng.choice((300, 600, 900)),
        unseen_grace=rng.choice((60, 120)),
    )
    return Mix(
        seed=seed,
        span=span,
        nodes=tuple(nodes),
        guests=tuple(g.id for g in kept),
        node_failures=tuple(failures),
        maintenance=maintenance,
        outages=outages,
        api_probability=rng.choice((0.0, 0.0, 0.001, 0.01, 0.03)),
        failure_rate=rng.choice((0.0, 0.02, 0.1, 0.3)),
        scheduled_failures=times((0, 1, 3)),
        hang_probability=rng.choice((0.0, 0.01, 0.05, 0.15)),
        scheduled_hangs=times((0, 1, 2)),
        lost_probability=rng.choice((0.0, 0.01, 0.05, 0.15)),
        scheduled_lost=times((0, 1, 2)),
        restarts=times((0, 1, 2, 4)),
        crash_probability=rng.choice((0.0, 0.0, 0.01, 0.03)),
        reloads=times((0, 2, 4, 6)),
        anti_affinity=tuple(anti),
        pins=tuple(pins),
        policy=policy,
        executor=executor,
        # Drawn last: the rest of a seed's mix is as it was before this fault was added.
        signal_probability=rng.choice((0.0, 0.02, 0.05, 0.1)),
    )


def scenario_of(mix: Mix, base: Scenario) -> Scenario:
    """``base`` with the mix's part of the cluster, rules, seed, migration failure rate, and its
    simulator faults added to the base's own."""
    cluster = base.cluster
    nodes = set(mix.nodes)
    guests = set(mix.guests)
    rules = cluster.rules
    kept_nodes = tuple(
        replace(
            r,
            guests=tuple(g for g in r.guests if g in guests),
            nodes={n: p for n, p in r.nodes.items() if n in nodes},
        )
        for r in rules.node_affinity
    )
    kept_guests = tuple(
        replace(r, guests=tuple(g for g in r.guests if g in guests)) for r in rules.guest_affinity
    )
    rules = Rules(
        node_affinity=tuple(r for r in kept_nodes if r.guests and r.nodes)
        + tuple(
            NodeAffinity(f"pin-{gid}", (gid,), dict.fromkeys(nodes, 1), strict=True)
            for gid, nodes in mix.pins
        ),
        guest_affinity=tuple(r for r in kept_guests if len(r.guests) > 1)
        + tuple(
            GuestAffinity(f"apart-{i}", group, positive=False, hard=True)
            for i, group in enumerate(mix.anti_affinity)
        ),
        ignored=rules.ignored & guests,
    )
    cluster = replace(
        cluster,
        nodes=tuple(n for n in cluster.nodes if n.name in nodes),
        guests=tuple(g for g in cluster.guests if g.id in guests),
        rules=rules,
    )
    faults: list[Fault] = []
    for at, node, length in mix.node_failures:
        faults.append(Fault("node-failure", at=at, node=node, duration=length))
    for at, node, length in mix.maintenance:
        faults.append(Fault("maintenance", at=at, node=node, duration=length))
    for at, length in mix.outages:
        faults.append(Fault("api-error", at=at, duration=length))
    if mix.api_probability:
        faults.append(Fault("api-error", probability=mix.api_probability))
    faults += [Fault("migration-failure", at=at) for at in mix.scheduled_failures]
    if mix.hang_probability:
        faults.append(Fault("migration-hang", probability=mix.hang_probability))
    faults += [Fault("migration-hang", at=at) for at in mix.scheduled_hangs]
    if mix.lost_probability:
        faults.append(Fault("api-lost-answer", probability=mix.lost_probability))
    faults += [Fault("api-lost-answer", at=at) for at in mix.scheduled_lost]
    return replace(
        base,
        name=f"{base.name}-faults-{mix.seed}",
        seed=mix.seed,
        cluster=cluster,
        migration=replace(base.migration, failure_rate=mix.failure_rate),
        faults=base.faults + tuple(faults),
    )


# --------------------------------------------------------------------------------------------
# The independent checks


class Ledger:
    """What the guests of ``cluster`` commit on each node, a migrating guest counted on both of
    its nodes — computed here from the guests' sizes, independently of the engine's code."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.vcpus: dict[str, float] = defaultdict(float)
        self.memory: dict[str, float] = defaultdict(float)
        self.cpu_used: dict[str, float] = defaultdict(float)
        self.memory_used: dict[str, float] = defaultdict(float)
        self.disks: dict[tuple[str, str], float] = defaultdict(float)
        #: The running guests on (or arriving at) each node.
        self.on: dict[str, set[str]] = defaultdict(set)
        for g in cluster.guests:
            where = (g.node,) if g.migrating_to in (None, g.node) else (g.node, g.migrating_to)
            for disk in g.disks:
                if disk.local:  # local disks occupy their pools whatever the guest's state
                    for n in where:
                        self.disks[(n, disk.pool)] += disk.size
            if g.state == "stopped":
                continue
            for n in where:
                self.vcpus[n] += g.cpu
                self.memory[n] += g.memory
                self.cpu_used[n] += g.cpu_load
                self.memory_used[n] += g.memory_load
                self.on[n].add(g.id)

    def over(self, name: str, *, measured: bool = True) -> list[str]:
        """The limits node ``name`` is over, net of reserves; ``measured``: the measured use too
        (in dynamic mode)."""
        cluster = self.cluster
        settings = cluster.settings
        node = cluster.node(name)
        cores = max(node.cpu - cluster.reserve_cpu(node), 0.0)
        ram = float(max(node.memory - cluster.reserve_memory(node), 0))
        limits = [
            ("configured vCPUs", self.vcpus[name], cores * settings.cpu_overcommit),
            ("configured memory", self.memory[name], ram * settings.memory_overcommit),
        ]
        if measured and settings.mode == "dynamic":
            limits.append(("cpu use", node.base_cpu + self.cpu_used[name], cores))
            limits.append(("memory use", node.base_memory + self.memory_used[name], ram))
        for (n, pool), size in self.disks.items():
            if n == name:
                limits.append((f"local disks in {pool}", size, float(node.storage.get(pool, 0))))
        return [
            f"{name}: {what} {value:.6g} > {limit:.6g}"
            for what, value, limit in limits
            if value > limit + _TOLERANCE * max(abs(limit), 1.0)
        ]

    def broken_rules(self, name: str, guests: Sequence[Guest] | None = None) -> list[str]:
        """The hard rules (of ``guests``; default: all) broken on node ``name``: hard
        anti-affinity partners on it together, guests on it that a strict node affinity keeps
        off."""
        rules = self.cluster.rules
        ids = None if guests is None else {g.id for g in guests}
        present = self.on.get(name, set())
        out: list[str] = []
        nodes = len(self.cluster.nodes)
        for rule in rules.guest_affinity:
            if rule.positive or not rule.hard or (ids is not None and not ids & set(rule.guests)):
                continue
            if len(set(rule.guests)) > nodes:
                continue  # more guests than nodes: ineffective (Proxmox's rule check)
            together = present & set(rule.guests)
            if len(together) > 1:
                usable = sum(1 for n in self.cluster.nodes if n.usable)
                out.append(
                    f"{name}: hard anti-affinity {rule.name}: {sorted(together)} (the rule keeps "
                    f"{len(set(rule.guests))} guests apart; {usable} of {nodes} nodes usable)"
                )
        for rule in rules.node_affinity:
            if rule.strict and name not in rule.nodes:
                for gid in sorted(present & set(rule.guests)):
                    if ids is None or gid in ids:
                        out.append(f"{name}: strict node affinity {rule.name}: {gid} is there")
        return out

    def breaches(
        self,
        nodes: Sequence[str] | None = None,
        *,
        measured: bool = True,
        guests: Sequence[Guest] | None = None,
    ) -> list[str]:
        """Every limit and hard rule broken on ``nodes`` (default: every node)."""
        names = [n.name for n in self.cluster.nodes] if nodes is None else nodes
        out: list[str] = []
        for name in names:
            out += self.over(name, measured=measured)
            out += self.broken_rules(name, guests)
        return out


def breaches(
    cluster: Cluster,
    nodes: Sequence[str] | None = None,
    *,
    measured: bool = True,
    guests: Sequence[Guest] | None = None,
) -> list[str]:
    """What is over capacity or against a hard rule in ``cluster`` (see :class:`Ledger`)."""
    return Ledger(cluster).breaches(nodes, measured=measured, guests=guests)


# --------------------------------------------------------------------------------------------
# One seed


@dataclass
class Violation:
    seed: int
    invariant: str
    at: float
    what: str

    def __str__(self) -> str:
        return f"seed {self.seed} at {self.at:.0f} s: {self.invariant}: {self.what}"


@dataclass
class SeedResult:
    """What one seed injected, checked and found."""

    seed: int
    simulated: float
    faults: dict[str, int] = field(default_factory=dict)
    checks: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    violation_count: int = 0
    #: Facts of the run: migrations, outcomes, operator cancels, the simulator's own breaches.
    facts: dict[str, int] = field(default_factory=dict)
    #: The longest the executor held the policy back, as a share of invariant 3's bound.
    longest_hold: float = 0.0


class _Platform:
    """The simulator as the controller's backend, with the checks of every request.

    It delegates everything to the simulator; ``start_migration`` checks invariant 1 before the
    request, may send the daemon a reload or a stop request while the start's reads would run
    (before the request), may kill the daemon (:class:`Crash`) before or after it, and checks
    invariants 1 and 2 on the state the start created.
    """

    name = "sim"
    read_only = False

    def __init__(self, run: Run) -> None:
        self.run = run
        self.sim = run.sim

    def observe(self) -> Cluster:
        return self.sim.observe()

    def poll(self, handle: Handle) -> Progress:
        return self.sim.poll(handle)

    def find_migration(self, move: Move, since: float) -> Handle | None:
        return self.sim.find_migration(move, since)

    def cancel(self, handle: Handle) -> bool:
        return self.sim.cancel(handle)

    def set_maintenance(self, node: str, enabled: bool) -> None:
        self.sim.set_maintenance(node, enabled)

    def close(self) -> None:
        pass

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        run = self.run
        now = self.sim.now()
        run.count("active mode")
        if not run.controller.config.active or not run.controller.executor.active:
            run.violate("active mode", f"{move.guest} {move.source} → {move.target} started")
        kill = run.rng.random() < run.mix.crash_probability
        before = kill and run.rng.random() < 0.5
        key = (move.guest, move.source, move.target, now)
        if before:
            run.unsent.append(key)
            run.faults["daemon killed mid-request"] += 1
            raise Crash("killed before the request was sent")
        run.maybe_signal()  # while the backend would read what the start needs
        try:
            handle = self.sim.start_migration(move, gate)
        except NotStarted:
            run.abandoned.append(key)
            raise
        except BackendError as exc:
            if exc.uncertain:
                run.check_request(move)
                run.check_start(move)
            else:
                run.unsent.append(key)
            raise
        run.check_request(move)
        run.check_start(move)
        if kill:
            run.faults["daemon killed mid-request"] += 1
            raise Crash("killed after the request was sent")
        return handle


class _Clock:
    """The simulator's clock, advanced one step at a time with a check (of invariant 3) after
    each."""

    def __init__(self, sim: Simulator, check: Callable[[], None]) -> None:
        self.sim = sim
        self.check = check
        self.step = float(sim.scenario.step)

    def now(self) -> float:
        return self.sim.now()

    def monotonic(self) -> float:
        return self.sim.monotonic()

    def sleep(self, seconds: float) -> None:
        end = min(self.sim.now() + seconds, self.sim.end)
        while self.sim.now() < end:
            self.sim.sleep(min(self.step, end - self.sim.now()))
            self.check()


class Run:
    """The controller against the simulator over one fault mix, with the invariant checks."""

    def __init__(
        self,
        mix: Mix,
        *,
        base: Scenario | None = None,
        controller_class: type[Controller] = Controller,
        history: History | None = None,
    ) -> None:
        self.mix = mix
        self.rng = random.Random(f"crash-{mix.seed}")
        #: Draws the signals that come before a request (apart, so the kills draw as before).
        self.signals = random.Random(f"signals-{mix.seed}")
        ex = mix.executor
        interval = mix.policy.interval
        #: The quiet: the controller's timeouts twice over and more, then the operator, and again.
        self.settle = 2 * ex.timeout + ex.stall_timeout + 4 * interval + 2 * ex.unseen_grace
        self.settle_again = ex.timeout + ex.stall_timeout + 4 * interval + 2 * ex.unseen_grace
        self.scenario = scenario_of(mix, base or builtin_scenario("demo"))
        length = mix.span + self.settle + self.settle_again + 600
        self.sim = Simulator(self.scenario, days=length / DAY)
        self.platform = _Platform(self)
        self.clock = _Clock(self.sim, self.check_progress)
        self.history = history or History(":memory:")
        self.config = Config(
            file=f"<faults {mix.seed}>",
            backend=BackendConfig("sim"),
            history=":memory:",
            lock="",
            mode="active",
            policy=mix.policy,
            executor=mix.executor,
        )
        self.controller_class = controller_class
        self.bound = ex.stall_timeout + 2 * interval + ex.poll_interval
        self.faults: Counter[str] = Counter()
        self.checks: Counter[str] = Counter()
        self.facts: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.violation_count = 0
        #: Requests that never started a migration: (guest, source, target, at).
        self.unsent: list[tuple[str, str, str, float]] = []
        #: Starts given up on before their request (a reload or a stop came): no row may tell.
        self.abandoned: list[tuple[str, str, str, float]] = []
        #: A signal the daemon has not handled yet (``reload``, ``stop``), the mode the reloaded
        #: file says, and the controller's migrations in the simulator when it came.
        self.pending: str | None = None
        self._reload_to = "active"
        self._started_then = 0
        #: Whether the faults have stopped (no more signals before a request).
        self.quiet = False
        self._reloads = list(mix.reloads)
        self._checked: Cluster | None = None
        self._placement: list[tuple[str, str | None, str]] = []
        self.decided = 0.0
        #: The longest the policy was held back, as a share of the bound.
        self.longest_hold = 0.0
        self.controller = self._controller()

    # -- bookkeeping -------------------------------------------------------------------------

    def count(self, invariant: str, n: int = 1) -> None:
        self.checks[invariant] += n

    def violate(self, invariant: str, what: str) -> None:
        self.violation_count += 1
        if sum(1 for v in self.violations if v.invariant == invariant) < KEEP:
            self.violations.append(Violation(self.mix.seed, invariant, self.sim.now(), what))

    # -- the controller ------------------------------------------------------------------------

    def _controller(self) -> Controller:
        controller = self.controller_class(
            self.config,
            self.platform,
            self.clock,
            self.history,
            on_event=self._event,
            on_cycle=self._cycle,
            hold_starts=self.holding,
        )
        self.decided = self.sim.now()
        return controller

    def restart(self) -> None:
        """Drop the daemon and start a new one on the same history and cluster (it reads the
        file as it is: a reload that was pending is in it)."""
        if self.pending == "reload":
            self.config = replace(self.config, mode=self._reload_to)
        self.pending = None
        self.controller = self._controller()

    # -- signals before a request --------------------------------------------------------------

    def holding(self) -> str | None:
        """What the daemon's signal handlers would tell the executor: why nothing may start."""
        if self.pending == "stop":
            return "opendrs is stopping"
        if self.pending == "reload":
            return "the configuration is being reloaded"
        return None

    def maybe_signal(self) -> None:
        """Perhaps a reload (the file saying shadow or still active) or a stop request, now —
        between the decision to start a migration and its request."""
        if self.quiet or self.pending is not None:
            return
        if self.signals.random() >= self.mix.signal_probability:
            return
        if self.signals.random() < 0.5:
            self.pending = "reload"
            self._reload_to = self.signals.choice(("shadow", "active"))
            self.faults["reloads before a request"] += 1
        else:
            self.pending = "stop"
            self.faults["stops before a request"] += 1
        self._started_then = self._controller_starts()

    def _controller_starts(self) -> int:
        return sum(1 for m in self.sim.migrations if m.cause == "controller")

    def _event(self, _event: Event) -> None:
        self.check()

    def _cycle(self, cycle: Cycle) -> None:
        decision = cycle.decision
        if decision is None or not explain(decision).startswith("a plan is still executing"):
            self.decided = cycle.at
        self.check()

    def _take_reload(self) -> Config | None:
        if self.pending == "reload":
            self.pending = None
            self.config = replace(self.config, mode=self._reload_to)
            return self.config
        if self._reloads and self.sim.now() >= self._reloads[0]:
            self._reloads.pop(0)
            mode = "shadow" if self.config.active else "active"
            self.config = replace(self.config, mode=mode)
            self.faults["reloads (mode changes)"] += 1
            return self.config
        return None

    def run_until(self, until: float) -> None:
        while self.sim.now() < until:
            self.count("no exception")
            try:
                self.controller.run(
                    until=until,
                    should_stop=lambda: self.pending == "stop",
                    take_reload=self._take_reload,
                    reload_pending=lambda: self.pending == "reload",
                )
                if self.pending == "stop":  # it stopped cleanly: the service manager restarts it
                    self.restart()
            except Crash:
                self.restart()
            except Exception as exc:  # the daemon would die of it: a violation, then a restart
                where = traceback.extract_tb(exc.__traceback__)[-1]
                self.violate(
                    "no exception",
                    f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})",
                )
                if self.checks["no exception"] > 10_000:
                    raise  # a harness that cannot get on: give up on this seed
                self.clock.sleep(RESTART_DELAY)  # as a service manager would restart it
                self.restart()
        self.check()

    # -- checks ----------------------------------------------------------------------------------

    def check_start(self, move: Move) -> None:
        """Invariant 2 at a start: the target, with the guest on it, within every limit."""
        self.count("capacity and rules")
        cluster = self.sim.peek()
        guest = cluster.guest(move.guest)
        for what in breaches(cluster, [move.target], guests=[guest]):
            self.violate("capacity and rules", f"start of {move.guest} → {move.target}: {what}")

    def check_request(self, move: Move) -> None:
        """Invariant 1 when the simulator accepted a request: starts were allowed."""
        self.count("active mode")
        held = self.holding()
        if held is not None:
            self.violate(
                "active mode", f"{move.guest} {move.source} → {move.target} requested: {held}"
            )

    def check_window(self) -> None:
        """Invariant 1 while a signal that came before a request is pending: the controller has
        begun no migration in the simulator since."""
        if self.pending is None:
            return
        self.count("active mode")
        started = self._controller_starts()
        if started > self._started_then:
            self.violate(
                "active mode",
                f"{started - self._started_then} migration(s) began while a {self.pending} "
                "request was pending",
            )
            self._started_then = started

    def check(self) -> None:
        """Invariants 3, 2 (in flight) and 1 (the window before a request), at a check point."""
        self.check_progress()
        self.check_flights()
        self.check_window()

    def check_progress(self) -> None:
        """Invariant 3: the executor holds the policy back for a bounded time only."""
        executor = self.controller.executor
        now = self.sim.now()
        self.count("decides again")
        if executor.busy and not executor.in_flight:
            self.longest_hold = max(self.longest_hold, (now - self.decided) / self.bound)
            if now - self.decided > self.bound:
                self.violate(
                    "decides again",
                    f"the executor has held the policy back since {self.decided:.0f} s "
                    f"(bound {self.bound} s), queue {len(executor.queued)}",
                )
                self.decided = now
        else:
            self.decided = now

    def check_flights(self) -> None:
        """Invariant 2 for the guests in flight, when the placement changed."""
        cluster = self.sim.peek()
        if cluster is self._checked:
            return
        self._checked = cluster
        # Sizes, disks and rules depend on the placement alone: checked when it changed.
        placement = [(g.node, g.migrating_to, g.state) for g in cluster.guests]
        if placement == self._placement:
            return
        self._placement = placement
        ledger = Ledger(cluster)
        explained: set[str] = set()
        for g in cluster.guests:
            if g.migrating_to is None:
                continue
            self.count("capacity and rules")
            for what in ledger.breaches([g.migrating_to], measured=False, guests=[g]):
                explained.add(what)
                self.violate("capacity and rules", f"{g.id} in flight to {g.migrating_to}: {what}")
        if any(b not in explained for b in ledger.breaches(measured=False)):
            self.facts["placements with a breach outside any flight"] += 1

    def check_history(self) -> None:
        """Invariant 4, at the end."""
        rows = self.history.migrations()
        ours = [r for r in self.sim.migrations if r.cause == "controller"]
        by_handle = {r.handle: r for r in ours}
        matched: set[str] = set()
        pending: dict[tuple[str, str, str, float], list[str]] = defaultdict(list)

        def agree(row_outcome: str, real: str) -> bool:
            return row_outcome == real or (row_outcome == "lost" and real == "failed")

        for row in rows:
            self.count("history")
            move = row.move
            if row.outcome is None:
                self.violate("history", f"row {row.id} ({move.guest}) still in flight at the end")
                continue
            self.facts[f"history rows {row.outcome}"] += 1
            if row.handle == PENDING:
                pending[(move.guest, move.source, move.target, row.started)].append(row.outcome)
                continue
            record = by_handle.get(row.handle)
            if record is None or row.handle in matched:
                self.violate("history", f"row {row.id}: no migration {row.handle} of its own")
                continue
            matched.add(row.handle)
            if (record.guest, record.source, record.target) != (
                move.guest,
                move.source,
                move.target,
            ):
                self.violate("history", f"row {row.id}: {row.handle} moved something else")
            elif not agree(row.outcome, record.outcome):
                self.violate(
                    "history",
                    f"{row.handle} of {move.guest} ended {record.outcome}, recorded {row.outcome}",
                )
        for record in ours:
            if record.handle in matched:
                continue
            self.count("history")
            if record.outcome == "running":
                self.violate("history", f"{record.handle} of {record.guest} still running")
                continue
            key = (record.guest, record.source, record.target, record.started)
            outcomes = pending.get(key)
            if not outcomes:
                self.violate(
                    "history",
                    f"{record.handle} of {record.guest} {record.source} → {record.target} "
                    f"({record.outcome}) has no history row",
                )
                continue
            choice = next((o for o in outcomes if agree(o, record.outcome)), None)
            if choice is None:
                self.violate(
                    "history",
                    f"{record.handle} of {record.guest} ended {record.outcome}, recorded "
                    f"{outcomes[0]}",
                )
                choice = outcomes[0]
            outcomes.remove(choice)
        for key in self.abandoned:
            self.count("history")
            if pending.get(key):
                self.violate(
                    "history",
                    f"a start of {key[0]} {key[1]} → {key[2]} given up on before its request "
                    f"left a row ({pending[key][0]})",
                )
                del pending[key]
        for key in self.unsent:
            outcomes = pending.get(key)
            if outcomes:
                choice = next((o for o in outcomes if o in ("failed", "lost")), outcomes[0])
                outcomes.remove(choice)
                if choice not in ("failed", "lost"):
                    self.violate("history", f"an unsent request of {key[0]} recorded {choice}")
        for key, outcomes in pending.items():
            for outcome in outcomes:
                self.violate(
                    "history",
                    f"a row of {key[0]} {key[1]} → {key[2]} at {key[3]:.0f} s ({outcome}) "
                    "has no migration and was not refused",
                )

    # -- the whole run ---------------------------------------------------------------------------

    def execute(self) -> SeedResult:
        mix = self.mix
        for at in mix.restarts:
            self.run_until(at)
            self.faults["daemon restarts"] += 1
            self.restart()
        self.run_until(mix.span)
        # The faults stop: nothing new starts, and what is in flight settles.
        self._reloads = []
        self.quiet = True
        if self.pending is not None:  # the daemon handles the signal first
            self.restart()
        self.config = replace(self.config, mode="shadow")
        self.controller.reload(self.config)
        self.run_until(mix.span + self.settle)
        self._operator()
        self.run_until(mix.span + self.settle + self.settle_again)
        self.check_history()
        return self.result()

    def _operator(self) -> None:
        """Cancel what still hangs: the controller could not (its request failed, or it never
        learnt the migration's handle)."""
        for record in self.sim.migrations:
            if record.cause != "controller" or record.outcome != "running":
                continue
            handle = Handle(record.handle, Move(record.guest, record.source, record.target), 0.0)
            for _ in range(100):
                try:
                    self.sim.cancel(handle)
                    break
                except BackendError:
                    self.clock.sleep(self.mix.executor.poll_interval)
            self.facts["migrations the operator cancelled"] += 1

    def result(self) -> SeedResult:
        stats = self.sim.stats()
        ours = [r for r in self.sim.migrations if r.cause == "controller"]
        faults = Counter(self.faults)
        faults["node failures"] = stats.node_failures
        faults["node failures for good"] = sum(1 for f in self.mix.node_failures if f[2] is None)
        faults["maintenance windows"] = sum(
            1 for e in self.sim.events if e.kind == "maintenance-on" and e.cause == "fault"
        )
        faults["API outages"] = len(self.mix.outages)
        faults["API calls refused"] = stats.api_errors
        faults["migrations failed part-way"] = sum(
            1 for r in ours if (r.reason or "").startswith("simulated migration failure")
        )
        faults["migrations hung"] = stats.hung_migrations
        faults["answers lost"] = stats.lost_answers
        facts = Counter(self.facts)
        facts["migrations started"] = len(ours)
        facts["migrations done"] = sum(1 for r in ours if r.outcome == "done")
        facts["HA recoveries"] = stats.recoveries
        facts["decisions"] = len(self.history.decisions())
        self.history.close()
        return SeedResult(
            seed=self.mix.seed,
            simulated=self.sim.now(),
            faults={k: faults[k] for k in FAULT_KINDS},
            checks={k: self.checks[k] for k in INVARIANTS},
            violations=self.violations,
            violation_count=self.violation_count,
            facts=dict(sorted(facts.items())),
            longest_hold=self.longest_hold,
        )


def run_seed(seed: int, days: float = 1.0) -> SeedResult:
    """Run one seed of the campaign."""
    base = builtin_scenario("demo")
    mix = make_mix(seed, base.cluster, days)
    return Run(mix, base=base).execute()


# --------------------------------------------------------------------------------------------
# The campaign


@dataclass
class Summary:
    seeds: int = 0
    simulated: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    facts: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    violation_count: int = 0
    longest_hold: float = 0.0
    #: Seeds with a violation, and the violations per invariant.
    failing: list[int] = field(default_factory=list)
    broken: Counter[str] = field(default_factory=Counter)

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.simulated += result.simulated
        self.faults.update(result.faults)
        self.checks.update(result.checks)
        self.facts.update(result.facts)
        self.violations.extend(result.violations)
        self.violation_count += result.violation_count
        if result.violation_count:
            self.failing.append(result.seed)
        self.broken.update(v.invariant for v in result.violations)
        self.longest_hold = max(self.longest_hold, result.longest_hold)

    def lines(self, *, wall: float | None = None, first: int = 0) -> Iterator[str]:
        last = first + self.seeds - 1
        yield f"seeds: {self.seeds} ({first}–{last})"
        yield f"simulated days: {self.simulated / DAY:,.1f} (faults, then the quiet)"
        yield "faults injected:"
        for kind in FAULT_KINDS:
            yield f"  {kind}: {self.faults[kind]:,}"
        yield f"invariant checks: {sum(self.checks.values()):,}"
        for invariant in INVARIANTS:
            yield f"  {invariant}: {self.checks[invariant]:,}"
        yield (
            f"longest the policy was held back: {100 * self.longest_hold:.0f} % of the bound "
            "(stall_timeout + 2 × interval + poll_interval)"
        )
        yield "facts:"
        for key in sorted(self.facts):
            yield f"  {key}: {self.facts[key]:,}"
        yield f"violations: {self.violation_count}"
        if self.failing:
            yield f"  in {len(self.failing)} seeds: {', '.join(map(str, self.failing))}"
            kinds = ", ".join(f"{k} {self.broken[k]}" for k in INVARIANTS if self.broken[k])
            yield f"  listed below (at most {KEEP} per seed and invariant): {kinds}"
        for violation in sorted(self.violations, key=lambda v: (v.seed, v.at)):
            yield f"  {violation}"
        if wall is not None:
            yield f"wall time: {wall:.1f} s"

    def as_dict(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "simulated_days": self.simulated / DAY,
            "faults": dict(self.faults),
            "checks": dict(self.checks),
            "facts": dict(self.facts),
            "longest_hold": self.longest_hold,
            "violation_count": self.violation_count,
            "failing_seeds": self.failing,
            "violations": [asdict(v) for v in self.violations],
        }


def _quiet() -> None:
    logging.getLogger("opendrs").setLevel(logging.CRITICAL)


def _one(args: tuple[int, float]) -> SeedResult:
    return run_seed(*args)


def campaign(
    seeds: Sequence[int],
    days: float = 1.0,
    *,
    jobs: int = 1,
    progress: Callable[[SeedResult], None] | None = None,
) -> Summary:
    """Run the seeds (over ``jobs`` processes); the summary, in seed order."""
    summary = Summary()
    work = [(seed, days) for seed in seeds]
    results: list[SeedResult] = []
    if jobs > 1 and len(work) > 1:
        context = multiprocessing.get_context("spawn")
        with context.Pool(jobs, initializer=_quiet) as pool:
            for result in pool.imap_unordered(_one, work):
                results.append(result)
                if progress is not None:
                    progress(result)
    else:
        for item in work:
            result = _one(item)
            results.append(result)
            if progress is not None:
                progress(result)
    for result in sorted(results, key=lambda r: r.seed):
        summary.add(result)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seeds", type=int, default=1000, help="seeds to run (default 1000)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument(
        "--days", type=float, default=1.0, help="simulated days of faults per seed (default 1)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes (default: 2, or 1 on one core)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    parser.add_argument("--verbose", action="store_true", help="one line per seed")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.start < 0 or args.jobs < 1:
        parser.error("--seeds and --jobs must be at least 1, --start at least 0")
    if not (args.days > 0 and math.isfinite(args.days)):
        parser.error("--days must be a positive number")
    _quiet()
    started = time.perf_counter()
    done = 0

    def progress(result: SeedResult) -> None:
        nonlocal done
        done += 1
        if args.verbose:
            print(
                f"seed {result.seed}: {result.facts.get('migrations started', 0)} migrations, "
                f"{sum(result.checks.values())} checks, {result.violation_count} violations",
                flush=True,
            )
        elif done % 50 == 0:
            print(f"… {done}/{args.seeds} seeds", file=sys.stderr, flush=True)

    seeds = range(args.start, args.start + args.seeds)
    summary = campaign(seeds, args.days, jobs=args.jobs, progress=progress)
    wall = time.perf_counter() - started
    for line in summary.lines(wall=wall, first=args.start):
        print(line)
    if args.json:
        data = summary.as_dict() | {"wall_seconds": wall, "days_of_faults": args.days}
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
    return 1 if summary.violation_count else 0


if __name__ == "__main__":
    sys.exit(main())
