"""proxlb-solver 0.1.1 (credativ, GPL-3.0): its CP-SAT model and migration planner on our clusters.

Conversion (:func:`solver_spec`), in the shape of ``proxlb_solver.models.Cluster``:

* **Balancing**: method ``memory`` (the solver balances configured memory in every mode), level
  :data:`DEFAULT_BALANCINESS` (4, as in the reference baseline), the cluster's vCPU overcommit
  (4.0 for the generated clusters) and node inflow limit, and no limit on parallel migrations (the
  scenario loader's default, which the baseline used; it only changes the plan's step count).
* **Nodes**: cores (rounded down) and memory, the cluster's reserves (none for the generated
  clusters), local storage pools as ``storage_free`` (the solver's capacity for local disks); nodes
  that are offline or in maintenance are ``maintenance`` (nothing may stay there).
* **Guests**: only running ones (the others commit no CPU or memory in opendrs's capacity model and
  stay put), vCPUs rounded up, configured memory, measured CPU as ``cpu_usage``, local disks only,
  priority and type.
* **Rules**: those opendrs keeps after dropping contradictory ones (:func:`check_rules`); strict
  node affinity becomes a pin to its top-priority usable nodes; guest affinity keeps hard/soft;
  ignored guests and guests opendrs may not move for balancing (locked, local devices, …) are
  ``ignore``. Non-strict node affinity has no equivalent and is left out (noted).

The run is ``solve_reachable(cluster, total_time_limit_s, max_retries)``: CP-SAT with the time
limit (each re-solve after an unbreakable migration cycle gets what is left of it, at least 1 s),
then the planner. The placement read back is ``solution.placements``; ``info`` carries the solver
status, its own gap, the plan's step count, parking moves and whether the plan is executable.
"""

from __future__ import annotations

import math
import time
from typing import Any

from opendrs.engine.constraints import check_rules, movability
from opendrs.engine.usage import loaded_nodes
from opendrs.model.cluster import Cluster
from opendrs.model.rules import Rules

from . import PeerResult, silence_peer_logs

#: The peer module that :func:`run` imports (the worker imports it before measuring).
ENTRY_MODULE = "proxlb_solver.solver"
PEER = "proxlb-solver"
#: proxlb-solver's balanciness level (1–5): 4 is the reference baseline's.
DEFAULT_BALANCINESS = 4
#: Time limits per benchmark size (seconds), as in the reference baseline; larger sizes are not
#: run by default (the model has one boolean per guest and node: 2.6 M at XL).
TIME_LIMITS: dict[str, float] = {"S": 5.0, "M": 60.0, "L": 180.0}
#: Re-solves after an unbreakable migration cycle (``solve_reachable``'s default).
MAX_RETRIES = 10


def _pin_nodes(cluster: Cluster, rules: Rules) -> tuple[dict[str, list[str]], list[str]]:
    """Strict node affinity as pins (guest → allowed nodes), and notes on what was left out."""
    usable = frozenset(n.name for n in cluster.nodes if n.usable)
    pins: dict[str, list[str]] = {}
    notes: list[str] = []
    for rule in rules.node_affinity:
        if not rule.strict:
            notes.append(f"non-strict node affinity {rule.name!r} left out (no equivalent)")
            continue
        top = sorted(rule.top_nodes(usable))
        for guest in rule.guests:
            pins[guest] = top
    return pins, notes


