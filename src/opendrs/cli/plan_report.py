"""The report of a snapshot and its plan (``opendrs report SNAPSHOT``).

Everything comes from the :class:`~opendrs.cli.planning.PlanResult` that ``opendrs plan``
prints — its JSON document for the moves, the reasons, the metrics and the bounds — plus the node
loads of the cluster before and after the plan, and its rules. Nothing is computed a second way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opendrs.cli.planning import PlanResult, rules_document
from opendrs.engine.breaks import rule_breaks
from opendrs.engine.headroom import failover_headroom
from opendrs.engine.policy.failover import recovery_for
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster
from opendrs.model.units import format_bytes
from opendrs.report.charts import Line, bar_chart
from opendrs.report.render import Document
from opendrs.report.text import node_state
from opendrs.report.words import copied_bytes, move_sentences, stop_sentence

__all__ = ["plan_document"]


def plan_document(result: PlanResult, source: str) -> Document:
    """The report of ``result``, the plan for the snapshot read from ``source``."""
    plan = result.as_dict()
    nodes = _nodes(result.cluster, result.placed)
    by_arch = plan["metrics"].get("by_arch", {})
    kept = result.constraints.rules  # the rules checked once, for the plan
    label = result.cluster.guest_label
    data = {
        "source": source,
        "cluster": result.cluster.name,
        "mode": result.cluster.settings.mode,
        "guests": len(result.cluster.guests),
        "strategy": plan["strategy"],
        "ok": result.ok,
        "plan": plan,
        "nodes": nodes,
        "resources": list(RESOURCES),
        "imbalance": _imbalance(plan["metrics"]),
        "imbalance_by_arch": {arch: _imbalance(metrics) for arch, metrics in by_arch.items()},
        "steps": _steps(plan["moves"], plan["proposed"], result),
        "stopped": stop_sentence(result.proposal, label),
        "copied": format_bytes(_copied(result)),
        "labels": {g.id: g.label for g in result.cluster.guests},
        "bounds": _bounds(plan),
        "rules": rules_document(result.cluster.rules),
        "problems": [str(p) for p in result.constraints.problems],
        "breaks_before": [b.describe(label) for b in rule_breaks(result.cluster, kept)],
        "breaks_after": [b.describe(label) for b in rule_breaks(result.placed, kept)],
        "failover": _failover(result.cluster, result.placed),
    }

    def charts() -> dict[str, str]:
        return {r: _load_chart(nodes, r) for r in RESOURCES}

    return Document("plan", f"opendrs plan report: {result.cluster.name}", data, charts)


def _failover(before: Cluster, after: Cluster) -> dict[str, Any] | None:
    """The failover headroom for one node failing, before and after the plan, judged as
    ``failover_recovery: auto`` judges the snapshot (None with fewer than two online nodes)."""
    if sum(1 for n in before.nodes if n.online) < 2:
        return None
    recovery = recovery_for("auto", before)
    return {
        "before": failover_headroom(before, 1, recovery).brief(),
        "after": failover_headroom(after, 1, recovery).brief(),
    }


def _nodes(before: Cluster, after: Cluster) -> list[dict[str, Any]]:
    """Each node's state and its load per resource before and after the plan."""
    loads = (LoadModel.build(before).fractions(), LoadModel.build(after).fractions())
    return [
        {
            "name": node.name,
            "state": node_state(node),
            "arch": node.arch,
            "guests_before": len(before.guests_on(node.name)),
            "guests_after": len(after.guests_on(node.name)),
            "before": {r: float(loads[0][i, k]) for k, r in enumerate(RESOURCES)},
            "after": {r: float(loads[1][i, k]) for k, r in enumerate(RESOURCES)},
        }
        for i, node in enumerate(before.nodes)
    ]


def _load_chart(nodes: Sequence[Mapping[str, Any]], resource: str) -> str:
    names = [n["name"] for n in nodes]
    before = [100.0 * n["before"][resource] for n in nodes]
    after = [100.0 * n["after"][resource] for n in nodes]
    return bar_chart(
        names,
        {"before": before, "after": after},
        title=f"{resource} load per node, before and after the plan",
        ylabel=f"{resource} (% of capacity)",
        lines=[Line(100.0, "capacity")] if max(before + after, default=0.0) > 90.0 else (),
    )


def _imbalance(metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per resource (and combined): spread and CV before and after."""
    before, after = metrics["before"], metrics["after"]
    return [
        {
            "resource": name,
            "spread_before": before[name]["spread"],
            "spread_after": after[name]["spread"],
            "cv_before": before[name]["cv"],
            "cv_after": after[name]["cv"],
        }
        for name in before
    ]


def _copied(result: PlanResult) -> int:
    """What the plan's migrations copy: the memory and local disks of each guest that moves."""
    cluster = result.cluster
    return sum(copied_bytes(cluster.guest(m.guest)) for m in result.proposal.net_moves())


def _steps(
    moves: Sequence[Mapping[str, Any]], proposed: Sequence[Mapping[str, Any]], result: PlanResult
) -> list[dict[str, Any]]:
    """The plan's moves grouped by step, each with its guest's ``label`` and why: the
    proposal's move of that guest to that target (its reason, metric before and after, cost,
    and in ``words`` as ``opendrs plan`` says it), or for a parking move the target it makes
    way for."""
    cluster = result.cluster
    final = {m["guest"]: m["target"] for m in moves}
    said = dict(
        zip(
            ((m.guest, m.target) for m in result.proposal.moves),
            move_sentences(cluster, result.proposal.moves),
            strict=True,
        )
    )
    steps: dict[int, list[dict[str, Any]]] = {}
    for move in moves:
        why = _why(move, proposed, final)
        words = said.get((move["guest"], move["target"]), why["reason"])
        label = cluster.guest_label(move["guest"])
        steps.setdefault(move["step"], []).append({**move, **why, "label": label, "words": words})
    return [{"step": step, "moves": items} for step, items in sorted(steps.items())]


def _why(
    move: Mapping[str, Any], proposed: Sequence[Mapping[str, Any]], final: Mapping[str, str]
) -> dict[str, Any]:
    if move["parking"]:
        return {
            "reason": f"parking: a stop on the way to {final[move['guest']]}, to break a cycle",
            "metric": None,
        }
    mine = [p for p in proposed if p["guest"] == move["guest"]]
    match = next((p for p in mine if p["target"] == move["target"]), mine[-1] if mine else None)
    if match is None:
        return {"reason": "", "metric": None}
    return {
        "reason": match["reason"],
        "metric": match["metric"],
        "metric_before": match["before"],
        "metric_after": match["after"],
        "cost": match["cost"],
    }


def _bounds(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The spread reached (the bounds' target) against the lowest any placement can reach, per
    resource, and the migrations made against the fewest that reach the same spread."""
    bounds = plan["bounds"]
    migrations = plan["migrations"]
    return {
        "resources": [
            {
                "resource": r,
                "reached": bounds["target_spread"][r],
                "bound": bounds["spread"][r],
                "gap": bounds["target_spread"][r] - bounds["spread"][r],
            }
            for r in RESOURCES
        ],
        "migrations": migrations,
        "min_migrations": bounds["migrations"],
        "ratio": migrations / bounds["migrations"] if bounds["migrations"] else None,
        "moved_bytes": bounds["moved_bytes"],
    }
