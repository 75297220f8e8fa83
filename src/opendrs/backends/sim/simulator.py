"""The :class:`Simulator`: the simulated cluster's state, driven through the
:class:`~opendrs.backends.base.Backend` protocol and its :class:`~opendrs.backends.base.Clock`
(the package's docstring, :mod:`opendrs.backends.sim`, tells how it behaves)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Final

import numpy as np

from opendrs.engine.placement import PlacementState
from opendrs.engine.usage import net_capacity, safe_divide, tolerance
from opendrs.model.cluster import Cluster, Move, Node

from ..base import DONE, RUNNING, BackendError, Handle, Progress, StartGate, failed
from ..scenario import Scenario
from ..workload import UsageGenerator
from .clock import EventQueue, count_steps
from .faults import FAIL_AFTER, FaultPlan
from .guests import GuestBooks
from .migration import Migration
from .observe import GuestBuilder
from .pairs import Pairs
from .results import Cause, MigrationRecord, NodeEvent, NodeFractions, SimStats
from .statistics import HOT, HOT_WINDOW, StepStatistics, over_capacity, percentile, steps_in
from .violations import ViolationCauses

__all__ = [
    "BLOCK_CELLS",
    "FAILBACK_ROUND",
    "MAX_BLOCK",
    "MOVE_ACCOUNTED",
    "RECOVERY_RETRY",
    "Simulator",
]

#: Seconds from a migration that leaves an HA guest below its top node-affinity tier to the HA
#: manager's round that moves it back (failback; a CRM round is about 10 s, pve-ha-manager
#: ``CRM.pm``).
FAILBACK_ROUND: Final = 10.0
#: Seconds after a guest arrives by the controller's migration during which its node's use over
#: capacity counts as the move's (when the node would be within it without the guest): a plan
#: judges each guest on its use over the hold, 30 minutes (:mod:`.violations`).
MOVE_ACCOUNTED: Final = 1800.0
#: Pending HA recoveries are tried again at least this often (seconds).
RECOVERY_RETRY: Final = 3600.0
#: Steps of usage generated at once (fewer for very large clusters, to bound memory).
MAX_BLOCK: Final = 1440
#: Usage cells (guests × steps) a block holds at most.
BLOCK_CELLS: Final = 2_000_000


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
        check_arguments(
            days=days, threshold=threshold, window=window, hot=hot, hot_window=hot_window
        )
        self.scenario = scenario
        self.threshold = float(threshold)
        self.hot = float(hot)
        self._cluster0 = scenario.cluster
        self._step = float(scenario.step)
        self.end = float(days * 86400.0 if days is not None else scenario.duration)
        self._now = 0.0
        self._closed = False
        self._version = 0
        self._n_steps = count_steps(self.end, self._step, inclusive=False)
        pools = local_pools(scenario.cluster)
        self._init_nodes(pools)
        self._init_guests(pools)
        self._init_usage()
        self._init_statistics(window, hot_window)
        self._init_events()
        self._start()

    def _init_nodes(self, pools: list[str]) -> None:
        """The nodes' books: capacities, base loads, limits, online and maintenance."""
        cluster = self._cluster0
        settings = cluster.settings
        nodes = cluster.nodes
        self._nodes: list[Node] = list(nodes)
        self._nodes_tuple: tuple[Node, ...] = tuple(self._nodes)
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
        self._cfg_limit = self._cap * np.array(
            [settings.cpu_overcommit, settings.memory_overcommit]
        )
        self._disk_limit = np.array(
            [[float(n.storage.get(p, 0)) for p in pools] for n in nodes], dtype=np.float64
        ).reshape(n_nodes, len(pools))
        self._derived_version = -1
        self._cfg_over = np.zeros(n_nodes, dtype=bool)
        self._usable = np.zeros(n_nodes, dtype=bool)

    def _init_guests(self, pools: list[str]) -> None:
        """The guests' books, and what shows them."""
        guests = self._cluster0.guests
        self._guests = GuestBooks(self._cluster0, pools, self._node_index)
        self._guest_builder = GuestBuilder(guests)
        #: Running containers move by a restart (stop, move, start), if the settings allow it.
        self._restart_moves = self.scenario.platform == "incus"
        self._observed: tuple[tuple[float, int], Cluster] | None = None
        #: The (guest, node) pairs of load and of local storage, as of ``_pairs_version``.
        n_nodes = len(self._node_names)
        self._pairs_version = -1
        self._load_pairs = Pairs.build([], n_nodes)
        self._hold_pairs = Pairs.build([], n_nodes)
        for j in range(len(guests)):
            self._refresh(j)

    def _init_usage(self) -> None:
        """The guests' usage, generated a block of steps at a time."""
        n_guests = len(self._guests.ids)
        block = max(1, min(MAX_BLOCK, BLOCK_CELLS // max(n_guests, 1)))
        self._block = block
        self._usage = UsageGenerator(
            self._cluster0.guests,
            self.scenario.patterns(),
            seed=self.scenario.seed,
            step=self._step,
            block=block,
            trace=self.scenario.trace,
        )
        self._usage_index = -1
        self._usage_cpu = np.zeros((n_guests, 0))
        self._usage_mem = np.zeros((n_guests, 0))

    def _init_statistics(self, window: float, hot_window: float) -> None:
        """The statistics of the steps, recorded lazily (``_recorded``: the steps done)."""
        settings = self._cluster0.settings
        self._recorded = 0
        self._statistics = StepStatistics(
            len(self._node_names),
            weights=(float(settings.weight_cpu), float(settings.weight_memory)),
            dynamic=settings.mode == "dynamic",
            hot=self.hot,
            window_steps=steps_in(window, self._step),
            hot_steps=steps_in(hot_window, self._step),
        )
        self._violation_causes = ViolationCauses()

    def _init_events(self) -> None:
        """The event queue, the migrations and node events so far, and the planned faults."""
        self._events = EventQueue()
        self._handles = 0
        self._migrations: list[Migration] = []
        self._by_handle: dict[str, Migration] = {}
        self._node_events: list[NodeEvent] = []
        self._recoveries = 0
        #: HA guests no node could take when recovery first tried them (once each time their
        #: node fails), those of them still waiting, and HA guests that may not restart
        #: elsewhere at all (local disks or devices, HA state ignored; not an ignore rule).
        self._unrestartable = 0
        self._stranded: set[int] = set()
        self._held = 0
        self._node_failures = 0
        self._api_errors = 0
        self._recover_at: set[float] = set()
        self._hung = 0
        self._lost_answers = 0
        self._faults = FaultPlan(self.scenario, self.end, self._node_names, self._node_index)
        for when, kind, node, duration in self._faults.node_faults:
            self._push(when, kind, node, duration)

    def _start(self) -> None:
        """Time 0: guests on a node that is down at the start are down until it returns (HA:
        recovered); migrations in flight in the snapshot go on from time 0 (and succeed)."""
        for j in range(len(self._guests.ids)):
            if not self._online[self._guests.node[j]] and self._guests.state[j] != "stopped":
                self._take_down(j)
        if self._guests.pending:
            self._request_recovery(self.scenario.recovery_delay)
        for j, g in enumerate(self._cluster0.guests):
            if g.migrating_to is not None and self._guests.state[j] != "stopped":
                self._begin(j, self._node_index[g.migrating_to], "snapshot", fail=False)
        self._advance(0.0)

    # -- Clock ----------------------------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since the start."""
        return self._now

    def monotonic(self) -> float:
        """The simulated time too: it is never stepped."""
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
        j = self._guests.index.get(move.guest)
        if j is None:
            raise BackendError(f"guest {move.guest} does not exist", transient=False)
        target = self._node_index.get(move.target)
        if target is None:
            raise BackendError(f"node {move.target} does not exist", transient=False)
        self._check_movable(move, j)
        restart = self._check_target(move, j, target)
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

    def _check_movable(self, move: Move, j: int) -> None:
        """Refuse (:class:`BackendError`) a move of guest ``j`` that is not where ``move`` says,
        is moving already, is not running or has a local device."""
        current = self._guests.node_names[j]
        if current != move.source:
            raise BackendError(
                f"guest {move.guest} is on {current}, not on {move.source}", transient=False
            )
        if move.target == move.source:
            raise BackendError(f"guest {move.guest} is already on {move.target}", transient=False)
        if self._guests.migration_of[j] is not None:
            raise BackendError(
                f"guest {move.guest} is already migrating to {self._guests.targets[j]}",
                transient=True,
            )
        if self._guests.state[j] == "stopped":
            why = f" (node {current} is down)" if self._guests.down[j] else ""
            raise BackendError(f"guest {move.guest} is not running{why}", transient=False)
        if self._guests.devices[j]:
            raise BackendError(
                f"guest {move.guest} cannot be live-migrated: local device "
                f"{self._guests.devices[j][0]}",
                transient=False,
            )

    def _check_target(self, move: Move, j: int, target: int) -> bool:
        """Refuse (:class:`BackendError`) a move of guest ``j`` to node ``target`` of another
        architecture, offline or in maintenance, or a restart move the settings do not allow;
        whether the move is a restart."""
        if self._nodes[target].arch != self._guests.arch[j]:
            raise BackendError(
                f"guest {move.guest} ({self._guests.arch[j]}) cannot move to node {move.target} "
                f"({self._nodes[target].arch}): another architecture",
                transient=False,
            )
        restart = self._restart_moves and self._guests.kind[j] == "ct"
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
        return restart

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
        statistics = self._statistics
        return SimStats(
            seconds=self._now,
            steps=int(spreads.size),
            threshold=self.threshold,
            steps_above=int(np.count_nonzero(spreads > self.threshold)),
            mean_imbalance=float(spreads.mean()) if spreads.size else 0.0,
            max_imbalance=float(spreads.max()) if spreads.size else 0.0,
            last_imbalance=float(spreads[-1]) if spreads.size else 0.0,
            max_node_load=statistics.max_load,
            hot=self.hot,
            hot_steps=int(statistics.hot_count.sum()),
            max_hot_steps=int(statistics.hot_count.max(initial=0)),
            p95_node_load=percentile(statistics.peaks, 95.0),
            capacity_violations=statistics.violations,
            capacity_violations_by=replace(self._violation_causes),
            migrations=len(controller),
            migrations_done=sum(m.outcome == "done" for m in controller),
            migrations_failed=sum(m.outcome == "failed" for m in controller),
            migrations_running=sum(m.outcome == "running" for m in controller),
            migrated_bytes=sum(m.bytes for m in controller),
            recoveries=self._recoveries,
            unrestartable=self._unrestartable,
            held=self._held,
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
        spreads = self._statistics.spreads
        return np.concatenate(spreads) if spreads else np.zeros(0)

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

    def _due(self) -> int:
        """Steps whose start has been reached (they are recorded lazily)."""
        return min(count_steps(self._now, self._step, inclusive=True), self._n_steps)

    def _advance(self, target: float) -> None:
        """Process every event up to ``target`` in order, then set the time to ``target``."""
        while (when := self._events.next_time(target)) is not None:
            # Steps before the event see the state before it; a step at the event's instant
            # sees the state after it.
            self._flush(min(count_steps(when, self._step, inclusive=False), self._n_steps))
            kind, args = self._events.pop()
            self._now = max(self._now, when)
            self._handle(kind, args)
        self._now = max(self._now, target)

    def _push(self, when: float, kind: str, *args: Any) -> None:
        self._events.push(when, kind, args)

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
        return max(count_steps(self._now, self._step, inclusive=True) - 1, 0)

    # -- statistics -----------------------------------------------------------------------------

    def _derive(self) -> None:
        """Node masks and configured commitments, when the state changed."""
        if self._derived_version == self._version:
            return
        self._derived_version = self._version
        maintenance = self._maint_manual | (self._maint_count > 0)
        self._usable = self._online & ~maintenance
        self._cfg_over = self._configured_over()

    def _configured_over(self, without: np.ndarray | None = None) -> np.ndarray:
        """The nodes whose guests (but the guests ``without`` marks) commit more vCPUs, memory
        or local storage than the node's configured limits."""
        cfg, disks = self._guests.cfg, self._guests.disks
        if without is not None:  # every derive takes the guests as they are: no copy then
            keep = (~without).astype(float)[:, None]
            cfg, disks = cfg * keep, disks * keep
        committed = self._pairs()[0].sum(cfg)
        over = np.any(committed > self._cfg_limit + tolerance(self._cfg_limit), axis=1)
        if disks.shape[1]:
            stored = self._pairs()[1].sum(disks)
            over |= np.any(stored > self._disk_limit + tolerance(self._disk_limit), axis=1)
        return over

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
        cpu, mem = self._node_loads(c0, c1)
        over = self._statistics.record(
            cpu,
            mem,
            self._cap,
            usable=self._usable,
            online=self._online,
            cfg_over=self._cfg_over,
        )
        if over.any():
            self._violation_causes.add(
                over,
                by_moves=self._accounted_for(over, c0, c1, platform=False),
                by_platform=self._accounted_for(over, c0, c1, platform=True),
                cfg_over=self._cfg_over,
            )

    def _node_loads(
        self, c0: int, c1: int, without: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every node's CPU and memory use over block columns ``[c0, c1)``, each (nodes, steps):
        its base load and the use of the running guests that load it (but those ``without``
        marks)."""
        up = self._guests.up if without is None else self._guests.up * ~without
        loads = self._pairs()[0]
        cpu = self._base[:, 0:1] + loads.sum(self._usage_cpu[:, c0:c1] * up[:, None])
        mem = self._base[:, 1:2] + loads.sum(self._usage_mem[:, c0:c1] * up[:, None])
        return cpu, mem

    def _accounted_for(self, over: np.ndarray, c0: int, c1: int, *, platform: bool) -> np.ndarray:
        """The (node, step) pairs of ``over`` the controller accounts for (``platform``: the
        platform), as :mod:`.violations` tells: those on a node one of its migrations in flight
        takes a guest onto, and those the node would be within its limits without the guests
        it put there — for the controller, its configured limits without any of them, and the
        others without those that arrived less than :data:`MOVE_ACCOUNTED` before the step."""
        guests = self._guests
        onto = np.zeros(len(self._node_names), dtype=bool)
        for migration in guests.migration_of:
            if migration is not None and (migration.cause != "controller") == platform:
                onto[migration.target] = True
        placed = guests.by_platform if platform else guests.by_controller
        accounted = np.broadcast_to(onto[:, None], over.shape)
        if not placed.any():
            return accounted & over
        cfg_over = self._configured_over(placed)
        if platform:
            cpu, mem = self._node_loads(c0, c1, without=placed)
        else:
            accounted = accounted | (self._cfg_over & ~cfg_over)[:, None]
            cpu, mem = self._loads_without_arrivals(c0, c1)
        still = over_capacity(cpu, mem, self._cap, cfg_over, dynamic=self._statistics.dynamic)
        return (accounted | ~still) & over

    def _loads_without_arrivals(self, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray]:
        """Every node's CPU and memory use over block columns ``[c0, c1)`` without the guests
        the controller moved there, each in the :data:`MOVE_ACCOUNTED` seconds after it
        arrived."""
        guests = self._guests
        cpu, mem = self._node_loads(c0, c1)
        times = (self._usage_index * self._block + np.arange(c0, c1)) * self._step
        recent = guests.by_controller & (guests.arrived >= times[0] - MOVE_ACCOUNTED)
        for j in np.flatnonzero(recent).tolist():
            during = guests.up[j] * (times - guests.arrived[j] < MOVE_ACCOUNTED)
            for n in guests.load_nodes[j]:
                cpu[n] -= self._usage_cpu[j, c0:c1] * during
                mem[n] -= self._usage_mem[j, c0:c1] * during
        return cpu, mem

    def _fractions_now(self) -> tuple[np.ndarray, np.ndarray]:
        cpu_use, mem_use = self._columns(self._step_now())
        loads = self._pairs()[0]
        cpu = self._base[:, 0] + loads.sum(cpu_use * self._guests.up)
        mem = self._base[:, 1] + loads.sum(mem_use * self._guests.up)
        return safe_divide(cpu, self._cap[:, 0]), safe_divide(mem, self._cap[:, 1])

    def _pairs(self) -> tuple[Pairs, Pairs]:
        """The (guest, node) pairs of load and of local storage, rebuilt after changes."""
        if self._pairs_version != self._version:
            n_nodes = len(self._node_names)
            self._load_pairs = Pairs.build(self._guests.load_nodes, n_nodes)
            self._hold_pairs = Pairs.build(self._guests.hold_nodes, n_nodes)
            self._pairs_version = self._version
        return self._load_pairs, self._hold_pairs

    # -- guests and nodes -----------------------------------------------------------------------

    def _maintenance(self, n: int) -> bool:
        return bool(self._maint_manual[n] or self._maint_count[n] > 0)

    def _refresh(self, j: int) -> None:
        """Guest ``j``'s state changed: recompute which nodes it loads."""
        self._guests.refresh(j)
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
        if online and not maintenance and not usable_before and self._guests.pending:
            self._request_recovery(self._now)

    def _take_down(self, j: int) -> None:
        """Guest ``j`` stops because its node failed."""
        self._guests.take_down(j, self._now)
        self._version += 1

    def _restart(self, j: int, n: int) -> None:
        """Guest ``j`` starts (again) on node ``n``, with uptime 0."""
        self._guests.restart(j, n, self._node_names[n], self._now)
        self._stranded.discard(j)
        self._version += 1

    # -- migrations -----------------------------------------------------------------------------

    def _begin(
        self, j: int, target: int, cause: Cause, *, fail: bool, restart: bool = False
    ) -> Migration:
        """Start moving guest ``j``: live, or by a restart (stopped meanwhile, its local disks
        copied but not its memory)."""
        self._handles += 1
        number = self._handles
        handle = f"sim-{number}"
        _, memory = self._columns(self._step_now())
        size = (0 if restart else int(memory[j])) + self._guests.local_bytes[j]
        migration_model = self.scenario.migration
        duration = migration_model.setup + size / migration_model.bandwidth
        source = int(self._guests.node[j])
        move = Move(self._guests.ids[j], self._node_names[source], self._node_names[target])
        migration = Migration(handle, move, j, source, target, self._now, cause, size, restart)
        self._migrations.append(migration)
        self._by_handle[handle] = migration
        rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.scenario.seed, spawn_key=(3, number)))
        )
        # Two draws more than before the hang and lost-answer faults: the first two are the same.
        draw, share, hang_draw, lost_draw = rng.random(4)
        reason: str | None = None
        if fail:
            migration.hangs, reason, migration.lost_answer = self._faults.migration_faults(
                self._guests.ids[j],
                self._now,
                (draw, hang_draw, lost_draw),
                migration_model.failure_rate,
            )
        if migration.hangs:
            self._hung += 1
        elif reason is None:
            self._push(self._now + duration, "migration-end", migration, None)
        else:
            after = FAIL_AFTER[0] + (FAIL_AFTER[1] - FAIL_AFTER[0]) * float(share)
            self._push(self._now + after * duration, "migration-end", migration, reason)
        self._guests.migration_of[j] = migration
        self._guests.targets[j] = self._node_names[target]
        if restart:
            self._guests.state[j] = "stopped"
        if self._guests.ha_state0[j] is not None:
            self._guests.ha_state[j] = "stopped" if restart else "migrate"
        self._refresh(j)
        return migration

    def _end(self, migration: Migration, reason: str | None) -> None:
        """A migration ends: done (``reason`` is None) or failed."""
        if migration.outcome != "running":
            return
        j = migration.guest
        migration.ended = self._now
        migration.outcome = "done" if reason is None else "failed"
        migration.reason = reason
        self._guests.migration_of[j] = None
        self._guests.targets[j] = None
        if reason is None:
            self._guests.node[j] = migration.target
            self._guests.node_names[j] = self._node_names[migration.target]
            self._guests.by_controller[j] = migration.cause == "controller"
            self._guests.by_platform[j] = migration.cause != "controller"
            self._guests.arrived[j] = self._now
            if self._guests.kind[j] == "ct":
                self._guests.uptime_offset[j] = -self._now  # a container restarts on its new node
        if migration.restart:
            # It starts again: on the target, or where it was (a failed node takes it down next).
            self._guests.state[j] = "running"
            self._guests.uptime_offset[j] = -self._now
        if not self._guests.down[j]:
            self._guests.ha_state[j] = self._guests.ha_state0[j]
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
        if not (guest.ha and guest.failback) or self._guests.down[j]:
            return None
        if self._guests.migration_of[j] is not None or self._guests.state[j] != "running":
            return None
        self._derive()
        usable = {self._node_names[n] for n in np.nonzero(self._usable)[0].tolist()}
        for rule in self._cluster0.rules.node_rules_for(guest.id):
            top = rule.top_nodes(usable)
            if not top or self._node_names[int(self._guests.node[j])] in top:
                return None
            count = np.bincount(self._guests.node, minlength=len(self._node_names))
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
        for j in np.nonzero(self._guests.node == n)[0].tolist():
            if self._guests.state[j] != "stopped":
                self._take_down(j)
                lost = lost or self._guests.ha[j]
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
        for j in np.nonzero((self._guests.node == n) & self._guests.down)[0].tolist():
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
            for j in sorted(self._guests.pending)
            if not self._online[self._guests.node[j]] and self._guests.down_at[j] <= ready
        ]
        if not pending:
            return
        cluster = self._build_cluster(recovering=True)
        state = PlacementState.build(cluster)
        pending.sort(
            key=lambda j: (-cluster.guests[j].memory, -cluster.guests[j].cpu, self._guests.ids[j])
        )
        ready_set = set(pending)
        for j in pending:
            if j not in self._guests.pending:
                continue
            placement = state.place(j, "recover")
            if placement.best is None:
                if placement.blocked is not None:
                    # Local disks or devices: it can only start again on its own node.
                    self._guests.pending.discard(j)
                    self._held += 1
                elif j not in self._stranded:
                    self._stranded.add(j)
                    self._unrestartable += 1
                if self._guests.ha_state0[j] is not None and self._guests.ha_state[j] != "recovery":
                    self._guests.ha_state[j] = "recovery"
                    self._refresh(j)
                continue
            target = self._node_index[placement.best]
            members = [
                m for m in state.bundle(j).tolist() if m in ready_set and m in self._guests.pending
            ]
            state.commit(np.array(members, dtype=np.intp), target)
            for m in members:
                source = self._guests.node_names[m]
                self._restart(m, target)
                self._guests.by_controller[m] = False
                self._guests.by_platform[m] = True
                self._recoveries += 1
                move = Move(self._guests.ids[m], source, self._node_names[target])
                record = Migration(
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
        if self._guests.pending and not any(t > self._now for t in self._recover_at):
            self._request_recovery(self._now + RECOVERY_RETRY)

    # -- API errors -----------------------------------------------------------------------------

    def _api(self, operation: str) -> None:
        """Refuse a backend call when the simulator is closed or a simulated API error strikes."""
        if self._closed:
            raise BackendError("the simulator is closed", transient=False)
        message = self._faults.api_error(operation, self._now)
        if message is not None:
            self._api_errors += 1
            raise BackendError(message, transient=True)

    # -- the observed cluster -------------------------------------------------------------------

    def _build_cluster(self, *, recovering: bool = False) -> Cluster:
        """The cluster now; ``recovering``: with the guests waiting for HA recovery as running
        where they were (with the use they will have), for the placement engine."""
        cpu_use, mem_use = self._columns(self._step_now())
        up = self._guests.up
        states = self._guests.state
        ha_states = self._guests.ha_state
        if recovering:
            up = up.copy()
            states = list(states)
            ha_states = list(ha_states)
            for j in self._guests.pending:
                up[j] = 1.0
                states[j] = "running"
                if ha_states[j] is not None:
                    ha_states[j] = "recovery"
        uptime = np.where(
            up > 0, np.floor(np.maximum(self._now + self._guests.uptime_offset, 0.0)), 0.0
        ).astype(np.int64)
        guests = self._guest_builder.build(
            nodes=self._guests.node_names,
            states=states,
            cpu=cpu_use * up,
            memory=(mem_use * up).astype(np.int64),
            uptime=uptime,
            ha_states=ha_states,
            targets=self._guests.targets,
            stamp=self._guests.stamp,
            remember=not recovering,
        )
        c0 = self._cluster0
        return Cluster(
            self._nodes_tuple, guests, c0.rules, c0.settings, c0.name, ha_scheduler=c0.ha_scheduler
        )


def check_arguments(
    *, days: float | None, threshold: float, window: float, hot: float, hot_window: float
) -> None:
    """Raise :class:`ValueError` when a :class:`Simulator` argument is out of range."""
    if days is not None and not (days > 0 and math.isfinite(days)):
        raise ValueError(f"days must be a positive number, got {days!r}")
    for name, seconds in (("window", window), ("hot window", hot_window)):
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"{name} must be a number of seconds ≥ 0, got {seconds!r}")
    if not (threshold >= 0 and math.isfinite(threshold)):
        raise ValueError(f"threshold must be a number ≥ 0, got {threshold!r}")
    if not (hot > 0 and math.isfinite(hot)):
        raise ValueError(f"hot must be a load fraction > 0, got {hot!r}")


def local_pools(cluster: Cluster) -> list[str]:
    """The storage pools of the nodes and of the guests' local disks, sorted."""
    return sorted(
        {p for n in cluster.nodes for p in n.storage}
        | {d.pool for g in cluster.guests for d in g.disks if d.local}
    )
