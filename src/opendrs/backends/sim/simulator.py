"""The simulated cluster: a :class:`~opendrs.backends.base.Backend` and a
:class:`~opendrs.backends.base.Clock` in one.

The controller drives the :class:`Simulator` exactly as it drives a real cluster — ``observe``,
``start_migration``, ``poll``, ``set_maintenance`` — and takes its time from it: ``now()`` is
simulated seconds since the start and ``sleep(s)`` advances the simulation by ``s`` seconds. A
scenario (:mod:`opendrs.backends.scenario`) gives the cluster at time 0, each guest's workload, the
migration speed and the faults.

Time moves in steps of ``scenario.step`` seconds: the usage of every guest is sampled once per step
(:mod:`opendrs.backends.workload`), and the statistics of the stability report are taken once per
step, at its start, after the events of that instant (a migration ending, a node failing) and before
whatever the controller does then. Events themselves happen at their exact time: a migration of
``b`` bytes takes ``setup + b / bandwidth`` seconds and loads both nodes meanwhile.

The HA manager also fails guests back: an HA guest with ``failback`` on that a migration of the
controller's leaves outside the highest priority of its node affinity among the usable nodes is
moved back there (to the one with the fewest guests, then by name) a round
(:data:`FAILBACK_ROUND`) later, as Proxmox's ``select_service_node`` does every round.

Node failures follow an HA manager: after ``recovery_delay`` the HA-managed guests of the failed
node restart elsewhere, one at a time, each on the node that
:meth:`opendrs.engine.placement.PlacementState.place` ranks first for ``purpose="recover"`` (with
each restart seen by the next); guests that fit nowhere are tried again every hour and whenever a
node comes back or leaves maintenance. Guests that are not HA-managed stay down on the failed node
and start again when it returns. Maintenance only sets the node's flag: moving guests off is the
controller's job. A migration of the controller's may fail part-way, **hang** (it ends only when
:meth:`Simulator.cancel` stops it or one of its nodes fails) or lose its answer (it starts, but
``start_migration`` raises an ``uncertain`` :class:`~opendrs.backends.base.BackendError`).

A guest never moves to a node of another CPU architecture. On ``platform: incus`` a running
container cannot move live: it moves by a **restart** — stopped (loading no node) while its local
disks are copied, ``setup + disks / bandwidth`` seconds, then started on the target (on its source
when the move fails) — and only when the settings allow restart migration.

The simulator is deterministic: the same scenario and the same sequence of calls give the same
results, byte for byte. Randomness comes from numpy generators seeded from the scenario seed —
one per guest and workload component, one per random fault, one per migration (whether it fails,
when, whether it hangs or loses its answer), one for random API errors.

Accounting follows :mod:`opendrs.engine.usage` exactly, vectorised over steps: the balance
statistics use dynamic-mode loads as :class:`~opendrs.engine.usage.LoadModel` computes them
(the host's base load plus the measured use of the guests that load the node; a migrating guest
loads both nodes) over the capacity net of reserves; capacity violations follow
:class:`~opendrs.engine.usage.CapacityModel`.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

import numpy as np

from opendrs.engine.placement import PlacementState
from opendrs.engine.usage import loaded_nodes, net_capacity, safe_divide, tolerance
from opendrs.model.cluster import Cluster, Guest, Move, Node, updater
from opendrs.model.units import format_duration

from ..base import DONE, RUNNING, BackendError, Handle, Progress, StartGate, failed
from ..scenario import Fault, Scenario, builtin_scenario, load_scenario
from ..workload import UsageGenerator

__all__ = [
    "MigrationRecord",
    "NodeEvent",
    "NodeFractions",
    "Scenario",
    "SimStats",
    "Simulator",
    "builtin_scenario",
    "load_scenario",
]

Outcome = Literal["running", "done", "failed"]
Cause = Literal["controller", "recovery", "snapshot", "failback"]
NodeEventKind = Literal["failed", "recovered", "maintenance-on", "maintenance-off"]

#: Seconds from a migration that leaves an HA guest below its top node-affinity tier to the HA
#: manager's round that moves it back (failback; a CRM round is about 10 s, pve-ha-manager
#: ``CRM.pm``).
FAILBACK_ROUND: Final = 10.0
#: Pending HA recoveries are tried again at least this often (seconds).
RECOVERY_RETRY: Final = 3600.0
#: A migration that fails does so after this share of its duration (drawn uniformly between).
FAIL_AFTER: Final = (0.1, 0.9)
#: Steps of usage generated at once (fewer for very large clusters, to bound memory).
MAX_BLOCK: Final = 1440
_BLOCK_CELLS: Final = 2_000_000


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class MigrationRecord:
    """One migration: started by the controller, an HA recovery, or in flight in the snapshot.

    An HA recovery is a restart, not a migration: it starts and ends at the same moment.
    """

    handle: str
    guest: str
    source: str
    target: str
    started: float
    ended: float | None
    outcome: Outcome
    reason: str | None
    cause: Cause
    #: Bytes copied (measured memory plus local disks) — 0 for a recovery.
    bytes: int
    #: A restart move (a running container on ``platform: incus``): the guest is stopped from
    #: ``started`` to ``ended`` and starts again on the target (on its source when it fails).
    restart: bool = False


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """A node failed or came back, or entered or left maintenance."""

    time: float
    node: str
    kind: NodeEventKind
    #: ``fault`` (the scenario) or ``controller`` (``set_maintenance``).
    cause: Literal["fault", "controller"]


@dataclass(frozen=True, slots=True)
class NodeFractions:
    """Every node's load now, as fractions of its capacity net of reserves (dynamic mode)."""

    names: tuple[str, ...]
    cpu: tuple[float, ...]
    memory: tuple[float, ...]
    online: tuple[bool, ...]
    maintenance: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class SimStats:
    """The figures of a run so far, for the stability report."""

    #: Simulated seconds, and steps taken (each step is sampled once).
    seconds: float
    steps: int
    #: The imbalance yardstick (:func:`~opendrs.engine.imbalance.balance_spread`) per step.
    threshold: float
    steps_above: int
    mean_imbalance: float
    max_imbalance: float
    last_imbalance: float
    #: Highest load fraction (cpu or memory) of any online node at any step.
    max_node_load: float
    #: The hot level, and for each online node the steps whose cpu or memory load, averaged over
    #: the hot window (5 minutes), was above it (``hot_steps``: the total; ``max_hot_steps``: of
    #: the node with the most).
    hot: float
    hot_steps: int
    max_hot_steps: int
    #: The 95th percentile over the steps of the most loaded online node's load (the same
    #: averaged cpu or memory fraction).
    p95_node_load: float
    #: (node, step) pairs where some hard capacity dimension was exceeded.
    capacity_violations: int
    #: Migrations the controller started, and how they ended so far.
    migrations: int
    migrations_done: int
    migrations_failed: int
    migrations_running: int
    #: Bytes copied by the controller's migrations.
    migrated_bytes: int
    #: Guests restarted elsewhere by HA after a node failure.
    recoveries: int
    node_failures: int
    #: Calls refused with a simulated API error.
    api_errors: int
    #: The controller's migrations that hung (``migration-hang``), and requests whose answer was
    #: lost although the migration started (``api-lost-answer``).
    hung_migrations: int = 0
    lost_answers: int = 0
    #: The controller's restart moves, and the seconds they kept their guests stopped.
    restart_migrations: int = 0
    restart_downtime: float = 0.0

    @property
    def fraction_above(self) -> float:
        """Share of the steps whose spread was above the threshold."""
        return self.steps_above / self.steps if self.steps else 0.0


