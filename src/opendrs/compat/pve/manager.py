"""The HA manager's scheduling decisions (``PVE::HA::Manager``).

* :func:`make_usage` — ``recompute_online_node_usage``: the usage plugin for the round, falling
  back to ``basic`` as Proxmox does;
* :func:`select_service_node` — the node a service should be on, for the node preferences
  ``none``, ``best-score`` and ``try-next`` (failback, maintenance fallback, node and resource
  affinity);
* :func:`load_balance` — one triggered round of automatic rebalancing: the candidates
  (``get_resource_migration_candidates``), the best migration and the margin;
* :func:`execute_command` — a manual ``migrate``/``relocate`` (``update_crm_commands``,
  ``queue_resource_motion``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from opendrs.engine.pve_selection import (
    MigrationCandidate,
    NodeStats,
    node_imbalance,
    select_best_migration_bruteforce,
    select_best_migration_topsis,
    stats_with_migration,
)

from .rules.base import CompiledRules
from .rules.node_affinity import get_node_affinity
from .rules.resource_affinity import (
    apply_negative_resource_affinity,
    apply_positive_resource_affinity,
    get_resource_affinity,
    is_allowed_on_node,
)
from .status import ManagerStatus
from .usage import BasicUsage, DynamicUsage, StaticUsage, Usage

__all__ = [
    "PREFERENCES",
    "Preference",
    "execute_command",
    "load_balance",
    "make_usage",
    "select_service_node",
]

PREFERENCES = ("none", "best-score", "try-next")
Preference = Literal["none", "best-score", "try-next"]


def make_usage(status: ManagerStatus) -> tuple[Usage, list[str]]:
    """``recompute_online_node_usage``: the usage plugin for the scheduler mode.

    Like Proxmox, a static/dynamic init failure (a node without cpu or memory
    capacity) falls back to ``basic`` for the round; the warning is returned.
    """
    online = status.online_nodes
    warnings: list[str] = []
    if status.mode in ("static", "dynamic"):
        bad = [n for n in online if status.nodes[n].maxcpu <= 0 or status.nodes[n].maxmem <= 0]
        if bad:
            warnings.append(
                f"fallback to 'basic' scheduler mode, init for '{status.mode}' failed - "
                f"node '{bad[0]}' has no cpu or memory capacity"
            )
        elif status.mode == "static":
            return StaticUsage(status, online), warnings
        else:
            return DynamicUsage(status, online), warnings
    return BasicUsage(status, online), warnings


def select_service_node(
    compiled: CompiledRules,
    usage: Usage,
    status: ManagerStatus,
    sid: str,
    preference: Preference = "none",
    *,
    failed_nodes: Sequence[str] = (),
    maintenance_fallback: str | None = None,
) -> tuple[str | None, dict[str, float] | None]:
    """``Manager.pm select_service_node``: the node the service should be on.

    Returns the node (or None when no node is possible) and the node scores if
    they had to be computed (lower is better).
    """
    svc = status.services[sid]
    current = svc.node
    online = usage.online
    allowed, pri = get_node_affinity(compiled, sid, online)
    if not pri:
        return None, None
    together, separate = get_resource_affinity(compiled, sid, status, online)

    # stay on current node if possible (avoids random migrations)
    if (
        preference == "none"
        and not svc.failback
        and current in allowed
        and is_allowed_on_node(together, separate, current)
    ):
        return current, None

    if preference == "try-next":
        pri -= set(failed_nodes)

    pri = apply_negative_resource_affinity(separate, pri)
    pri = apply_positive_resource_affinity(together, pri)

    if maintenance_fallback is not None and maintenance_fallback in pri:
        return maintenance_fallback, None

    if preference == "none" and current in pri:
        return current, None

    scores = usage.score_nodes_to_start_service(sid)
    nodes = sorted(pri, key=lambda node: (scores.get(node, 0.0), node))
    if not nodes:
        return None, scores
    found = nodes.index(current) if current in nodes else None
    if preference == "try-next" and found is not None and found < len(nodes) - 1:
        return nodes[found + 1], scores
    return nodes[0], scores


def _resource_migration_candidates(
    compiled: CompiledRules, usage: Usage, status: ManagerStatus
) -> list[MigrationCandidate]:
    """The auto-rebalance candidates (``get_active_stationary_resource_bundles`` and
    ``get_resource_migration_candidates``): bundles of started positive partners, with targets.

    A bundle is keyed by its alphabetically first started member and skipped
    while a partner moves or its started members are split over several nodes.
    Targets: the top-priority node-affinity nodes, minus the nodes of negative
    partners, minus the current node. Only HA services in state ``started`` move.
    """
    online = usage.online
    started = {sid for sid in status.ha_sids() if status.services[sid].state == "started"}
    candidates: list[MigrationCandidate] = []
    for sid in sorted(started):
        partners = compiled.positive.get(sid, frozenset())
        members = sorted({sid} | {p for p in partners if p in started})
        if members[0] != sid:
            continue
        if any(
            status.services[p].state in ("migrate", "relocate")
            for p in partners
            if p in status.services
        ):
            continue
        source = status.services[sid].node
        if any(status.services[m].node != source for m in members):
            continue
        if source not in usage.online_set:
            continue
        _, preferred = get_node_affinity(compiled, sid, online)
        separate: set[str] = set()
        for member in members:
            separate |= get_resource_affinity(compiled, member, status, online)[1]
        cpu, mem = 0.0, 0
        for member in members:
            member_cpu, member_mem = usage.service_move_stats(member)
            cpu, mem = cpu + member_cpu, mem + member_mem
        for target in sorted(apply_negative_resource_affinity(separate, preferred) - {source}):
            candidates.append(MigrationCandidate(sid, source, target, cpu, mem, tuple(members)))
    return candidates


def load_balance(
    compiled: CompiledRules,
    usage: Usage,
    status: ManagerStatus,
    *,
    method: Literal["bruteforce", "topsis"] = "bruteforce",
    threshold: float = 0.3,
    margin: float = 0.1,
) -> dict[str, Any]:
    """``Manager.pm load_balance`` for one triggered round (the hold counter has expired).

    Returns an answer dict with ``migration`` (``{"sid", "source", "target"}`` or
    None), the ``imbalance`` before/after (raw CV), the bundle ``comoves`` and a
    ``reason``.
    """
    answer: dict[str, Any] = {"migration": None}
    held = _no_rebalance_now(usage, status)
    if held:
        answer["reason"] = held
        return answer
    stats = usage.imbalance_stats()
    before = node_imbalance(stats)
    answer["imbalance"] = {
        "before": before,
        "before_normalized": node_imbalance(stats, normalized=True),
    }
    if before <= threshold:
        answer["reason"] = f"imbalance {before:.2f} is not above the threshold {threshold}"
        return answer
    candidates = _resource_migration_candidates(compiled, usage, status)
    nodes = [(n, s) for n, s in zip(usage.online, stats, strict=True)]
    picked = _best_migration(nodes, candidates, method)
    if picked is None:
        answer["reason"] = "no migration candidate"
        return answer
    candidate, after = picked
    answer["imbalance"]["after"] = after
    answer["imbalance"]["after_normalized"] = node_imbalance(
        stats_with_migration(nodes, candidate), normalized=True
    )
    improvement = (before - after) / before
    if improvement < margin:
        answer["reason"] = (
            f"best move {candidate.sid} to {candidate.target} improves the imbalance by "
            f"{improvement:.3f}, less than the margin {margin}"
        )
        return answer
    answer["migration"] = {
        "sid": candidate.sid,
        "source": candidate.source,
        "target": candidate.target,
    }
    answer["comoves"] = [m for m in candidate.members if m != candidate.sid]
    answer["reason"] = (
        f"auto rebalance - {_task(candidate.sid)} {candidate.sid} to {candidate.target} "
        f"(expected change for imbalance from {before:.2f} to {after:.2f})"
    )
    return answer


def _best_migration(
    nodes: Sequence[tuple[str, NodeStats]],
    candidates: Sequence[MigrationCandidate],
    method: Literal["bruteforce", "topsis"],
) -> tuple[MigrationCandidate, float] | None:
    """The candidate ``method`` picks and the imbalance after it (truncated for brute force),
    or None without candidates."""
    if method == "topsis":
        topsis_pick = select_best_migration_topsis(nodes, candidates)
        return None if topsis_pick is None else (topsis_pick[0], topsis_pick[1])
    return select_best_migration_bruteforce(nodes, candidates)


def _no_rebalance_now(usage: Usage, status: ManagerStatus) -> str | None:
    """Why the manager does not rebalance in this round at all, or None: the basic mode, or a
    service still moving or with a move queued."""
    if usage.mode == "basic":
        return "the basic scheduler mode never rebalances"
    moving = sorted(sid for sid, svc in status.services.items() if svc.motion)
    if moving:
        what = "is still moving" if status.services[moving[0]].cmd is None else "has a move queued"
        return f"service '{moving[0]}' {what}"
    return None


def _task(sid: str) -> str:
    """How the manager moves a service: containers relocate, everything else migrates."""
    return "relocate" if sid.startswith("ct:") else "migrate"


def execute_command(
    compiled: CompiledRules,
    status: ManagerStatus,
    sid: str,
    task: Literal["migrate", "relocate"],
    target: str,
) -> dict[str, Any]:
    """``update_crm_commands`` + ``queue_resource_motion`` for a manual migrate/relocate.

    Refused when the target is not online, when the service is already there, or
    when a negative partner stands on the target and is not moving elsewhere (``Manager.pm``
    ``queue_resource_motion``: a partner only moving *to* the target does not refuse it).
    Positive partners not already on (or moving to) the target are queued along (``comoves``).
    """
    cmd = f"{task} {sid} {target}"
    svc = status.services[sid]
    node = status.nodes.get(target)
    if node is None or not node.online:
        return {
            "accepted": False,
            "comoves": [],
            "reason": f"crm command error - node not online: {cmd}",
        }
    if svc.node == target:
        return {
            "accepted": False,
            "comoves": [],
            "reason": f"ignore crm command - service already on target node: {cmd}",
        }
    for csid in sorted(compiled.negative.get(sid, ())):
        other = status.services.get(csid)
        if other is None:
            continue
        if other.node == target and other.target in (None, target):
            return {
                "accepted": False,
                "comoves": [],
                "reason": (
                    f"crm command '{cmd}' error - service '{csid}' on node '{target}' in"
                    f" negative affinity with service '{sid}'"
                ),
            }
    comoves = []
    for csid in sorted(compiled.positive.get(sid, ())):
        other = status.services.get(csid)
        if other is None or other.node == target or other.target == target:
            continue
        comoves.append(csid)
    return {"accepted": True, "comoves": comoves, "reason": f"got crm command: {cmd}"}