def solver_spec(cluster: Cluster, *, balanciness: int = DEFAULT_BALANCINESS) -> dict[str, Any]:
    """``cluster`` as plain data for ``proxlb_solver.models.Cluster.model_validate``.

    Returns a dict with the model's fields plus ``"notes"`` (a list of strings: what could not be
    expressed), which :func:`to_solver_cluster` strips.
    """
    settings = cluster.settings
    notes: list[str] = []
    if settings.memory_overcommit != 1.0:
        notes.append(f"memory overcommit {settings.memory_overcommit:g} ignored (solver: none)")
    if settings.mode == "dynamic":
        notes.append("dynamic mode: the solver still balances configured memory")
    nodes = []
    for node in cluster.nodes:
        nodes.append(
            {
                "name": node.name,
                "cpu_total": math.floor(node.cpu),
                "memory_total": int(node.memory),
                "storage_free": {pool: int(size) for pool, size in node.storage.items()},
                "cpu_reserve": math.ceil(cluster.reserve_cpu(node)),
                "memory_reserve": int(cluster.reserve_memory(node)),
                "maintenance": not node.usable,
            }
        )
    known = set(cluster.node_index)
    running = [g for g in cluster.guests if loaded_nodes(g) and g.node in known]
    left_out = len(cluster.guests) - len(running)
    if left_out:
        notes.append(f"{left_out} guests not running (or on unknown nodes) left out")
    running_ids = {g.id for g in running}
    vms = []
    for guest in running:
        disks: dict[str, int] = {}
        for disk in guest.disks:
            if disk.local:
                disks[disk.pool] = disks.get(disk.pool, 0) + int(disk.size)
        vms.append(
            {
                "name": guest.id,
                "node": guest.node,
                "cpu": math.ceil(guest.cpu),
                "memory": int(guest.memory),
                "cpu_usage": float(guest.cpu_load),
                "disks": disks,
                "priority": int(guest.priority),
                "vm_type": guest.kind,
            }
        )
    rules, problems = check_rules(cluster)
    notes.extend(f"rule dropped as opendrs drops it: {p}" for p in problems)
    pins, pin_notes = _pin_nodes(cluster, rules)
    notes.extend(pin_notes)
    affinity = []
    anti_affinity = []
    for rule in rules.guest_affinity:
        members = [g for g in rule.guests if g in running_ids]
        if len(members) < 2:
            continue
        entry = {"name": rule.name, "vms": members, "hard": rule.hard, "origin": "plb"}
        (affinity if rule.positive else anti_affinity).append(entry)
    ignore = sorted(
        g.id
        for g in running
        if g.id in cluster.rules.ignored or movability(g, cluster, "balance") is not None
    )
    return {
        "name": cluster.name,
        "description": f"opendrs benchmark cluster {cluster.name}",
        "balancing": {
            "method": "memory",
            "mode": "assigned",
            "balanciness": int(balanciness),
            "cpu_overcommit": float(settings.cpu_overcommit),
            "max_parallel_migrations": None,
            "max_node_inflow": int(settings.max_node_inflow),
        },
        "nodes": nodes,
        "vms": vms,
        "constraints": {
            "affinity": affinity,
            "anti_affinity": anti_affinity,
            "pin": [
                {"vm": guest, "nodes": nodes_}
                for guest, nodes_ in sorted(pins.items())
                if guest in running_ids
            ],
            "ignore": ignore,
        },
        "expect": {},
        "notes": notes,
    }


def to_solver_cluster(
    cluster: Cluster, *, balanciness: int = DEFAULT_BALANCINESS
) -> tuple[Any, tuple[str, ...]]:
    """``cluster`` as a ``proxlb_solver.models.Cluster`` and the conversion notes.

    Needs proxlb-solver installed.
    """
    from proxlb_solver.models import Cluster as SolverCluster

    spec = solver_spec(cluster, balanciness=balanciness)
    notes = tuple(spec.pop("notes"))
    return SolverCluster.model_validate(spec), notes


def run(
    cluster: Cluster,
    *,
    time_limit_s: float,
    balanciness: int = DEFAULT_BALANCINESS,
    max_retries: int = MAX_RETRIES,
) -> PeerResult:
    """Run ``solve_reachable`` on ``cluster`` and read its placement back."""
    from proxlb_solver.solver import solve_reachable

    model, notes = to_solver_cluster(cluster, balanciness=balanciness)
    silence_peer_logs()  # after the peer's imports: ProxLB's logger sets its level when created
    start = time.perf_counter()
    solution, plan = solve_reachable(
        model, total_time_limit_s=time_limit_s, max_retries=max_retries, quiet=True
    )
    seconds = time.perf_counter() - start
    current = {g.id: g.node for g in cluster.guests}
    placement = {
        vm: node for vm, node in solution.placements.items() if current.get(vm) not in (None, node)
    }
    info: dict[str, object] = {
        "status": solution.stats.status,
        "feasible": solution.feasible,
        "path_feasible": solution.path_feasible,
        "attempts": solution.reachability_attempts,
        "solver_gap": solution.stats.load_gap,
        "solver_migrations": solution.stats.migration_count,
        "steps": len(plan.steps),
        "parking_moves": len(plan.temp_moves),
        "time_limit_s": time_limit_s,
        "balanciness": balanciness,
    }
    return PeerResult(PEER, placement, seconds, info, notes)


__all__ = [
    "DEFAULT_BALANCINESS",
    "ENTRY_MODULE",
    "MAX_RETRIES",
    "PEER",
    "TIME_LIMITS",
    "run",
    "solver_spec",
    "to_solver_cluster",
]