#: The load fraction above which a node runs hot, and the window its load is averaged over for it.
HOT: Final = 0.85
HOT_WINDOW: Final = 300.0
#: Node load fractions (cpu, memory), each (nodes, steps).
Fractions = tuple[np.ndarray, np.ndarray]


def _percentile(parts: list[np.ndarray], q: float) -> float:
    """The ``q``-th percentile of the values of ``parts`` together (0 when there are none)."""
    values = np.concatenate(parts) if parts else np.zeros(0)
    return float(np.percentile(values, q)) if values.size else 0.0


#: Guest fields the simulator changes; the others stay as in the snapshot. ``observe()`` copies
#: every running guest each time (its use and uptime change every step), with a fast ``replace``.
_DYNAMIC: Final = (
    "node",
    "state",
    "cpu_used",
    "memory_used",
    "uptime",
    "ha_state",
    "migrating_to",
)
_BUILD_GUEST: Final = updater(Guest, *_DYNAMIC)


# --------------------------------------------------------------------------------------------
# The simulator


class _Migration:
    """A migration in the simulator's books (mutable until it ends)."""

    __slots__ = (
        "bytes",
        "cause",
        "ended",
        "guest",
        "handle",
        "hangs",
        "lost_answer",
        "move",
        "outcome",
        "reason",
        "restart",
        "source",
        "started",
        "target",
    )

    def __init__(
        self,
        handle: str,
        move: Move,
        guest: int,
        source: int,
        target: int,
        started: float,
        cause: Cause,
        size: int,
        restart: bool = False,
    ) -> None:
        self.handle = handle
        self.move = move
        self.guest = guest
        self.source = source
        self.target = target
        self.started = started
        self.cause: Cause = cause
        self.bytes = size
        self.restart = restart
        self.ended: float | None = None
        self.outcome: Outcome = "running"
        self.reason: str | None = None
        #: It hangs: it ends only when cancelled or when one of its nodes fails.
        self.hangs = False
        #: The request's answer is lost: ``start_migration`` raises although it started.
        self.lost_answer = False

    def record(self) -> MigrationRecord:
        return MigrationRecord(
            self.handle,
            self.move.guest,
            self.move.source,
            self.move.target,
            self.started,
            self.ended,
            self.outcome,
            self.reason,
            self.cause,
            self.bytes,
            self.restart,
        )


