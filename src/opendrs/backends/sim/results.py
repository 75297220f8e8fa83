"""What a simulated run reports: its migrations, its node events, its node loads now and its
statistics (:class:`SimStats`, for the stability report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .violations import ViolationCauses

__all__ = [
    "Cause",
    "MigrationRecord",
    "NodeEvent",
    "NodeEventKind",
    "NodeFractions",
    "Outcome",
    "SimStats",
]


Outcome = Literal["running", "done", "failed"]
Cause = Literal["controller", "recovery", "snapshot", "failback"]
NodeEventKind = Literal["failed", "recovered", "maintenance-on", "maintenance-off"]


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
    #: HA guests of a failed node that HA recovery could not restart elsewhere when it first
    #: tried — no node had room, or the rules kept them off every one —, counted once each time
    #: their node fails, whether they restarted later or not.
    unrestartable: int = 0
    #: HA guests of a failed node that may not restart elsewhere at all (an ignore rule, local
    #: disks or devices): they wait for their node.
    held: int = 0
    lost_answers: int = 0
    #: The controller's restart moves, and the seconds they kept their guests stopped.
    restart_migrations: int = 0
    restart_downtime: float = 0.0
    #: The capacity violations by whose they are: the controller's migrations, the platform's
    #: (HA recovery and failback), the placement over a configured limit, the guests' own load
    #: (:mod:`~opendrs.backends.sim.violations`).
    capacity_violations_by: ViolationCauses = field(default_factory=ViolationCauses)

    @property
    def fraction_above(self) -> float:
        """Share of the steps whose spread was above the threshold."""
        return self.steps_above / self.steps if self.steps else 0.0
