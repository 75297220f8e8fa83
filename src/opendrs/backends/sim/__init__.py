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
:class:`~opendrs.engine.usage.CapacityModel`, each counted as the controller's moves', the
platform's (HA), the placement's or the guests' own load's (:mod:`.violations`).

**The modules.** :mod:`.simulator` (the :class:`~.simulator.Simulator`: the cluster's state, the
backend calls, migrations, node faults and HA recovery), :mod:`.clock` (steps and the event
queue), :mod:`.faults` (the scenario's faults, planned: :class:`~.faults.FaultPlan`),
:mod:`.migration` (a migration in the books), :mod:`.statistics` (the figures of the steps),
:mod:`.violations` (whose each capacity violation is),
:mod:`.pairs` (per-guest values added up per node), :mod:`.results` (what a run reports) and
:mod:`.failover_probe` (``simulate --failover-check``: every node's failure tried each hour on a
copy of the cluster, its HA guests restarted as Proxmox's HA manager or the headroom check would).
"""

from ..scenario import Scenario, builtin_scenario, load_scenario
from .results import MigrationRecord, NodeEvent, NodeFractions, SimStats
from .simulator import Simulator
from .statistics import HOT

__all__ = [
    "HOT",
    "MigrationRecord",
    "NodeEvent",
    "NodeFractions",
    "Scenario",
    "SimStats",
    "Simulator",
    "builtin_scenario",
    "load_scenario",
]