class Simulator:
    """A simulated cluster driven through the :class:`~opendrs.backends.base.Backend` protocol,
    and the controller's :class:`~opendrs.backends.base.Clock`.

    ``days`` overrides the scenario's duration; ``threshold`` is the balance spread above which a
    step counts in :attr:`SimStats.steps_above`. The spread of a step is taken on the node loads
    averaged over the last ``window`` seconds (rounded to whole steps; one step or less: the
    instantaneous loads) — the way an operator's dashboard shows load, so that a one-minute spike
    that no scheduler could or should chase does not count as imbalance. :meth:`sleep` never goes
    past :attr:`end`.
    """

    name = "sim"
    read_only = False

    def __init__(
        self,
        scenario: Scenario,
        *,
        days: float | None = None,
        threshold: float = 0.15,
        window: float = 1800.0,
        hot: float = HOT,
        hot_window: float = HOT_WINDOW,
    ) -> None:
        if days is not None and not (days > 0 and math.isfinite(days)):
            raise ValueError(f"days must be a positive number, got {days!r}")
        for name, seconds in (("window", window), ("hot window", hot_window)):
            if not (seconds >= 0 and math.isfinite(seconds)):
                raise ValueError(f"{name} must be a number of seconds ≥ 0, got {seconds!r}")
        if not (threshold >= 0 and math.isfinite(threshold)):
            raise ValueError(f"threshold must be a number ≥ 0, got {threshold!r}")
        if not (hot > 0 and math.isfinite(hot)):
            raise ValueError(f"hot must be a load fraction > 0, got {hot!r}")
        self.scenario = scenario
        self.threshold = float(threshold)
        self.hot = float(hot)
        cluster = scenario.cluster
        settings = cluster.settings
        self._cluster0 = cluster
        self._step = float(scenario.step)
        self.end = float(days * 86400.0 if days is not None else scenario.duration)
        self._now = 0.0
        self._closed = False
        self._version = 0
        self._n_steps = self._count_steps(self.end, inclusive=False)

        # -- nodes ----------------------------------------------------------------------------
        nodes = cluster.nodes
        self._nodes: list[Node] = list(nodes)
        self._node_names = [n.name for n in nodes]
        self._node_index = dict(cluster.node_index)
        n_nodes = len(nodes)
        self._cap = net_capacity(cluster)
        self._base = np.array(
            [[n.base_cpu, float(n.base_memory)] for n in nodes], dtype=np.float64
        ).reshape(n_nodes, 2)
        self._online = np.array([n.online for n in nodes], dtype=bool)
        self._fail_count = np.array([0 if n.online else 1 for n in nodes], dtype=np.int64)
        self._maint_manual = np.array([n.maintenance for n in nodes], dtype=bool)
        self._maint_count = np.zeros(n_nodes, dtype=np.int64)
        self._weights = (float(settings.weight_cpu), float(settings.weight_memory))
        self._dynamic = settings.mode == "dynamic"
        pools = sorted(
            {p for n in nodes for p in n.storage}
            | {d.pool for g in cluster.guests for d in g.disks if d.local}
        )
        self._cfg_limit = self._cap * np.array(
            [settings.cpu_overcommit, settings.memory_overcommit]
        )
        self._disk_limit = np.array(
            [[float(n.storage.get(p, 0)) for p in pools] for n in nodes], dtype=np.float64
        ).reshape(n_nodes, len(pools))

        # -- guests ---------------------------------------------------------------------------
        guests = cluster.guests
        n_guests = len(guests)
        self._ids = [g.id for g in guests]
        self._guest_index = dict(cluster.guest_index)
        self._static = list(guests)  # templates for the fields that never change
        self._ha = [g.ha for g in guests]
        self._ha_state0 = [g.ha_state for g in guests]
        self._ha_state = list(self._ha_state0)
        self._state = [g.state for g in guests]
        self._node = np.array([self._node_index[g.node] for g in guests], dtype=np.int64)
        self._guest_node_names = [g.node for g in guests]
        self._target_names: list[str | None] = [None] * n_guests
        self._migration_of: list[_Migration | None] = [None] * n_guests
        self._down = np.zeros(n_guests, dtype=bool)
        self._uptime_offset = np.array([float(g.uptime) for g in guests])
        self._up = np.zeros(n_guests)
        #: Nodes each guest loads (``loaded_nodes``), and nodes its local disks occupy.
        self._load_nodes: list[tuple[int, ...]] = [()] * n_guests
        self._hold_nodes: list[tuple[int, ...]] = [()] * n_guests
        self._pairs_version = -1
        self._load_pairs = _Pairs.build([], n_nodes)
        self._hold_pairs = _Pairs.build([], n_nodes)
        self._cfg = np.array([[g.cpu, float(g.memory)] for g in guests], dtype=np.float64).reshape(
            n_guests, 2
        )
        pool_col = {p: i for i, p in enumerate(pools)}
        self._disks = np.zeros((n_guests, len(pools)))
        for j, g in enumerate(guests):
            for d in g.disks:
                if d.local:
                    self._disks[j, pool_col[d.pool]] += float(d.size)
        self._local_bytes = [g.local_disk_bytes for g in guests]
        self._devices = [g.devices for g in guests]
        self._kind = [g.kind for g in guests]
        #: The architecture each guest needs (its own, else its node's at the start): it never
        #: moves to a node of another.
        self._arch = [cluster.guest_arch(g) for g in guests]
        #: Running containers move by a restart (stop, move, start), if the settings allow it.
        self._restart_moves = scenario.platform == "incus"
        self._pending: set[int] = set()
        self._down_at = np.zeros(n_guests)
        #: Bumped when a guest's state changes; with its use, what decides rebuilding it.
        self._stamp = np.zeros(n_guests, dtype=np.int64)
        self._last_built: (
            tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[Guest, ...]] | None
        ) = None
        for j in range(n_guests):
            self._refresh(j)

        # -- usage ----------------------------------------------------------------------------
        block = max(1, min(MAX_BLOCK, _BLOCK_CELLS // max(n_guests, 1)))
        self._block = block
        self._usage = UsageGenerator(
            guests,
            scenario.patterns(),
            seed=scenario.seed,
            step=self._step,
            block=block,
            trace=scenario.trace,
        )
        self._usage_index = -1
        self._usage_cpu = np.zeros((n_guests, 0))
        self._usage_mem = np.zeros((n_guests, 0))

        # -- statistics -------------------------------------------------------------------------
        self._recorded = 0
        self._spreads: list[np.ndarray] = []
        #: Steps averaged for the spread and for the hot level, and the node fractions (cpu,
        #: memory) of the last steps the longer of the two needs.
        self._window_steps = max(1, round(window / self._step))
        self._hot_steps = max(1, round(hot_window / self._step))
        self._tail: tuple[np.ndarray, np.ndarray] | None = None
        #: Per node, the steps it ran hot; per step, the most loaded online node's load.
        self._hot_count = np.zeros(n_nodes, dtype=np.int64)
        self._peaks: list[np.ndarray] = []
        self._violations = 0
        self._max_load = 0.0
        self._derived_version = -1
        self._cfg_over = np.zeros(n_nodes, dtype=bool)
        self._usable = np.zeros(n_nodes, dtype=bool)

        # -- events -----------------------------------------------------------------------------
        self._events: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self._seq = 0
        self._handles = 0
        self._migrations: list[_Migration] = []
        self._by_handle: dict[str, _Migration] = {}
        self._node_events: list[NodeEvent] = []
        self._recoveries = 0
        self._node_failures = 0
        self._api_errors = 0
        self._recover_at: set[float] = set()
        self._armed: list[tuple[float, str | None]] = []  # scheduled migration failures
        #: Scheduled hangs and lost answers (``at``, guest), and their per-migration odds
        #: (probability, guest) — a guest of ``None``: any guest.
        self._armed_hangs: list[tuple[float, str | None]] = []
        self._armed_lost: list[tuple[float, str | None]] = []
        self._hang_odds: list[tuple[float, str | None]] = []
        self._lost_odds: list[tuple[float, str | None]] = []
        self._hung = 0
        self._lost_answers = 0
        self._windows: list[tuple[float, float]] = []
        probability = 0.0
        for index, fault in enumerate(scenario.faults):
            probability = self._plan_fault(index, fault, probability)
        self._windows = _merge(self._windows)
        self._window_starts = [start for start, _ in self._windows]
        self._api_probability = probability
        self._api_rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(scenario.seed, spawn_key=(4,)))
        )
        self._observed: tuple[tuple[float, int], Cluster] | None = None
        self._nodes_tuple: tuple[Node, ...] = tuple(self._nodes)
        # Guests on a node that is down at the start are down until it returns (HA: recovered).
        for j in range(n_guests):
            if not self._online[self._node[j]] and self._state[j] != "stopped":
                self._take_down(j)
        if self._pending:
            self._request_recovery(scenario.recovery_delay)
        # Migrations in flight in the snapshot go on from time 0 (and succeed).
        for j, g in enumerate(guests):
            if g.migrating_to is not None and self._state[j] != "stopped":
                self._begin(j, self._node_index[g.migrating_to], "snapshot", fail=False)
        self._advance(0.0)

    # -- Clock ----------------------------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since the start."""
        return self._now

    def sleep(self, seconds: float) -> None:
        """Advance the simulation by ``seconds`` (never past :attr:`end`)."""
        if not seconds > 0:
            return
        self._advance(min(self._now + float(seconds), self.end))

    @property
    def finished(self) -> bool:
        return self._now >= self.end

    # -- Backend --------------------------------------------------------------------------------

    def observe(self) -> Cluster:
        """The cluster now: measured usage of this step, guests in flight with ``migrating_to``."""
        self._api("observe")
        return self.peek()

    def peek(self) -> Cluster:
        """The cluster now, as :meth:`observe` returns it, but never refused by a simulated API
        error and without a random draw: the truth an invariant checker (``bench/faults.py``) or a
        live display looks at. Calling it changes nothing in the run."""
        key = (self._now, self._version)
        if self._observed is not None and self._observed[0] == key:
            return self._observed[1]
        cluster = self._build_cluster()
        self._observed = (key, cluster)
        return cluster

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        """Start a migration — live, or on ``platform: incus`` a running container's restart
        move; :class:`BackendError` when the cluster refuses it (also a move to a node of
        another architecture). The call is the request: ``gate`` is asked first
        (:class:`~opendrs.backends.base.NotStarted` when it is closed, and nothing happens)."""
        if gate is not None:
            gate.enter(f"start_migration of {move.guest} to {move.target}")
        self._api("start_migration")
        j = self._guest_index.get(move.guest)
        if j is None:
            raise BackendError(f"guest {move.guest} does not exist", transient=False)
        target = self._node_index.get(move.target)
        if target is None:
            raise BackendError(f"node {move.target} does not exist", transient=False)
        current = self._guest_node_names[j]
        if current != move.source:
            raise BackendError(
                f"guest {move.guest} is on {current}, not on {move.source}", transient=False
            )
        if move.target == move.source:
            raise BackendError(f"guest {move.guest} is already on {move.target}", transient=False)
        if self._migration_of[j] is not None:
            raise BackendError(
                f"guest {move.guest} is already migrating to {self._target_names[j]}",
                transient=True,
            )
        if self._state[j] == "stopped":
            why = f" (node {current} is down)" if self._down[j] else ""
            raise BackendError(f"guest {move.guest} is not running{why}", transient=False)
        if self._devices[j]:
            raise BackendError(
                f"guest {move.guest} cannot be live-migrated: local device {self._devices[j][0]}",
                transient=False,
            )
        if self._nodes[target].arch != self._arch[j]:
            raise BackendError(
                f"guest {move.guest} ({self._arch[j]}) cannot move to node {move.target} "
                f"({self._nodes[target].arch}): another architecture",
                transient=False,
            )
        restart = self._restart_moves and self._kind[j] == "ct"
        if restart and not self._cluster0.settings.allow_restart_migration:
            raise BackendError(
                f"guest {move.guest} is a running container: it can only move by a restart "
                "migration, which settings.allow_restart_migration does not allow",
                transient=False,
            )
        if not self._online[target]:
            raise BackendError(f"node {move.target} is offline", transient=True)
        if self._maintenance(target):
            raise BackendError(f"node {move.target} is in maintenance", transient=True)
        self._flush(self._due())
        migration = self._begin(j, target, "controller", fail=True, restart=restart)
        if migration.lost_answer:
            self._lost_answers += 1
            raise BackendError(
                f"simulated lost answer: start_migration of {move.guest} to {move.target} got no "
                "answer (the migration may have started)",
                transient=True,
                uncertain=True,
            )
        return Handle(migration.handle, move, migration.started)

    def poll(self, handle: Handle) -> Progress:
        """Where a migration this simulator started stands now."""
        self._api("poll")
        migration = self._by_handle.get(handle.id)
        if migration is None:
            raise BackendError(f"unknown migration {handle.id}", transient=False)
        if migration.move != handle.move:
            raise BackendError(
                f"migration {handle.id} moves {migration.move.guest} from "
                f"{migration.move.source} to {migration.move.target}, not "
                f"{handle.move.guest} from {handle.move.source} to {handle.move.target}",
                transient=False,
            )
        if migration.outcome == "running":
            return RUNNING
        if migration.outcome == "done":
            return DONE
        return failed(migration.reason or "migration failed")

    def find_migration(self, move: Move, since: float) -> Handle | None:
        """The controller's migration of ``move`` started at ``since`` or later (the first)."""
        self._api("find_migration")
        for migration in self._migrations:
            if (
                migration.cause == "controller"
                and migration.move == move
                and migration.started >= since
            ):
                return Handle(migration.handle, move, migration.started)
        return None

    def cancel(self, handle: Handle) -> bool:
        """Stop a running migration this simulator started: it ends failed, the guest stays."""
        self._api("cancel")
        migration = self._by_handle.get(handle.id)
        if migration is None:
            raise BackendError(f"unknown migration {handle.id}", transient=False)
        if migration.outcome == "running":
            self._flush(self._due())
            self._end(migration, "cancelled by the controller")
        return True

    def set_maintenance(self, node: str, enabled: bool) -> None:
        """Put ``node`` into maintenance or take it out (the simulator moves nothing itself)."""
        self._api("set_maintenance")
        n = self._node_index.get(node)
        if n is None:
            raise BackendError(f"node {node} does not exist", transient=False)
        if bool(self._maint_manual[n]) == bool(enabled):
            return
        self._flush(self._due())
        before = self._maintenance(n)
        self._maint_manual[n] = bool(enabled)
        self._node_changed(n, before, "controller")

    def close(self) -> None:
        """Refuse further backend calls (the clock keeps working)."""
        self._closed = True

    # -- results --------------------------------------------------------------------------------

    @property
    def migrations(self) -> tuple[MigrationRecord, ...]:
        """Every migration so far, in the order they started (HA recoveries included)."""
        return tuple(m.record() for m in self._migrations)

    @property
    def events(self) -> tuple[NodeEvent, ...]:
        """Node failures, returns, and maintenance changes, in order."""
        return tuple(self._node_events)

    def stats(self) -> SimStats:
        """The statistics of the run so far (every step up to now)."""
        self._flush(self._due())
        spreads = self.imbalance_series()
        controller = [m for m in self._migrations if m.cause == "controller"]
        return SimStats(
            seconds=self._now,
            steps=int(spreads.size),
            threshold=self.threshold,
            steps_above=int(np.count_nonzero(spreads > self.threshold)),
            mean_imbalance=float(spreads.mean()) if spreads.size else 0.0,
            max_imbalance=float(spreads.max()) if spreads.size else 0.0,
            last_imbalance=float(spreads[-1]) if spreads.size else 0.0,
            max_node_load=self._max_load,
            hot=self.hot,
            hot_steps=int(self._hot_count.sum()),
            max_hot_steps=int(self._hot_count.max(initial=0)),
            p95_node_load=_percentile(self._peaks, 95.0),
            capacity_violations=self._violations,
            migrations=len(controller),
            migrations_done=sum(m.outcome == "done" for m in controller),
            migrations_failed=sum(m.outcome == "failed" for m in controller),
            migrations_running=sum(m.outcome == "running" for m in controller),
            migrated_bytes=sum(m.bytes for m in controller),
            recoveries=self._recoveries,
            node_failures=self._node_failures,
            api_errors=self._api_errors,
            hung_migrations=self._hung,
            lost_answers=self._lost_answers,
            restart_migrations=sum(m.restart for m in controller),
            restart_downtime=sum(
                (self._now if m.ended is None else m.ended) - m.started
                for m in controller
                if m.restart
            ),
        )

    def policy_defaults(self, strategy: str) -> tuple[dict[str, Any], list[str]]:
        """The policy fields the platform's own settings set, and notes, as a real backend
        tells them to the controller: on ``platform: incus``, the scenario's
        ``cluster.rebalance.*`` keys read as the Incus backend reads them; none otherwise."""
        if self.scenario.platform != "incus":
            return {}, []
        from opendrs.backends.incus.rebalance import policy_defaults

        return policy_defaults(self.scenario.server_config, strategy)

    def imbalance_series(self) -> np.ndarray:
        """The balance spread of every step so far (a copy)."""
        self._flush(self._due())
        return np.concatenate(self._spreads) if self._spreads else np.zeros(0)

    def node_fractions(self) -> NodeFractions:
        """Every node's cpu and memory load fraction now — cheap, for a live display."""
        cpu, memory = self._fractions_now()
        maintenance = self._maint_manual | (self._maint_count > 0)
        return NodeFractions(
            tuple(self._node_names),
            tuple(cpu.tolist()),
            tuple(memory.tolist()),
            tuple(self._online.tolist()),
            tuple(maintenance.tolist()),
        )

    # -- time and steps -------------------------------------------------------------------------

    def _count_steps(self, t: float, *, inclusive: bool) -> int:
        """How many step starts ``k·step`` are ``≤ t`` (``< t`` unless ``inclusive``), uncapped."""
        step = self._step
        if t < 0:
            return 0
        k = int(t // step) + 1
        while k > 0 and ((k - 1) * step > t if inclusive else (k - 1) * step >= t):
            k -= 1
        while k * step <= t if inclusive else k * step < t:
            k += 1
        return k

    def _due(self) -> int:
        """Steps whose start has been reached (they are recorded lazily)."""
        return min(self._count_steps(self._now, inclusive=True), self._n_steps)

    def _advance(self, target: float) -> None:
        """Process every event up to ``target`` in order, then set the time to ``target``."""
        events = self._events
        while events and events[0][0] <= target:
            when = events[0][0]
            # Steps before the event see the state before it; a step at the event's instant
            # sees the state after it.
            self._flush(min(self._count_steps(when, inclusive=False), self._n_steps))
            _, _, kind, args = heapq.heappop(events)
            self._now = max(self._now, when)
            self._handle(kind, args)
        self._now = max(self._now, target)

    def _push(self, when: float, kind: str, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, args))

    def _columns(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Usage of every guest at step ``k`` (cpu cores, memory bytes)."""
        b = k // self._block
        if b != self._usage_index:
            # The generator keeps one block: record the steps before ``k`` while it still can.
            self._flush(min(k, self._n_steps))
            self._load_block(b)
        col = k - b * self._block
        return self._usage_cpu[:, col], self._usage_mem[:, col]

    def _load_block(self, b: int) -> None:
        if b != self._usage_index:
            self._usage_cpu, self._usage_mem = self._usage.block(b)
            self._usage_index = b

    def _step_now(self) -> int:
        return max(self._count_steps(self._now, inclusive=True) - 1, 0)

    # -- statistics -----------------------------------------------------------------------------

    def _derive(self) -> None:
        """Node masks and configured commitments, when the state changed."""
        if self._derived_version == self._version:
            return
        self._derived_version = self._version
        maintenance = self._maint_manual | (self._maint_count > 0)
        self._usable = self._online & ~maintenance
        committed = self._pairs()[0].sum(self._cfg)
        over = np.any(committed > self._cfg_limit + tolerance(self._cfg_limit), axis=1)
        if self._disks.shape[1]:
            stored = self._pairs()[1].sum(self._disks)
            over |= np.any(stored > self._disk_limit + tolerance(self._disk_limit), axis=1)
        self._cfg_over = over

    def _flush(self, limit: int) -> None:
        """Record the statistics of steps ``[recorded, limit)`` with the current state."""
        while self._recorded < limit:
            k0 = self._recorded
            b = k0 // self._block
            k1 = min(limit, (b + 1) * self._block)
            self._load_block(b)
            self._record(k0 - b * self._block, k1 - b * self._block)
            self._recorded = k1

    def _record(self, c0: int, c1: int) -> None:
        self._derive()
        up = self._up[:, None]
        loads = self._pairs()[0]
        cpu = self._base[:, 0:1] + loads.sum(self._usage_cpu[:, c0:c1] * up)
        mem = self._base[:, 1:2] + loads.sum(self._usage_mem[:, c0:c1] * up)
        cap_cpu = self._cap[:, 0:1]
        cap_mem = self._cap[:, 1:2]
        f_cpu = safe_divide(cpu, cap_cpu)
        f_mem = safe_divide(mem, cap_mem)
        spread = np.zeros(c1 - c0)
        usable = self._usable
        averaged, short = self._averaged(f_cpu, f_mem)
        self._count_hot(short)
        for fractions, weight in ((averaged[0], self._weights[0]), (averaged[1], self._weights[1])):
            if weight <= 0:
                continue
            values = fractions[usable]
            if values.shape[0] < 2:
                continue
            finite = np.isfinite(values)
            high = np.where(finite, values, -np.inf).max(axis=0)
            low = np.where(finite, values, np.inf).min(axis=0)
            spread = np.maximum(spread, np.where(finite.sum(axis=0) >= 2, high - low, 0.0))
        self._spreads.append(spread)
        online = self._online
        if online.any():
            both = np.concatenate((f_cpu[online], f_mem[online]))
            both = both[np.isfinite(both)]
            if both.size:
                self._max_load = max(self._max_load, float(both.max()))
        over = np.broadcast_to(self._cfg_over[:, None], cpu.shape)
        if self._dynamic:
            over = (
                over | (cpu > cap_cpu + tolerance(cap_cpu)) | (mem > cap_mem + tolerance(cap_mem))
            )
        self._violations += int(np.count_nonzero(over))

    def _averaged(self, f_cpu: np.ndarray, f_mem: np.ndarray) -> tuple[Fractions, Fractions]:
        """Node fractions (cpu, memory), each (N, steps), averaged over the window ending at each
        step: the spread's window, and the hot level's."""
        keep = max(self._window_steps, self._hot_steps) - 1
        out: list[np.ndarray] = []
        short: list[np.ndarray] = []
        tails: list[np.ndarray] = []
        for k, block in enumerate((f_cpu, f_mem)):
            tail = self._tail[k] if self._tail is not None else block[:, :0]
            joined = np.concatenate((tail, block), axis=1)
            sums = np.cumsum(np.concatenate((np.zeros((joined.shape[0], 1)), joined), axis=1), 1)
            ends = np.arange(tail.shape[1] + 1, joined.shape[1] + 1)
            for w, into in ((self._window_steps, out), (self._hot_steps, short)):
                if w <= 1:
                    into.append(block)
                    continue
                starts = np.maximum(ends - w, 0)
                with np.errstate(invalid="ignore"):
                    into.append((sums[:, ends] - sums[:, starts]) / (ends - starts))
            tails.append(joined[:, max(joined.shape[1] - keep, 0) :])
        self._tail = (tails[0], tails[1])
        return (out[0], out[1]), (short[0], short[1])

    def _count_hot(self, fractions: Fractions) -> None:
        """Count the steps each online node ran above the hot level, and keep each step's most
        loaded node's load (fractions averaged over the hot window; unknown ones left out)."""
        online = self._online
        load = np.fmax(fractions[0][online], fractions[1][online])
        load = np.where(np.isfinite(load), load, np.nan)
        steps = load.shape[1]
        if not load.shape[0]:
            self._peaks.append(np.zeros(steps))
            return
        self._hot_count[online] += np.count_nonzero(load > self.hot, axis=1)
        known = np.isfinite(load).any(axis=0)
        peak = np.zeros(steps)
        peak[known] = np.nanmax(load[:, known], axis=0)
        self._peaks.append(peak)

    def _fractions_now(self) -> tuple[np.ndarray, np.ndarray]:
        cpu_use, mem_use = self._columns(self._step_now())
        loads = self._pairs()[0]
        cpu = self._base[:, 0] + loads.sum(cpu_use * self._up)
        mem = self._base[:, 1] + loads.sum(mem_use * self._up)
        return safe_divide(cpu, self._cap[:, 0]), safe_divide(mem, self._cap[:, 1])

    def _pairs(self) -> tuple[_Pairs, _Pairs]:
        """The (guest, node) pairs of load and of local storage, rebuilt after changes."""
        if self._pairs_version != self._version:
            n_nodes = len(self._node_names)
            self._load_pairs = _Pairs.build(self._load_nodes, n_nodes)
            self._hold_pairs = _Pairs.build(self._hold_nodes, n_nodes)
            self._pairs_version = self._version
        return self._load_pairs, self._hold_pairs

    # -- guests and nodes -----------------------------------------------------------------------

    def _maintenance(self, n: int) -> bool:
        return bool(self._maint_manual[n] or self._maint_count[n] > 0)

    def _refresh(self, j: int) -> None:
        """Recompute which nodes guest ``j`` loads, after its state changed."""
        status = Guest(
            self._ids[j],
            self._guest_node_names[j],
            state=self._state[j],  # type: ignore[arg-type]
            ha=self._ha[j],
            ha_state=self._ha_state[j],
            migrating_to=self._target_names[j],
        )
        loaded = loaded_nodes(status)
        index = self._node_index
        self._load_nodes[j] = tuple(index[name] for name in loaded)
        self._hold_nodes[j] = tuple(index[name] for name in dict.fromkeys((status.node, *loaded)))
        self._up[j] = 0.0 if self._state[j] == "stopped" else 1.0
        self._stamp[j] += 1
        self._version += 1

    def _node_changed(self, n: int, maintenance_before: bool, cause: str) -> None:
        node = self._nodes[n]
        maintenance = self._maintenance(n)
        online = bool(self._online[n])
        if node.online == online and node.maintenance == maintenance:
            return
        if maintenance != maintenance_before:
            kind = "maintenance-on" if maintenance else "maintenance-off"
            self._node_events.append(NodeEvent(self._now, node.name, kind, cause))  # type: ignore[arg-type]
        self._nodes[n] = replace(node, online=online, maintenance=maintenance)
        usable_before = node.online and not node.maintenance
        self._nodes_tuple = tuple(self._nodes)
        self._version += 1
        if online and not maintenance and not usable_before and self._pending:
            self._request_recovery(self._now)

    def _take_down(self, j: int) -> None:
        """Guest ``j`` stops because its node failed."""
        self._down[j] = True
        self._down_at[j] = self._now
        self._state[j] = "stopped"
        if self._ha[j]:
            self._pending.add(j)
            if self._ha_state0[j] is not None:
                self._ha_state[j] = "fence"
        self._refresh(j)

    def _restart(self, j: int, n: int) -> None:
        """Guest ``j`` starts (again) on node ``n``, with uptime 0."""
        self._down[j] = False
        self._pending.discard(j)
        self._state[j] = "running"
        self._ha_state[j] = self._ha_state0[j]
        self._node[j] = n
        self._guest_node_names[j] = self._node_names[n]
        self._uptime_offset[j] = -self._now
        self._refresh(j)

    # -- migrations -----------------------------------------------------------------------------

    def _begin(
        self, j: int, target: int, cause: Cause, *, fail: bool, restart: bool = False
    ) -> _Migration:
        """Start moving guest ``j``: live, or by a restart (stopped meanwhile, its local disks
        copied but not its memory)."""
        self._handles += 1
        number = self._handles
        handle = f"sim-{number}"
        _, memory = self._columns(self._step_now())
        size = (0 if restart else int(memory[j])) + self._local_bytes[j]
        migration_model = self.scenario.migration
        duration = migration_model.setup + size / migration_model.bandwidth
        source = int(self._node[j])
        move = Move(self._ids[j], self._node_names[source], self._node_names[target])
        migration = _Migration(handle, move, j, source, target, self._now, cause, size, restart)
        self._migrations.append(migration)
        self._by_handle[handle] = migration
        rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.scenario.seed, spawn_key=(3, number)))
        )
        # Two draws more than before the hang and lost-answer faults: the first two are the same.
        draw, share, hang_draw, lost_draw = rng.random(4)
        reason: str | None = None
        gid = self._ids[j]
        if fail:
            # A hanging migration has no end of its own: a failure armed for it waits for the next.
            migration.hangs = self._strikes(self._armed_hangs, self._hang_odds, gid, hang_draw)
            if not migration.hangs:
                if self._disarm(self._armed, gid):
                    reason = "simulated migration failure (scheduled)"
                elif draw < migration_model.failure_rate:
                    reason = "simulated migration failure"
            migration.lost_answer = self._strikes(self._armed_lost, self._lost_odds, gid, lost_draw)
        if migration.hangs:
            self._hung += 1
        elif reason is None:
            self._push(self._now + duration, "migration-end", migration, None)
        else:
            after = FAIL_AFTER[0] + (FAIL_AFTER[1] - FAIL_AFTER[0]) * float(share)
            self._push(self._now + after * duration, "migration-end", migration, reason)
        self._migration_of[j] = migration
        self._target_names[j] = self._node_names[target]
        if restart:
            self._state[j] = "stopped"
        if self._ha_state0[j] is not None:
            self._ha_state[j] = "stopped" if restart else "migrate"
        self._refresh(j)
        return migration

    def _disarm(self, armed: list[tuple[float, str | None]], gid: str) -> bool:
        """Whether a scheduled fault is due for a migration of ``gid`` now (it is used up)."""
        for index, (at, guest) in enumerate(armed):
            if at <= self._now and (guest is None or guest == gid):
                del armed[index]
                return True
        return False

    def _strikes(
        self,
        armed: list[tuple[float, str | None]],
        odds: list[tuple[float, str | None]],
        gid: str,
        draw: float,
    ) -> bool:
        """Whether a hang (or a lost answer) strikes a migration of ``gid`` starting now: a
        scheduled one is due, or ``draw`` falls under the combined odds of the entries for it."""
        if self._disarm(armed, gid):
            return True
        miss = 1.0
        for probability, guest in odds:
            if guest is None or guest == gid:
                miss *= 1.0 - probability
        return draw < 1.0 - miss

    def _end(self, migration: _Migration, reason: str | None) -> None:
        """A migration ends: done (``reason`` is None) or failed."""
        if migration.outcome != "running":
            return
        j = migration.guest
        migration.ended = self._now
        migration.outcome = "done" if reason is None else "failed"
        migration.reason = reason
        self._migration_of[j] = None
        self._target_names[j] = None
        if reason is None:
            self._node[j] = migration.target
            self._guest_node_names[j] = self._node_names[migration.target]
            if self._kind[j] == "ct":
                self._uptime_offset[j] = -self._now  # a container restarts on its new node
        if migration.restart:
            # It starts again: on the target, or where it was (a failed node takes it down next).
            self._state[j] = "running"
            self._uptime_offset[j] = -self._now
        if not self._down[j]:
            self._ha_state[j] = self._ha_state0[j]
        self._refresh(j)
        if (
            reason is None
            and migration.cause == "controller"
            and self._fails_back_to(j) is not None
        ):
            self._push(self._now + FAILBACK_ROUND, "failback", j)

    def _fails_back_to(self, j: int) -> int | None:
        """The node the HA manager moves guest ``j`` back to, or None: an HA guest with failback
        on, running outside the top tier of its node affinity among the usable nodes."""
        guest = self._cluster0.guests[j]
        if not (guest.ha and guest.failback) or self._down[j]:
            return None
        if self._migration_of[j] is not None or self._state[j] != "running":
            return None
        self._derive()
        usable = {self._node_names[n] for n in np.nonzero(self._usable)[0].tolist()}
        for rule in self._cluster0.rules.node_rules_for(guest.id):
            top = rule.top_nodes(usable)
            if not top or self._node_names[int(self._node[j])] in top:
                return None
            count = np.bincount(self._node, minlength=len(self._node_names))
            return min(
                (self._node_index[name] for name in top),
                key=lambda n: (int(count[n]), self._node_names[n]),
            )
        return None

    def _failback(self, j: int) -> None:
        """The HA manager's round: guest ``j`` back to its top tier, if it still is not there."""
        target = self._fails_back_to(j)
        if target is not None:
            self._begin(j, target, "failback", fail=False)

    # -- faults ---------------------------------------------------------------------------------

    def _plan_fault(self, index: int, fault: Fault, probability: float) -> float:
        """Schedule one fault entry; returns the combined per-call API error probability."""
        if fault.type in ("migration-hang", "api-lost-answer"):
            armed = self._armed_hangs if fault.type == "migration-hang" else self._armed_lost
            odds = self._hang_odds if fault.type == "migration-hang" else self._lost_odds
            if fault.probability is not None:
                odds.append((fault.probability, fault.guest))
            elif fault.at is not None:
                armed.append((fault.at, fault.guest))
            return probability
        if fault.probability is not None:  # api-error per call
            return 1.0 - (1.0 - probability) * (1.0 - fault.probability)
        if fault.at is not None:
            times: list[tuple[float, int]] = [(fault.at, -1)]
        else:
            candidates = fault.nodes or tuple(self._node_names)
            rng = np.random.Generator(
                np.random.PCG64(np.random.SeedSequence(self.scenario.seed, spawn_key=(2, index)))
            )
            times = []
            t = 0.0
            while True:
                t += float(rng.exponential(86400.0 / fault.per_day))
                pick = int(rng.integers(len(candidates)))
                if t >= self.end:
                    break
                times.append((t, self._node_index[candidates[pick]]))
        for when, pick in times:
            node = self._node_index[fault.node] if fault.node is not None else pick
            if fault.type == "node-failure":
                self._push(when, "node-failure", node, fault.duration)
            elif fault.type == "maintenance":
                self._push(when, "maintenance", node, fault.duration)
            elif fault.type == "api-error":
                self._windows.append((when, when + (fault.duration or 0.0)))
            else:  # migration-failure
                self._armed.append((when, fault.guest))
        return probability

    def _handle(self, kind: str, args: tuple[Any, ...]) -> None:
        if kind == "migration-end":
            self._end(*args)
        elif kind == "node-failure":
            self._fail_node(*args)
        elif kind == "node-return":
            self._return_node(*args)
        elif kind == "maintenance":
            n, duration = args
            before = self._maintenance(n)
            self._maint_count[n] += 1
            self._push(self._now + duration, "maintenance-end", n)
            self._node_changed(n, before, "fault")
        elif kind == "maintenance-end":
            (n,) = args
            before = self._maintenance(n)
            self._maint_count[n] -= 1
            self._node_changed(n, before, "fault")
        elif kind == "recover":
            self._recover_at.discard(self._now)
            self._recover()
        elif kind == "failback":
            self._failback(*args)

    def _fail_node(self, n: int, duration: float | None) -> None:
        if duration is not None:
            self._push(self._now + duration, "node-return", n)
        self._fail_count[n] += 1
        if self._fail_count[n] > 1:
            return
        name = self._node_names[n]
        self._node_failures += 1
        self._online[n] = False
        self._node_events.append(NodeEvent(self._now, name, "failed", "fault"))
        for migration in self._migrations:
            if migration.outcome == "running" and n in (migration.source, migration.target):
                self._end(migration, f"node {name} failed")
        lost = False
        for j in np.nonzero(self._node == n)[0].tolist():
            if self._state[j] != "stopped":
                self._take_down(j)
                lost = lost or self._ha[j]
        before = self._maintenance(n)
        self._node_changed(n, before, "fault")
        if lost:
            self._request_recovery(self._now + self.scenario.recovery_delay)

    def _return_node(self, n: int) -> None:
        self._fail_count[n] -= 1
        if self._fail_count[n] > 0:
            return
        self._online[n] = True
        self._node_events.append(NodeEvent(self._now, self._node_names[n], "recovered", "fault"))
        for j in np.nonzero((self._node == n) & self._down)[0].tolist():
            self._restart(j, n)
        before = self._maintenance(n)
        self._node_changed(n, before, "fault")

    def _request_recovery(self, when: float) -> None:
        if when not in self._recover_at:
            self._recover_at.add(when)
            self._push(when, "recover")

    def _recover(self) -> None:
        """HA: restart the pending guests of failed nodes elsewhere, one at a time."""
        # Only guests whose node has been down for the recovery delay (it is being fenced).
        ready = self._now - self.scenario.recovery_delay
        pending = [
            j
            for j in sorted(self._pending)
            if not self._online[self._node[j]] and self._down_at[j] <= ready
        ]
        if not pending:
            return
        cluster = self._build_cluster(recovering=True)
        state = PlacementState.build(cluster)
        pending.sort(
            key=lambda j: (-cluster.guests[j].memory, -cluster.guests[j].cpu, self._ids[j])
        )
        ready_set = set(pending)
        for j in pending:
            if j not in self._pending:
                continue
            placement = state.place(j, "recover")
            if placement.best is None:
                if placement.blocked is not None:
                    # Local disks or devices: it can only start again on its own node.
                    self._pending.discard(j)
                if self._ha_state0[j] is not None and self._ha_state[j] != "recovery":
                    self._ha_state[j] = "recovery"
                    self._refresh(j)
                continue
            target = self._node_index[placement.best]
            members = [m for m in state.bundle(j).tolist() if m in ready_set and m in self._pending]
            state.commit(np.array(members, dtype=np.intp), target)
            for m in members:
                source = self._guest_node_names[m]
                self._restart(m, target)
                self._recoveries += 1
                move = Move(self._ids[m], source, self._node_names[target])
                record = _Migration(
                    f"recovery-{self._recoveries}",
                    move,
                    m,
                    self._node_index[source],
                    target,
                    self._now,
                    "recovery",
                    0,
                )
                record.ended = self._now
                record.outcome = "done"
                record.reason = f"HA recovery: node {source} failed"
                self._migrations.append(record)
        if self._pending and not any(t > self._now for t in self._recover_at):
            self._request_recovery(self._now + RECOVERY_RETRY)

    # -- API errors -----------------------------------------------------------------------------

    def _api(self, operation: str) -> None:
        if self._closed:
            raise BackendError("the simulator is closed", transient=False)
        index = bisect.bisect_right(self._window_starts, self._now) - 1
        if index >= 0 and self._now < self._windows[index][1]:
            self._api_errors += 1
            raise BackendError(
                f"simulated API error: {operation} failed (the API is unavailable until "
                f"{format_duration(self._windows[index][1])} after the start)",
                transient=True,
            )
        if self._api_probability > 0 and self._api_rng.random() < self._api_probability:
            self._api_errors += 1
            raise BackendError(f"simulated API error: {operation} failed", transient=True)

    # -- the observed cluster -------------------------------------------------------------------

    def _build_cluster(self, *, recovering: bool = False) -> Cluster:
        """The cluster now. Guests whose observed fields did not change since the last call are
        the same objects; the others are built anew (running guests change every step: their
        use and their uptime)."""
        cpu_use, mem_use = self._columns(self._step_now())
        up = self._up
        states = self._state
        ha_states = self._ha_state
        if recovering:
            # The guests waiting for HA recovery, as running where they were (with the use they
            # will have), for the placement engine.
            up = up.copy()
            states = list(states)
            ha_states = list(ha_states)
            for j in self._pending:
                up[j] = 1.0
                states[j] = "running"
                if ha_states[j] is not None:
                    ha_states[j] = "recovery"
        cpu = cpu_use * up
        memory = (mem_use * up).astype(np.int64)
        uptime = np.where(
            up > 0, np.floor(np.maximum(self._now + self._uptime_offset, 0.0)), 0.0
        ).astype(np.int64)
        last = None if recovering else self._last_built
        if last is None:
            changed = None
        else:
            changed = np.flatnonzero(
                (cpu != last[0])
                | (memory != last[1])
                | (uptime != last[2])
                | (self._stamp != last[3])
            )
        columns = (
            self._guest_node_names,
            states,
            cpu.tolist(),
            memory.tolist(),
            uptime.tolist(),
            ha_states,
            self._target_names,
        )
        if last is None or changed is None or changed.size > len(self._static) // 2:
            guests = tuple(map(_BUILD_GUEST, self._static, *columns))
        else:
            built = list(last[4])
            for j in changed.tolist():
                built[j] = _BUILD_GUEST(self._static[j], *(column[j] for column in columns))
            guests = tuple(built)
        if not recovering:
            self._last_built = (cpu, memory, uptime, self._stamp.copy(), guests)
        c0 = self._cluster0
        return Cluster(self._nodes_tuple, guests, c0.rules, c0.settings, c0.name)


@dataclass(frozen=True, slots=True)
class _Pairs:
    """(guest, node) pairs, to add per-guest values up per node without a dense matrix."""

    n_nodes: int
    #: Pairs in guest order (as :func:`opendrs.engine.usage.accumulate` adds them).
    guest: np.ndarray
    node: np.ndarray
    #: The same pairs grouped by node, for :func:`numpy.add.reduceat`.
    grouped: np.ndarray
    starts: np.ndarray
    present: np.ndarray

    @classmethod
    def build(cls, nodes_of: Sequence[tuple[int, ...]], n_nodes: int) -> _Pairs:
        guest = np.array([j for j, nodes in enumerate(nodes_of) for _ in nodes], dtype=np.intp)
        node = np.array([n for nodes in nodes_of for n in nodes], dtype=np.intp)
        order = np.argsort(node, kind="stable")
        by_node = node[order]
        starts = np.flatnonzero(np.r_[True, by_node[1:] != by_node[:-1]]) if node.size else node
        return cls(n_nodes, guest, node, guest[order], starts, by_node[starts])

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Per node, the sum of ``values`` (guests first) over the guests paired with it."""
        if values.ndim == 1:
            return np.bincount(self.node, weights=values[self.guest], minlength=self.n_nodes)
        out = np.zeros((self.n_nodes, *values.shape[1:]))
        if self.guest.size:
            out[self.present] = np.add.reduceat(values[self.grouped], self.starts, axis=0)
        return out


def _merge(windows: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping windows."""
    out: list[tuple[float, float]] = []
    for start, stop in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out
